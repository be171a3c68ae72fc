"""The full WebShop catalogue natively: cold and cached load, search latency and resident memory at
100k and 1.18 M products.

    python benchmarks/webshop_catalogue.py --webshop $WEBSHOP_DATA [--products 100000 1181436] [--keep DIR]

Each size is a synthetic catalogue built like the real one (``pcsd.bench.webshop.synthetic_catalogue``:
products of the 1k set drawn at random with new ASINs and Zipf-distributed words added, so field sizes
follow ``items_shuffle_1000.json`` and the vocabulary grows), loaded twice by
``pcsd.envs.webshop.WebShop.load``, each time in a fresh process: cold (stream-parse, index, noun table,
goals, the index cache written to a fresh folder) and cached (the cache mapped). In each, 1,000 goal
instructions of the 1k set are searched with the pruned search and with the exhaustive reference (the
ratio is within one process; wall clock and the thread's CPU time; the hits are compared). Prints one line per size and writes
``webshop_catalogue.json`` to ``--out``. ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from pcsd.bench.webshop import FULL_CATALOGUE, scale_row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--webshop",
        default=os.environ.get("WEBSHOP_DATA"),
        help="the WebShop folder holding data/ and facts/ (default $WEBSHOP_DATA)",
    )
    ap.add_argument("--products", type=int, nargs="+", default=[100_000, FULL_CATALOGUE])
    ap.add_argument("--keep", help="write each catalogue to DIR/<n> and keep it (reused by the next run)")
    ap.add_argument("--queries", type=int, default=1000, help="goal instructions searched per load (default 1000)")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    if not args.webshop:
        ap.error("--webshop: give the WebShop folder (or set WEBSHOP_DATA)")
    rows = []
    for n in args.products:
        keep = Path(args.keep) / str(n) if args.keep else None
        row = scale_row(Path(args.webshop), n, queries=args.queries, keep=keep)
        row["loadavg"] = os.getloadavg()
        rows.append(row)
        print(
            f"{row['products']:>9,} products ({row['catalogue_gb']:.2f} GB of JSON, {row['goals']:,} goals, "
            f"cache {row['cache_gb']:.2f} GB): cold load {row['cold_load_s']:.1f} s (peak "
            f"{row['cold_peak_rss_mib']:,.0f} MiB), cached load {row['cached_load_s']:.1f} s, resident "
            f"{row['rss_mib']:,.0f} MiB after it ({row['rss_anon_mib']:,.0f} anonymous, {row['rss_file_mib']:,.0f} "
            f"mapped), peak {row['peak_rss_mib']:,.0f} MiB; search p50 {row['search_p50_us'] / 1e3:.2f} ms, "
            f"p99 {row['search_p99_us'] / 1e3:.2f} ms (exhaustive {row['exhaustive_p50_us'] / 1e3:.2f} / "
            f"{row['exhaustive_p99_us'] / 1e3:.2f} ms: {row['search_speedup_p50']:.1f}x / "
            f"{row['search_speedup_p99']:.1f}x); CPU time p50 {row['search_cpu_p50_us'] / 1e3:.2f} ms, p99 "
            f"{row['search_cpu_p99_us'] / 1e3:.2f} ms (exhaustive {row['exhaustive_cpu_p50_us'] / 1e3:.2f} / "
            f"{row['exhaustive_cpu_p99_us'] / 1e3:.2f} ms); {row['pruned_differs']} of {2 * row['queries']} "
            "searches differ; "
            f"load average {row['loadavg'][0]:.1f}",
            flush=True,
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "webshop_catalogue.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
