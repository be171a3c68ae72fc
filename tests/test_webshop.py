"""The native WebShop against the original engine's recordings and tables ($WEBSHOP_DATA).

* every step of ``traces_public.jsonl.gz`` (330 episodes, 3,364 steps on princeton-nlp/WebShop and
  its verl-agent copy) replayed through the Python contract: observation, available actions,
  reward (value and int/float), done and URL equal; steps where the original raised raise;
* the search oracle (hits and order of 1,961 queries) and the goal lists of the standard seeds;
* bad input: one test per class.

The fuzzy-match (thefuzz/difflib) and reward oracles, the analyzer's term vectors and CPython
``random`` are checked in the Rust tests (``cargo test webshop``).
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import pytest

from pcsd.envs.webshop import WebShop, WebShopEnv

CONFIGS = {
    "upstream_synth": dict(goals="synthetic", variant="upstream", show_attrs=False),
    "upstream_human": dict(goals="human", variant="upstream", show_attrs=False),
    "upstream_attrs": dict(goals="synthetic", variant="upstream", show_attrs=True),
    "verl": dict(goals="synthetic", variant="verl", show_attrs=False),
}


def _lines(path: Path) -> list:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@lru_cache(maxsize=None)
def _shop(root: str, config: str, seed: int) -> WebShop:
    return WebShop.load(Path(root) / "data", seed=seed, **CONFIGS[config])


def _error_class():
    from pcsd.envs.webshop import WebShopStepError

    return WebShopStepError


def test_replay_every_public_trace_step(webshop_data: Path) -> None:
    """0 differences in 3,364 steps (obs, available actions, reward, done, url)."""
    eps = _lines(webshop_data / "traces_public.jsonl.gz")
    err = _error_class()
    diffs: list[str] = []
    n_steps = n_raised = 0
    for ep in eps:
        shop = _shop(str(webshop_data), ep["env_config"], ep["env_seed"])
        env = shop.env()
        eid = f"{ep['config']}#{ep['episode_id']}"
        obs, info = env.reset(ep["goal_index"])
        want = ep["reset"]
        if obs != want["obs"] or info["available_actions"] != want["available_actions"]:
            diffs.append(f"{eid} reset")
        if info["goal"]["instruction_text"] != ep["goal"]["instruction_text"]:
            diffs.append(f"{eid} goal")
        for st in ep["steps"]:
            n_steps += 1
            where = f"{eid} step {st['i']} {st['action']!r}"
            if "exception" in st:
                n_raised += 1
                with pytest.raises(err) as exc:
                    env.step(st["action"])
                if not st["exception"].startswith(str(exc.value).split(":")[0]):
                    diffs.append(f"{where}: raised {exc.value} for {st['exception']}")
                continue
            obs, reward, done, info = env.step(st["action"])
            if obs != st["obs"]:
                diffs.append(f"{where}: obs")
            if reward != st["reward"] or type(reward) is not type(st["reward"]):
                diffs.append(f"{where}: reward {reward!r} != {st['reward']!r}")
            if done != st["done"]:
                diffs.append(f"{where}: done")
            if info["available_actions"] != st["available_actions"]:
                diffs.append(f"{where}: available actions")
            if ep["env_config"] != "verl" and info["url"] != st["url"]:
                diffs.append(f"{where}: url")
    assert n_steps == 3364 and n_raised == 6
    assert not diffs, f"{len(diffs)} differences in {n_steps} steps:\n" + "\n".join(diffs[:30])


def test_search_oracle_hits_and_order(webshop_data: Path) -> None:
    shop = _shop(str(webshop_data), "upstream_synth", 0)
    recs = _lines(webshop_data / "facts" / "search_oracle.jsonl.gz")
    err = _error_class()
    bad = []
    for r in recs:
        q = r["query"]
        if "hits" in r:
            got = shop.search(q)
            if got != [h[0] for h in r["hits"]]:
                bad.append(q[:80])
        else:
            with pytest.raises(err, match="TooManyClauses"):
                shop.search(q)
    assert len(recs) == 1961
    assert not bad, f"{len(bad)} of {len(recs)} queries differ: {bad[:10]}"


@pytest.mark.parametrize(
    "file,config,seed",
    [
        ("goals_upstream_synth_seed0.json.gz", "upstream_synth", 0),
        ("goals_upstream_human_seed0.json.gz", "upstream_human", 0),
        ("goals_verl_seed0.json.gz", "verl", 0),
        ("goals_verl_seed1000.json.gz", "verl", 1000),
    ],
)
def test_goal_lists_equal(webshop_data: Path, file: str, config: str, seed: int) -> None:
    want = _lines(webshop_data / "facts" / file)[0]
    shop = _shop(str(webshop_data), config, seed)
    assert shop.num_goals == want["n_goals"] == len(want["goals"])
    keys = [
        "asin",
        "instruction_text",
        "attributes",
        "goal_options",
        "price_upper",
        "weight",
        "name",
        "query",
        "category",
        "product_category",
    ]
    for i, w in enumerate(want["goals"]):
        g = shop.goal(i)
        assert {k: g[k] for k in keys} == {k: w[k] for k in keys}, i
        assert type(g["price_upper"]) is type(w["price_upper"])
    for asin, price in want["product_prices"].items():
        assert shop.product_price(asin) == price


def test_one_shop_serves_independent_envs(webshop_data: Path) -> None:
    shop = _shop(str(webshop_data), "upstream_synth", 0)
    a, b = shop.env(), shop.env()
    oa, _ = a.reset(3)
    ob, _ = b.reset(4)
    a.step("search[shoes]")
    assert b.observe()[0] == ob  # b did not move
    assert a.observe()[0] != oa
    assert isinstance(a, WebShopEnv) and a.goal_index == 3 and b.goal_index == 4


def test_noop_and_done_semantics(webshop_data: Path) -> None:
    shop = _shop(str(webshop_data), "upstream_synth", 0)
    env = shop.env()
    obs0, info = env.reset(0)
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    for a in ["click[search]", "Click[x]", "search[]", "", "search"]:
        obs, r, done, _ = env.step(a)
        assert (obs, r, done) == (obs0, 0, False) and type(r) is int
    goal = info["goal"]
    obs, r, done, info = env.step(f"search[{goal['instruction_text']}]")
    assert r == 0.0 and type(r) is float and not done
    asin = goal["asin"].lower()
    if asin in info["available_actions"]["clickables"]:
        env.step(f"click[{asin}]")
        for v in goal["goal_options"].values():
            env.step(f"click[{v}]")
        obs, r, done, info = env.step("click[buy now]")
        assert done and obs.startswith("Thank you for shopping with us!") and 0.0 <= r <= 1.0
        assert obs.split(" [SEP] ")[-3] == repr(r)  # the done page shows repr(reward)
        assert info["available_actions"] == {"has_search_bar": False, "clickables": []}


def _open_item(env: WebShopEnv, products: list, asin: str) -> tuple[str, dict]:
    """search[<q> query] (the products of that query in file order, 10 a page), next pages, the product."""
    query = next(p["query"] for p in products if p["asin"] == asin).lower().strip()
    same = [p["asin"] for p in products if p["query"].lower().strip() == query]
    env.step(f"search[<q> {query}]")
    for _ in range(same.index(asin) // 10):
        env.step("click[next >]")
    obs, r, done, info = env.step(f"click[{asin.lower()}]")
    assert (r, done) == (0.0, False) and f"/item_page/{env.goal_index}/{asin}/" in info["url"]
    return obs, info


def test_option_groups_with_a_repeated_value_or_none(webshop_data: Path) -> None:
    """Products off the public traces, checked step for step on the original: B08G14B779 lists the size
    '26 inch x 10 inch' twice (data: '26 inch x 10 inch', '26 Inch x 10 Inch'), B09DG92LJL has a null
    option group. The item page shows every radio of a group; the clickables are a dict keyed by value
    (one slot); a null group is skipped by the loader; the goals' cartesian product keeps the repeat;
    a colour prefix of the goal's colour still matches (thefuzz sees str() of the goal's (name, value))."""
    products = json.loads((webshop_data / "data" / "items_shuffle_1000.json").read_text())
    shop = _shop(str(webshop_data), "upstream_synth", 0)
    goals = {i: shop.goal(i) for i in range(shop.num_goals)}
    mine = [g for g in goals.values() if g["asin"] == "B08G14B779"]
    assert len(mine) == 8  # 4 colours x 2 (equal) sizes
    texts = sorted(g["instruction_text"].split(", and price")[0] for g in mine)
    assert texts[0::2] == texts[1::2]
    gi = next(
        i
        for i, g in goals.items()
        if g["asin"] == "B08G14B779" and g["goal_options"] == {"color": "pink purple", "size": "26 inch x 10 inch"}
    )
    env = shop.env()
    env.reset(gi)
    obs, info = _open_item(env, products, "B08G14B779")
    sizes = ["26 inch x 10 inch"] * 2
    want_opts = ["color", "pink", "pink light blue", "pink purple", "pink rose", "size", *sizes]
    assert obs.split(" [SEP] ")[4:12] == want_opts
    assert info["available_actions"]["clickables"] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
        "pink",
        "pink light blue",
        "pink purple",
        "pink rose",
        "26 inch x 10 inch",
    ]
    env.step("click[26 inch x 10 inch]")
    env.step("click[pink]")
    obs, r, done, info = env.step("click[buy now]")
    assert done and r == 1.0 and info["reward_info"]["r_option"] == 1.0
    assert '[SEP] options [SEP] {"color": "pink", "size": "26 inch x 10 inch"} [SEP]' in obs
    env.reset(gi)
    obs, info = _open_item(env, products, "B09DG92LJL")  # {'Color': None}
    assert obs.split(" [SEP] ")[3:5] == [
        "< Prev",
        next(p["name"] for p in products if p["asin"] == "B09DG92LJL").strip(),
    ]
    assert info["available_actions"]["clickables"] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
    ]


# ----------------------------------------------------------------------------- bad input, one class each
def test_bad_data_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_dir"):
        WebShop.load(tmp_path / "nope")
    with pytest.raises(ValueError, match="data_dir"):
        WebShop.load(tmp_path)
    with pytest.raises(TypeError, match="data_dir"):
        WebShop.load(123)  # type: ignore[arg-type]


def test_bad_load_arguments(webshop_data: Path) -> None:
    d = webshop_data / "data"
    with pytest.raises(ValueError, match="goals"):
        WebShop.load(d, goals="robot")
    with pytest.raises(ValueError, match="variant"):
        WebShop.load(d, variant="gym")
    with pytest.raises(TypeError, match="seed"):
        WebShop.load(d, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="show_attrs"):
        WebShop.load(d, show_attrs="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_products"):
        WebShop.load(d, num_products=0)
    with pytest.raises(FileNotFoundError, match="nouns"):
        WebShop.load(d, nouns=d / "missing.json")


def test_bad_goal_index(webshop_data: Path) -> None:
    env = _shop(str(webshop_data), "upstream_human", 0).env()
    for bad in (-1, 13, 10**30):
        with pytest.raises(ValueError, match="goal_index"):
            env.reset(bad)
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="goal_index"):
            env.reset(bad)  # type: ignore[arg-type]


def test_bad_action(webshop_data: Path) -> None:
    env = _shop(str(webshop_data), "upstream_synth", 0).env()
    env.reset(0)
    with pytest.raises(TypeError, match="action"):
        env.step(None)  # type: ignore[arg-type]
    # a lone surrogate has no UTF-8 form: refused and not sent, as the pool reports it as that env's error
    with pytest.raises(ValueError, match="action is not valid text.*not sent to the env"):
        env.step("click[\ud800]")
    assert env.steps == 0
    from pcsd.envs.pool import EnvPool

    shop = _shop(str(webshop_data), "upstream_synth", 0)
    pool = EnvPool("webshop", 1, shop=shop, goals=[0])
    pool.reset()
    err = pool.step(["click[\ud800]"]).error[0]
    assert "actions[0] is not valid text" in err and "not sent to the env" in err
    pool.close()


def test_original_exceptions_are_step_errors(webshop_data: Path) -> None:
    env = _shop(str(webshop_data), "upstream_synth", 0).env()
    env.reset(0)
    err = _error_class()
    with pytest.raises(err, match="^TypeError"):
        env.step("search[<a> shoes]")
    with pytest.raises(err, match="^IndexError"):
        env.step("search[<c>]")
    with pytest.raises(err, match="TooManyClauses"):
        env.step("search[" + " ".join(f"w{i}x" for i in range(1100)) + "]")
    # the category / query filters are no errors
    obs, r, done, info = env.step("search[<c> beauty]")
    assert "Page 1 (Total results: " in obs and (r, done) == (0.0, False)


# ----------------------------------------------------------------------------- the pool
def test_pool_matches_a_sequential_loop_of_single_envs(webshop_data: Path) -> None:
    """EnvPool("webshop") against single envs stepped one after the other, under the pool's rules
    (step limit 15 -> truncated, a raised step -> that env's error, a finished env refuses steps
    until reset), on random action streams (expert moves, clickables, no-ops, raising searches)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from pcsd.envs.pool import EnvPool

    shop = _shop(str(webshop_data), "upstream_synth", 0)
    err = _error_class()

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        groups=st.lists(st.integers(0, shop.num_goals - 1), min_size=1, max_size=3),
        group_size=st.integers(1, 3),
        seed=st.integers(0, 2**32 - 1),
        asynchronous=st.booleans(),
    )
    def check(groups: list[int], group_size: int, seed: int, asynchronous: bool) -> None:
        import random

        rng = random.Random(seed)
        n = len(groups) * group_size
        pool = EnvPool("webshop", n, group_size=group_size, shop=shop, goals=groups, max_steps=15, num_threads=2)
        refs = [shop.env() for _ in range(n)]
        first = pool.reset()
        state = []
        for i, ref in enumerate(refs):
            obs, info = ref.reset(groups[i // group_size])
            assert first.obs[i] == obs and first.admissible[i] == info["available_actions"]["clickables"]
            assert bool(first.has_search_bar[i]) is info["available_actions"]["has_search_bar"]
            state.append(dict(steps=0, done=False, clk=info["available_actions"]["clickables"]))
        for _ in range(18):
            acts = []
            for i, ref in enumerate(refs):
                r = rng.random()
                if r < 0.5:
                    acts.append(ref.expert_action() or "click[buy now]")
                elif r < 0.8 and state[i]["clk"]:
                    acts.append(f"click[{rng.choice(state[i]['clk'])}]")
                elif r < 0.9:
                    acts.append(rng.choice(["search[<a> x]", "click[nope]", "search[]", "search[red shoes]"]))
                else:
                    acts.append("search[<c>]")
            ids = list(range(n))
            if asynchronous:
                pool.send(acts, ids)
                got = pool.recv(n)
                order = np.argsort(got.env_id)
                rows = {int(got.env_id[k]): k for k in order}
            else:
                got = pool.step(acts, ids)
                rows = {i: i for i in ids}
            for i, ref in enumerate(refs):
                k = rows[i]
                s = state[i]
                if s["done"]:
                    assert "is done" in got.error[k] and got.done[k]
                    continue
                s["steps"] += 1
                try:
                    obs, reward, done, info = ref.step(acts[i])
                except err as e:
                    assert str(e) in got.error[k] and got.done[k]
                    s["done"] = True
                    continue
                truncated = not done and s["steps"] >= 15
                assert got.error[k] == "" and got.obs[k] == obs
                assert got.admissible[k] == info["available_actions"]["clickables"]
                assert bool(got.has_search_bar[k]) is info["available_actions"]["has_search_bar"]
                assert got.score[k] == float(reward) and got.reward[k] == float(reward)
                assert bool(got.done[k]) is (done or truncated) and bool(got.truncated[k]) is truncated
                assert bool(got.won[k]) is (done and reward == 1.0)
                assert got.step_count[k] == s["steps"] and got.task_type[k] == "webshop"
                s["done"] = done or truncated
                s["clk"] = info["available_actions"]["clickables"]
        pool.close()

    import numpy as np

    check()


def test_pool_bad_webshop_arguments(webshop_data: Path) -> None:
    from pcsd.envs.pool import EnvPool

    shop = _shop(str(webshop_data), "upstream_human", 0)
    with pytest.raises(ValueError, match="shop"):
        EnvPool("webshop", 2, goals=[0, 1])
    with pytest.raises(ValueError, match="goals: env kind 'webshop' needs"):
        EnvPool("webshop", 2, shop=shop)
    with pytest.raises(ValueError, match=r"goals: expected one goal index per group"):
        EnvPool("webshop", 4, group_size=2, shop=shop, goals=[0])
    with pytest.raises(ValueError, match=r"goals\[1\]: expected a goal index in \[0, 13\)"):
        EnvPool("webshop", 2, shop=shop, goals=[0, 13])
    with pytest.raises(ValueError, match="games"):
        EnvPool("webshop", 1, shop=shop, goals=[0], games=["x"])


def test_bench_env_webshop_rows(webshop_data: Path, tmp_path: Path) -> None:
    from pcsd.bench.cli import main as bench_main

    bench_main(
        [
            "env",
            "--tiny",
            "--no-real",
            "--sizes",
            "16",
            "--threads",
            "1",
            "--webshop",
            str(webshop_data),
            "--webshop-products",
            "3000",
            "--out",
            str(tmp_path),
        ]
    )
    data = json.loads((tmp_path / "env_webshop.json").read_text())
    kinds = {r["action"]: r for r in data["rows"] if "action" in r}
    assert set(kinds) >= {
        "search",
        "click_product",
        "click_option",
        "click_nav",
        "click_subpage",
        "click_buy",
        "invalid",
        "reset",
    }
    assert all(r["native_us"] > 0 and r["original_ms"] > 0 for r in kinds.values())
    scale = [r for r in data["rows"] if "products" in r]
    assert scale and scale[0]["products"] == 3000 and scale[0]["search_median_us"] > 0


def test_num_products_random_reset_and_expert(webshop_data: Path) -> None:
    from pcsd.envs.webshop import run_expert

    shop = WebShop.load(webshop_data, num_products=100)  # the webshop root is accepted too
    assert shop.num_products == 100 and 0 < shop.num_goals < 6910
    assert all(shop.goal(i)["asin"] in {shop.goal(j)["asin"] for j in range(shop.num_goals)} for i in range(3))
    env = shop.env()
    obs, info = env.reset()  # no index: a weight-sampled goal, as the original's session-less reset
    assert 0 <= info["goal_index"] < shop.num_goals and info["goal"]["instruction_text"] in obs
    full = _shop(str(webshop_data), "upstream_synth", 0)
    wins = 0
    for g in range(0, full.num_goals, 691):
        actions, reward, done = run_expert(full.env(), g)
        assert done and len(actions) <= 15
        wins += reward == 1.0
    assert wins >= 7  # of 10


def test_product_ids_are_the_catalogues(webshop_data: Path) -> None:
    shop = WebShop.load(webshop_data / "data", goals="synthetic", seed=0)
    ids = shop.product_ids
    assert len(ids) == shop.num_products == len(set(ids)) == 1000
    assert all(len(a) == 10 and a.isalnum() and a == a.upper() for a in ids)
    env = shop.env()
    env.reset(0)
    _, _, _, info = env.step("search[shoes]")
    shown = [c for c in info["available_actions"]["clickables"] if c.startswith("b0")]
    assert shown and set(shown) <= {a.lower() for a in ids}


# ----------------------------------------------------------------------------- scale: pruned search, index cache
def _queries(webshop_data: Path, n: int = 1000) -> list[str]:
    """``n`` queries: goal instructions of the 1k set (with and without the price clause), product
    titles and short keyword queries."""
    small = _shop(str(webshop_data), "upstream_synth", 0)
    goals = [small.goal(i)["instruction_text"] for i in range(0, small.num_goals, 13)]
    titles = json.loads((webshop_data / "data" / "items_shuffle_1000.json").read_text())
    qs = goals[: n // 2] + [g.split(", and price")[0] for g in goals[: n // 4]]
    qs += [p["name"] for p in titles[: n // 8]] + [
        " ".join(p["name"].split()[:2]) for p in titles[: n - len(qs) - n // 8]
    ]
    return (qs + [p["name"] for p in titles])[:n]


def test_pruned_search_equals_the_exhaustive_search_on_the_1k_set(webshop_data: Path) -> None:
    """1,000 queries: the pruned search (what ``search[...]`` runs) lists the exhaustive
    reference's hits in its order (score, then ASIN for ties)."""
    shop = _shop(str(webshop_data), "upstream_synth", 0)
    qs = _queries(webshop_data)
    assert len(qs) == 1000
    differ = [q for q in qs if shop.search(q) != shop.native.search_reference(q.lower())]
    assert not differ, differ[:5]


@pytest.fixture(scope="module", params=[20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def synthetic_shop(request, webshop_data: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A synthetic catalogue built like the real one (products of the 1k set with new ASINs and
    Zipf words: many equal documents, so many ties) and an index cache folder it was loaded into."""
    from pcsd.bench.webshop import synthetic_catalogue

    root = tmp_path_factory.mktemp(f"synthetic-{request.param}")
    synthetic_catalogue(webshop_data, root, request.param)
    return root, root / "cache"


def test_second_load_comes_from_the_cache_and_pruned_search_is_exact(
    synthetic_shop: tuple[Path, Path], webshop_data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first load of a synthetic catalogue builds and writes the index cache; the second maps
    it (the same goals, searches and purchases); on both, the pruned search equals the exhaustive
    one on 1,000 queries, ties included."""
    from pcsd.envs.webshop import run_expert

    root, cache = synthetic_shop
    first = WebShop.load(root, cache=cache)
    assert not first.cache_hit and first.cache_path is not None and Path(first.cache_path).parent == cache
    second = WebShop.load(root, cache=cache)
    assert second.cache_hit and second.cache_path == first.cache_path
    assert not caplog.records
    assert second.num_products == first.num_products and second.num_goals == first.num_goals
    for g in range(0, second.num_goals, second.num_goals // 20):
        assert second.goal(g) == first.goal(g)
        assert run_expert(second.env(), g) == run_expert(first.env(), g)
    qs = _queries(webshop_data)
    for shop in (first, second):
        differ = [q for q in qs if shop.search(q) != shop.native.search_reference(q.lower())]
        assert not differ, differ[:5]
    # copies of one product of the 1k set score alike: ties, listed by ASIN
    hits = second.search(qs[0])
    assert len(hits) == 50 and hits[:10] == sorted(hits[:10])


def _small_catalogue(tmp_path: Path, webshop_data: Path) -> Path:
    from pcsd.bench.webshop import synthetic_catalogue

    return synthetic_catalogue(webshop_data, tmp_path / "shop", 300)


def test_damaged_and_stale_caches_are_rebuilt_with_one_line(
    tmp_path: Path, webshop_data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _small_catalogue(tmp_path, webshop_data)
    cache = tmp_path / "cache"
    path = Path(WebShop.load(root, cache=cache).cache_path or "")
    want = WebShop.load(root, cache=cache).search("red cotton shirt")

    def reload(what: str) -> None:
        caplog.clear()
        shop = WebShop.load(root, cache=cache)
        assert not shop.cache_hit and shop.search("red cotton shirt") == want
        msgs = [r.getMessage() for r in caplog.records]
        assert len(msgs) == 1 and what in msgs[0] and "rebuilding it" in msgs[0] and "\n" not in msgs[0], msgs
        assert caplog.records[0].levelname == "WARNING" and caplog.records[0].name == "pcsd.envs.webshop"
        caplog.clear()
        assert WebShop.load(root, cache=cache).cache_hit and not caplog.records  # written back whole

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    reload("damaged (body checksum mismatch)")
    path.write_bytes(path.read_bytes()[:-4096])
    reload("truncated")
    path.write_text("not a cache")
    reload("foreign")
    attrs = root / "data" / "items_ins_v2.json"
    attrs.write_text(attrs.read_text() + "\n")
    reload("stale (items_ins_v2.json changed: size")


def test_a_named_pipe_at_the_cache_path_does_not_block_the_load(
    tmp_path: Path, webshop_data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Opening a FIFO for reading waits for a writer: the load blocked for ever. It is passed over
    with one line and the cache written in its place. (A writer thread opens the pipe after 20 s,
    so that the old behaviour fails this test instead of hanging the suite.)"""
    import os
    import threading
    import time

    root = _small_catalogue(tmp_path, webshop_data)
    cache = tmp_path / "cache"
    path = Path(WebShop.load(root, cache=cache).cache_path or "")
    path.unlink()
    os.mkfifo(path)
    done = threading.Event()

    def release() -> None:  # unblocks a reader stuck in open(); a no-op once the load is done
        if not done.wait(20.0):
            with open(path, "wb"):
                pass

    threading.Thread(target=release, daemon=True).start()
    caplog.clear()
    t0 = time.perf_counter()
    shop = WebShop.load(root, cache=cache)
    done.set()
    assert time.perf_counter() - t0 < 15.0, "the load waited on the pipe"
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "not a regular file but a named pipe" in msgs[0] and "rebuilding it" in msgs[0], msgs
    assert not shop.cache_hit and path.is_file()
    assert WebShop.load(root, cache=cache).cache_hit


def test_num_products_is_part_of_the_cache_key(tmp_path: Path, webshop_data: Path) -> None:
    """A cache made from the first N products is not the whole catalogue's: even under the name the
    whole catalogue's cache would have, the key tells them apart (stale, rebuilt)."""
    root = _small_catalogue(tmp_path, webshop_data)
    cache = tmp_path / "cache"
    whole = WebShop.load(root, cache=cache)
    first = WebShop.load(root, cache=cache, num_products=40)
    assert first.num_products == 40 < whole.num_products and first.cache_path != whole.cache_path
    Path(whole.cache_path or "").write_bytes(Path(first.cache_path or "").read_bytes())
    again = WebShop.load(root, cache=cache)
    assert not again.cache_hit and again.num_products == whole.num_products
    assert WebShop.load(root, cache=cache, num_products=40).cache_hit


def test_a_read_only_data_folder_sends_the_cache_to_the_user_cache(
    webshop_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The shared data folder is read-only: the cache goes to ``$XDG_CACHE_HOME/pcsd/webshop-index``
    with one line, and nothing is written beside the data."""
    monkeypatch.delenv("WEBSHOP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = webshop_data / "data"
    before = sorted(p.name for p in data.iterdir())
    shop = WebShop.load(data, seed=5)
    assert shop.cache_path is not None and Path(shop.cache_path).parent == tmp_path / "pcsd" / "webshop-index"
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "read-only folder" in msgs[0] and shop.cache_path in msgs[0], msgs
    caplog.clear()
    again = WebShop.load(data, seed=6)
    assert again.cache_hit and again.cache_path == shop.cache_path and not caplog.records
    assert sorted(p.name for p in data.iterdir()) == before
    monkeypatch.setenv("WEBSHOP_CACHE", "off")
    off = WebShop.load(data)
    assert off.cache_path is None and not off.cache_hit and not caplog.records


def test_bad_cache_argument(webshop_data: Path) -> None:
    with pytest.raises(TypeError, match="cache must be a folder"):
        WebShop.load(webshop_data, cache=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache: expected a folder"):
        WebShop.load(webshop_data, cache=" ")
