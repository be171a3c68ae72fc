"""The full WebShop catalogue natively: load time and resident memory at 100k and 1.18 M products.

    python benchmarks/webshop_catalogue.py --webshop $WEBSHOP_DATA [--products 100000 1181436] [--keep DIR]

Each size is a synthetic catalogue built like the real one (``pcsd.bench.webshop.synthetic_catalogue``:
products of the 1k set drawn at random with new ASINs and Zipf-distributed words added, so field sizes
follow ``items_shuffle_1000.json`` and the vocabulary grows), loaded in a fresh process by
``pcsd.envs.webshop.WebShop.load`` (stream-parse, index, goals, noun table). Prints one line per size and
writes ``webshop_catalogue.json`` to ``--out``. ``docs/benchmarks.md`` has the figures.
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
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    if not args.webshop:
        ap.error("--webshop: give the WebShop folder (or set WEBSHOP_DATA)")
    rows = []
    for n in args.products:
        keep = Path(args.keep) / str(n) if args.keep else None
        row = scale_row(Path(args.webshop), n, keep=keep)
        rows.append(row)
        print(
            f"{row['products']:>9,} products ({row['catalogue_gb']:.2f} GB of JSON, {row['goals']:,} goals): "
            f"load + index {row['load_and_index_s']:.1f} s, resident {row['rss_mib']:,.0f} MiB after the load "
            f"(+{row['rss_added_mib']:,.0f}), peak {row['peak_rss_mib']:,.0f} MiB; search median "
            f"{row['search_median_us']:.0f} us",
            flush=True,
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "webshop_catalogue.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
