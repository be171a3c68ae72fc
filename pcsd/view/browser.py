"""Headless Chromium on a page from the file system: its DOM after the script ran, a screenshot, and
a screenshot's pixel statistics (the page's browser test, and the screenshot in docs/view.md).

Chromium is the Debian package ``chromium`` (``bash run.sh test`` installs it when absent); no
driver, no download: ``chromium --headless --dump-dom`` / ``--screenshot``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["BrowserError", "dump_dom", "find_chromium", "pixel_stats", "screenshot"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserError(RuntimeError):
    """Chromium is missing or failed."""


def find_chromium() -> Optional[str]:
    """The Chromium executable (``PCSD_CHROMIUM``, else the first of the usual names on PATH), or None."""
    given = os.environ.get("PCSD_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise BrowserError("no Chromium found (apt-get install chromium, or set PCSD_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="pcsd-chromium-") as profile:
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",  # root in containers; the page is our own file
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BrowserError(f"Chromium did not finish in {timeout:.0f} s: {' '.join(cmd)}") from None
    if r.returncode != 0:
        raise BrowserError(f"Chromium failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return r


def dump_dom(url: str, timeout: float = 180.0, window: tuple[int, int] = (1400, 900)) -> str:
    """The page's DOM after its scripts ran (``--dump-dom``)."""
    return _run([f"--window-size={window[0]},{window[1]}", "--dump-dom", url], timeout).stdout


def screenshot(url: str, out: str | Path, window: tuple[int, int] = (1400, 900), timeout: float = 180.0) -> Path:
    """A PNG of the page's first ``window`` pixels."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--window-size={window[0]},{window[1]}", f"--screenshot={out}", url], timeout)
    if not out.is_file():
        raise BrowserError(f"Chromium wrote no screenshot to {out}")
    return out


def pixel_stats(png: str | Path) -> dict[str, float]:
    """A PNG's size, pixel standard deviation (0 for a blank image) and the number of distinct colours
    (read with matplotlib's PNG reader)."""
    import numpy as np
    from matplotlib import image

    img = np.asarray(image.imread(str(png)))
    rgb = img[..., :3].reshape(-1, 3) if img.ndim == 3 else img.reshape(-1, 1)
    q = np.round(rgb * 255).astype(np.int64)
    keys = q[:, 0] * 65536 + (q[:, 1] * 256 + q[:, 2] if q.shape[1] == 3 else 0)
    return dict(
        width=float(img.shape[1]),
        height=float(img.shape[0]),
        std=float(rgb.std()),
        colours=float(len(np.unique(keys))),
    )
