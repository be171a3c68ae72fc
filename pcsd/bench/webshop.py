"""WebShop rows of ``pcsd.bench env``: the native engine per step by action kind (replaying the
recorded episodes of the original, whose own per-step times on this kind of machine are in the
recording) and scale rows on synthetic catalogues built like the real one, up to the full 1.18 M
products (cold and cached load time, resident memory, pruned and exhaustive search latency;
``benchmarks/webshop_catalogue.py``)."""

from __future__ import annotations

import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

KINDS = ("search", "click_product", "click_option", "click_nav", "click_subpage", "click_buy", "invalid")


def per_kind_rows(root: Path, repeats: int) -> list[dict[str, Any]]:
    """Replays every upstream episode of ``traces_public.jsonl.gz`` ``repeats`` times; per action kind:
    the native median µs per ``env.step`` (through the Python API) next to the original's median ms
    recorded for the same steps."""
    from pcsd.envs.webshop import WebShop, WebShopStepError

    with gzip.open(root / "traces_public.jsonl.gz", "rt", encoding="utf-8") as f:
        eps = [json.loads(line) for line in f]
    eps = [e for e in eps if e["env_config"] != "verl"]
    cfg: dict[str, dict[str, Any]] = {
        "upstream_synth": dict(goals="synthetic"),
        "upstream_human": dict(goals="human"),
        "upstream_attrs": dict(goals="synthetic", show_attrs=True),
    }
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
        rows.append(
            dict(
                engine="webshop native (1 env, Python API)",
                action=k,
                steps=len(native[k]) // repeats,
                native_us=us,
                original_ms=ms,
                speedup=ms * 1e3 / us,
            )
        )
    rows.append(
        dict(
            engine="webshop native (1 env, Python API)",
            action="reset",
            steps=len(resets) // repeats,
            native_us=statistics.median(resets),
            original_ms=2.6,
            speedup=2.6e3 / statistics.median(resets),
        )
    )
    return rows


#: products in the full WebShop catalogue (``items_shuffle.json``)
FULL_CATALOGUE = 1_181_436

_CHILD = r"""
import json, statistics, sys, time
def status():
    d = {}
    for line in open('/proc/self/status'):
        k, _, v = line.partition(':')
        if k in ('VmRSS', 'VmHWM', 'RssAnon', 'RssFile'):
            d[k] = int(v.split()[0]) * 1024
    return d
import pcsd.envs.webshop as ws
folder, cache, qs = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
before = status()['VmRSS']
t0 = time.perf_counter()
shop = ws.WebShop.load(folder, cache=cache)
load_s = time.perf_counter() - t0
after = status()
# an untimed pass first: both searches' pages of the index are faulted in, the hits compared
differ = sum(shop.search(q) != shop.native.search_reference(q.lower()) for q in qs)
def lat(f):
    wall, cpu = [], []
    for q in qs:
        c1 = time.thread_time_ns(); t1 = time.perf_counter_ns(); f(q)
        wall.append((time.perf_counter_ns() - t1) / 1e3); cpu.append((time.thread_time_ns() - c1) / 1e3)
    return wall, cpu
pruned, pruned_cpu = lat(shop.search)
exhaustive, exhaustive_cpu = lat(lambda q: shop.native.search_reference(q.lower()))
pct = lambda xs, p: sorted(xs)[round(p * (len(xs) - 1))]
actions, reward, done = ws.run_expert(shop.env(), 0)  # a purchase: the reward reads the noun table
assert done, actions
print(json.dumps(dict(products=shop.num_products, goals=shop.num_goals, load_s=load_s, cache_hit=shop.cache_hit,
                      cache_path=shop.cache_path, rss_mib=after['VmRSS'] / 2**20,
                      rss_anon_mib=after['RssAnon'] / 2**20, rss_file_mib=after['RssFile'] / 2**20,
                      rss_added_mib=(after['VmRSS'] - before) / 2**20, peak_rss_mib=status()['VmHWM'] / 2**20,
                      search_p50_us=statistics.median(pruned), search_p99_us=pct(pruned, 0.99),
                      exhaustive_p50_us=statistics.median(exhaustive), exhaustive_p99_us=pct(exhaustive, 0.99),
                      search_cpu_p50_us=statistics.median(pruned_cpu), search_cpu_p99_us=pct(pruned_cpu, 0.99),
                      exhaustive_cpu_p50_us=statistics.median(exhaustive_cpu),
                      exhaustive_cpu_p99_us=pct(exhaustive_cpu, 0.99),
                      queries=len(qs), pruned_differs=differ)))
"""


def _load_in_child(folder: Path, cache: Path, qs: list[str], n: int, what: str) -> dict[str, Any]:
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), str(cache)],
        input=json.dumps(qs),
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"the {what} WebShop load of {n:,} products failed: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def synthetic_catalogue(root: Path, out: Path, n: int, seed: int = 0) -> Path:
    """Writes an ``n``-product catalogue built like the real one to ``out/data`` and returns ``out``.

    Each product is a product of the 1k set drawn at random (so every field — title, description,
    bullet points, options, prices, categories — keeps the size distribution of
    ``items_shuffle_1000.json``, and its attributes and instruction that of ``items_ins_v2_1000.json``),
    with a new ASIN, and with words of a Zipf-distributed vocabulary added to its title (3) and
    description (5), so that the index's vocabulary grows with the catalogue as a real one does. The
    noun table covers every name (the template's nouns and the added title words). Written as
    ``items_shuffle.json`` / ``items_ins_v2.json`` / ``spacy_nouns.json``, the full set's names."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = json.loads((root / "data" / "items_shuffle_1000.json").read_text())
    attrs = json.loads((root / "data" / "items_ins_v2_1000.json").read_text())
    nouns_1k = json.loads((root / "facts" / "spacy_nouns_1k.json").read_text())["by_name"]
    pick = rng.integers(0, len(base), size=n)
    ranks = np.minimum(rng.zipf(1.25, size=(n, 8)), 50_000_000)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    out_attrs, by_name = {}, {}
    with open(data / "items_shuffle.json", "w", encoding="utf-8") as f:
        f.write("[")
        for i in range(n):
            t = base[int(pick[i])]
            words = [f"w{int(r):x}" for r in ranks[i]]
            p = dict(t)
            p["asin"] = f"S{i:09d}"
            p["name"] = f"{t['name']} {' '.join(words[:3])}"
            p["full_description"] = f"{t.get('full_description') or ''} {' '.join(words[3:])}"
            f.write(("," if i else "") + json.dumps(p, ensure_ascii=False))
            out_attrs[p["asin"]] = attrs.get(t["asin"], {"attributes": []})
            by_name[p["name"]] = {"nouns": nouns_1k.get(t["name"], {"nouns": []})["nouns"] + words[:3]}
        f.write("]")
    (data / "items_ins_v2.json").write_text(json.dumps(out_attrs))
    (data / "items_human_ins.json").write_text("{}")
    (data / "spacy_nouns.json").write_text(json.dumps({"by_name": by_name}, ensure_ascii=False))
    return out


def scale_row(root: Path, n: int, queries: int = 1000, keep: Optional[Path] = None) -> dict[str, Any]:
    """A synthetic ``n``-product catalogue (:func:`synthetic_catalogue`) loaded twice, each in a
    fresh process: cold (stream-parse, index, nouns, goals, and the index cache written) and
    cached (the cache mapped, goals made). Per load: time, resident memory after it (anonymous
    and file-backed) and at the peak; search latency (median and p99 over ``queries`` goal
    instructions of the 1k set; wall clock, and the calling thread's CPU time, which a loaded
    machine inflates less) of the pruned search and of the exhaustive reference on the same
    queries in the same process, after one untimed pass of both that faults the index's pages in
    and counts the queries whose hits differ (0: the same hits in the same order).
    ``keep``: write the catalogue there and keep it (else a temporary folder)."""
    import shutil

    from pcsd.envs.webshop import WebShop

    small = WebShop.load(root / "data")
    step = max(1, small.num_goals // queries)
    qs = [small.goal(i)["instruction_text"] for i in range(0, small.num_goals, step)][:queries]
    with tempfile.TemporaryDirectory(prefix="pcsd-webshop-scale-") as tmp:
        folder = keep or Path(tmp)
        t0 = time.perf_counter()
        if not (folder / "data" / "items_shuffle.json").is_file():
            synthetic_catalogue(root, folder, n)
        write_s = time.perf_counter() - t0
        size = (folder / "data" / "items_shuffle.json").stat().st_size
        cache = Path(tmp) / "index-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cold = _load_in_child(folder, cache, qs, n, "cold")
        warm = _load_in_child(folder, cache, qs, n, "cached")
        if cold["cache_hit"] or not warm["cache_hit"]:
            raise RuntimeError(f"the index cache was not used as expected: cold {cold}, cached {warm}")
        cache_gb = Path(warm["cache_path"]).stat().st_size / 1e9
    row: dict[str, Any] = dict(
        engine="webshop native, synthetic catalogue",
        products=warm["products"],
        goals=warm["goals"],
        catalogue_gb=size / 1e9,
        cache_gb=cache_gb,
        write_s=write_s,
        cold_load_s=cold["load_s"],
        cached_load_s=warm["load_s"],
        load_and_index_s=cold["load_s"],
        cold_rss_mib=cold["rss_mib"],
        cold_peak_rss_mib=cold["peak_rss_mib"],
        rss_mib=warm["rss_mib"],
        rss_anon_mib=warm["rss_anon_mib"],
        rss_file_mib=warm["rss_file_mib"],
        rss_added_mib=warm["rss_added_mib"],
        peak_rss_mib=warm["peak_rss_mib"],
        queries=warm["queries"],
        pruned_differs=cold["pruned_differs"] + warm["pruned_differs"],
        original_lucene_query_ms=3.4,
    )
    # search figures from the cached process (what a training run sees), the ratio in that run
    for k in ("search", "exhaustive", "search_cpu", "exhaustive_cpu"):
        row[f"{k}_p50_us"], row[f"{k}_p99_us"] = warm[f"{k}_p50_us"], warm[f"{k}_p99_us"]
    row["search_median_us"] = warm["search_p50_us"]
    row["search_speedup_p50"] = warm["exhaustive_p50_us"] / warm["search_p50_us"]
    row["search_speedup_p99"] = warm["exhaustive_p99_us"] / warm["search_p99_us"]
    return row
