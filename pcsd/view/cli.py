"""The command line of :mod:`pcsd.view`: bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from pcsd.view.page import ViewError, build_page


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pcsd.view",
        description="Write a run's episodes page (one static HTML file; open it in a browser, no server needed).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a run folder; a second one puts the two side by side")
    p.add_argument("--out", "-o", default=None, help="the page's path (default RUN/view/index.html)")
    args = p.parse_args(argv)
    try:
        path = build_page(args.runs, args.out)
    except ViewError as exc:
        print(f"pcsd.view: {exc}", file=sys.stderr)
        return 2
    print(f"{path} ({path.stat().st_size / 1024:.0f} kB): open it in a browser (file://{path.resolve()})")
    return 0
