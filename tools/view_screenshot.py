"""The screenshot of docs/view.md: a run's page in headless Chromium (pcsd.view.browser).

    python tools/view_screenshot.py RUN docs/figures/view.png [--hash 'colour=weight&prompts=open']

Shows the first training episode with token values unless the hash selects another (``ep0=N``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pcsd.view import build_page, load_run
from pcsd.view.browser import pixel_stats, screenshot


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("out")
    p.add_argument("--hash", default="colour=weight&prompts=open")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=1000)
    a = p.parse_args()
    page = build_page([a.run])
    h = a.hash
    if "ep0=" not in h:
        eps = load_run(a.run)["episodes"]
        first = next((i for i, e in enumerate(eps) if e.get("token_values") and e["turns"]), 0)
        h += f"&ep0={first}"
    png = screenshot(page.resolve().as_uri() + "#" + h, a.out, window=(a.width, a.height))
    print(json.dumps(dict(page=str(page), png=str(png), kB=round(Path(png).stat().st_size / 1024), **pixel_stats(png))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
