"""What every source shares: its manifest, mirror URLs, resumable HTTP downloads with a rich
progress bar, staging folders and the one-line error.

A download goes to ``<dest>/.pcsd-partial/<file>.part`` in the destination's own file system, so
that a cut connection (or a killed process) is resumed with an HTTP ``Range`` request on the next
try, and so that the finished file is moved into place, never copied. Nothing is moved into place
before its source checked it (it parses, its counts match the manifest, its checksum where one is
published).

The manifest of a source (``pcsd/data/manifests/<source>.json``) names the original public URLs,
the counts a correct download holds and the checksums where they are published; ``--manifest``
points at another one (a private mirror with other files, the tests' small fixtures).
``PCSD_<SOURCE>_URL`` names a mirror: every file is fetched from ``<mirror>/<file name>``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from pcsd.progress import progress_enabled

__all__ = [
    "DataError",
    "Manifest",
    "load_manifest",
    "file_url",
    "download",
    "sha256_of",
    "partial_dir",
    "staging_dir",
    "check_from_dir",
    "replace_into",
]

MANIFESTS = Path(__file__).resolve().parent / "manifests"
#: connection cuts a download survives in one run (each resumes where the last one stopped)
RETRIES = 5
CHUNK = 1 << 20
USER_AGENT = "pcsd-data/0.1 (+python urllib)"


class DataError(Exception):
    """A download or install that cannot go on: the message is one line naming what was tried."""


@dataclass(frozen=True)
class Manifest:
    """A source's manifest: ``files`` (name, url, optional sha256 and size) and the rest of the
    source's expectations (``extra``: counts, the layout)."""

    source: str
    path: Path
    files: dict[str, dict[str, Any]]
    extra: dict[str, Any]

    def file(self, name: str) -> dict[str, Any]:
        if name not in self.files:
            raise DataError(f"manifest {self.path}: no entry for {name} (expected one per file of {self.source})")
        return self.files[name]


def load_manifest(source: str, path: Optional[str | os.PathLike[str]] = None) -> Manifest:
    """The manifest of ``source``: the shipped one, or ``path`` (``--manifest``)."""
    p = Path(path) if path is not None else MANIFESTS / f"{source}.json"
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"--manifest {p}: no such file") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"--manifest {p}: not a readable JSON manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("source") != source or not isinstance(raw.get("files"), list):
        raise DataError(f'--manifest {p}: expected a JSON object with "source": "{source}" and a "files" list')
    files = {}
    for f in raw["files"]:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("url"), str):
            raise DataError(f'--manifest {p}: every file needs a "name" and a "url", got {f!r}')
        files[f["name"]] = f
    extra = {k: v for k, v in raw.items() if k not in ("source", "files")}
    return Manifest(source, p, files, extra)


def file_url(manifest: Manifest, name: str) -> str:
    """The URL of file ``name``: ``$PCSD_<SOURCE>_URL/<name>`` when that mirror is set, else the
    manifest's (the original public source)."""
    var = f"PCSD_{manifest.source.upper()}_URL"
    mirror = os.environ.get(var, "").strip()
    if mirror:
        return f"{mirror.rstrip('/')}/{name}"
    return manifest.file(name)["url"]


def partial_dir(dest: Path) -> Path:
    """Where downloads in progress wait (kept between runs, so that a new run resumes them)."""
    return dest / ".pcsd-partial"


def staging_dir(dest: Path, what: str) -> Path:
    """A fresh folder beside the final place, on the same file system (so a move is a rename)."""
    d = dest / f".pcsd-staging-{what}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def replace_into(src: Path, dst: Path) -> None:
    """Moves the checked ``src`` to ``dst``; a ``dst`` already there (``--force``) is moved aside
    first and deleted only once the new one is in place."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old")
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def check_from_dir(from_dir: str | os.PathLike[str]) -> Path:
    p = Path(from_dir).expanduser()
    if not p.is_dir():
        what = "no such folder" if not p.exists() else "not a folder"
        raise DataError(f"--from {p}: {what} (expected a local copy of the files to install)")
    return p.resolve()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress_enabled(console),
        transient=False,
    )


def _reason(exc: BaseException) -> str:
    r = getattr(exc, "reason", None) or exc
    return str(r).strip() or type(exc).__name__


def _open(url: str, have: int, what: str) -> tuple[Any, int]:
    """The response for ``url`` from byte ``have`` on, and the byte it starts at (0 when the server
    ignored the range)."""
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            # asked past the end: complete when the server says the file has exactly `have` bytes
            total = (exc.headers.get("Content-Range") or "").rpartition("/")[2]
            if total.isdigit() and int(total) == have:
                return None, have
        if exc.code == 404:
            raise DataError(
                f"{what}: {url} answered 404 Not Found (the file is not there: check the mirror or --manifest)"
            ) from None
        raise DataError(f"{what}: {url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError, http.client.HTTPException, OSError) as exc:
        raise DataError(
            f"{what}: could not reach {url} ({_reason(exc)}); without network, install from a local "
            f"copy with --from DIR"
        ) from None
    if have and resp.status == 206:
        start = (resp.headers.get("Content-Range") or "").removeprefix("bytes ").partition("-")[0]
        if start.isdigit() and int(start) == have:
            return resp, have
    return resp, 0


def download(
    url: str, part: Path, *, what: str, console: Console, size: Optional[int] = None, html_ok: bool = False
) -> Path:
    """Downloads ``url`` into ``part`` (resuming what ``part`` already holds) and returns it.

    A connection cut mid-file is resumed with a ``Range`` request, up to :data:`RETRIES` times;
    a server that ignores ranges sends the whole file again. ``size`` (when known) is checked at
    the end. An HTML page where a data file was expected (a quota or login page) is an error."""
    part.parent.mkdir(parents=True, exist_ok=True)
    cuts = 0
    with _progress(console) as bars:
        task = bars.add_task(f"{what}: {part.name.removesuffix('.part')}", total=size)
        while True:
            have = part.stat().st_size if part.exists() else 0
            resp, start = _open(url, have, what)
            if resp is None:  # the server says it is complete
                break
            with resp:
                ctype = resp.headers.get("Content-Type", "")
                if not html_ok and ctype.startswith("text/html"):
                    raise DataError(
                        f"{what}: {url} answered an HTML page instead of the file (a login, quota or "
                        f"moved-file page); download it by hand and use --from DIR"
                    )
                length = resp.headers.get("Content-Length")
                total = start + int(length) if length and length.isdigit() else size
                bars.update(task, total=total, completed=start)
                got = start
                try:
                    with open(part, "r+b" if start else "wb") as f:
                        f.seek(start)
                        f.truncate()
                        while True:
                            block = resp.read(CHUNK)
                            if not block:
                                break
                            f.write(block)
                            got += len(block)
                            bars.update(task, completed=got)
                except (http.client.IncompleteRead, ConnectionError, socket.timeout, OSError) as exc:
                    if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, ConnectionError):
                        raise DataError(f"{what}: writing {part} failed ({exc})") from None
                    cuts += 1
                    if cuts > RETRIES:
                        raise DataError(
                            f"{what}: the connection to {url} was cut {cuts} times ({_reason(exc)}); "
                            f"{got:,} bytes are kept in {part}: run again to resume"
                        ) from None
                    continue
            if total is not None and got < total:  # closed early without an error
                cuts += 1
                if cuts > RETRIES:
                    raise DataError(
                        f"{what}: {url} ended after {got:,} of {total:,} bytes {cuts} times; "
                        f"the bytes are kept in {part}: run again to resume"
                    )
                continue
            break
    have = part.stat().st_size
    if size is not None and have != size:
        part.unlink()
        raise DataError(
            f"{what}: {part.name.removesuffix('.part')} has {have:,} bytes, the manifest says {size:,} "
            f"(a different or damaged file; it was deleted)"
        )
    return part


def check_sha256(path: Path, expected: Optional[str], what: str, name: str) -> None:
    """Compares ``path``'s SHA-256 with the published ``expected`` (nothing to check when None);
    a mismatch deletes the file."""
    if not expected:
        return
    got = sha256_of(path)
    if got != expected.lower():
        path.unlink()
        raise DataError(
            f"{what}: {name} has SHA-256 {got}, the published one is {expected} (a damaged or "
            f"different file; it was deleted, run again to download it anew)"
        )


def fetch_file(
    manifest: Manifest, name: str, dest: Path, *, what: str, console: Console, html_ok: bool = False
) -> Path:
    """Downloads file ``name`` of ``manifest`` (resuming) and checks its size and SHA-256 where
    the manifest has them; returns the path of the ``.part`` file, checked."""
    entry = manifest.file(name)
    part = partial_dir(dest) / f"{name}.part"
    download(file_url(manifest, name), part, what=what, console=console, size=entry.get("size"), html_ok=html_ok)
    check_sha256(part, entry.get("sha256"), what, name)
    return part
