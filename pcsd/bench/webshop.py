"""WebShop rows of ``pcsd.bench env``: the native engine per step by action kind (replaying the
recorded episodes of the original, whose own per-step times on this kind of machine are in the
recording) and a scale row on a synthetic catalogue (index build time, memory, search latency)."""

from __future__ import annotations

import gzip
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("search", "click_product", "click_option", "click_nav", "click_subpage", "click_buy", "invalid")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_kind_rows(root: Path, repeats: int) -> list[dict[str, Any]]:
    """Replays every upstream episode of ``traces_public.jsonl.gz`` ``repeats`` times; per action kind:
    the native median µs per ``env.step`` (through the Python API) next to the original's median ms
    recorded for the same steps."""
    from pcsd.envs.webshop import WebShop, WebShopStepError

    with gzip.open(root / "traces_public.jsonl.gz", "rt", encoding="utf-8") as f:
        eps = [json.loads(line) for line in f]
    eps = [e for e in eps if e["env_config"] != "verl"]
    cfg = {"upstream_synth": dict(goals="synthetic"), "upstream_human": dict(goals="human"),
           "upstream_attrs": dict(goals="synthetic", show_attrs=True)}
    shops = {c: WebShop.load(root / "data", seed=0, **kw) for c, kw in cfg.items()}
    native: dict[str, list[float]] = {k: [] for k in KINDS}
    orig: dict[str, list[float]] = {k: [] for k in KINDS}
    for ep in eps:
        for st in ep["steps"]:
            if "exception" not in st and st["kind"] in orig:
                orig[st["kind"]].append(st["time_ms"])
    resets: list[float] = []
    for _ in range(repeats):
        for ep in eps:
            env = shops[ep["env_config"]].env()
            t0 = time.perf_counter_ns()
            env.reset(ep["goal_index"])
            resets.append((time.perf_counter_ns() - t0) / 1e3)
            for st in ep["steps"]:
                t0 = time.perf_counter_ns()
                try:
                    env.step(st["action"])
                except WebShopStepError:
                    continue
                native[st["kind"]].append((time.perf_counter_ns() - t0) / 1e3)
    rows = []
    for k in KINDS:
        if not native[k]:
            continue
        us = statistics.median(native[k])
        ms = statistics.median(orig[k])
        rows.append(dict(engine="webshop native (1 env, Python API)", action=k, steps=len(native[k]) // repeats,
                         native_us=us, original_ms=ms, speedup=ms * 1e3 / us))
    rows.append(dict(engine="webshop native (1 env, Python API)", action="reset", steps=len(resets) // repeats,
                     native_us=statistics.median(resets), original_ms=2.6, speedup=2.6e3 / statistics.median(resets)))
    return rows


def _synthetic_catalogue(root: Path, out: Path, n: int, seed: int = 0) -> None:
    """``n`` products: the 1k set's products over and over, each with a new ASIN and a few title
    words swapped in from other products (so documents differ), with attributes and instructions."""
    rng = random.Random(seed)
    base = json.loads((root / "data" / "items_shuffle_1000.json").read_text())
    attrs = json.loads((root / "data" / "items_ins_v2_1000.json").read_text())
    vocab = [w for p in base for w in p["name"].split()[:6]]
    items, out_attrs = [], {}
    for i in range(n):
        p = dict(base[i % len(base)])
        asin = f"S{i:09d}"
        extra = " ".join(rng.choice(vocab) for _ in range(3))
        p["name"] = f"{p['name']} {extra}"
        a = attrs.get(p["asin"], {"attributes": []})
        p["asin"] = asin
        items.append(p)
        out_attrs[asin] = a
    out.mkdir(parents=True, exist_ok=True)
    (out / "items_shuffle_1000.json").write_text(json.dumps(items))
    (out / "items_ins_v2_1000.json").write_text(json.dumps(out_attrs))
    (out / "items_human_ins.json").write_text("{}")


def scale_row(root: Path, n: int, queries: int = 200) -> dict[str, Any]:
    """Loads a synthetic ``n``-product catalogue: load + index time, resident memory added, search
    latency (median of ``queries`` goal instructions of the 1k set)."""
    from pcsd.envs.webshop import WebShop

    small = WebShop.load(root / "data")
    qs = [small.goal(i)["instruction_text"] for i in range(0, small.num_goals, max(1, small.num_goals // queries))]
    with tempfile.TemporaryDirectory(prefix="pcsd-webshop-scale-") as tmp:
        _synthetic_catalogue(root, Path(tmp), n)
        rss0 = _rss_bytes()
        t0 = time.perf_counter()
        shop = WebShop.load(tmp, nouns=root / "facts" / "spacy_nouns_1k.json")
        load_s = time.perf_counter() - t0
        rss = _rss_bytes() - rss0
    lat = []
    for q in qs:
        t1 = time.perf_counter_ns()
        shop.search(q)
        lat.append((time.perf_counter_ns() - t1) / 1e3)
    return dict(engine="webshop native, synthetic catalogue", products=shop.num_products, goals=shop.num_goals,
                load_and_index_s=load_s, rss_added_mib=rss / 2**20, search_median_us=statistics.median(lat),
                search_p90_us=sorted(lat)[int(0.9 * (len(lat) - 1))], original_lucene_query_ms=3.4)
