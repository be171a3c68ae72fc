"""``pcsd-data alfworld``: the ALFWorld games the trainer reads, from the ``alfworld`` package's
own release (``json_2.1.2_tw-pddl.zip``, which ``alfworld-download`` fetches too), laid out as
that downloader lays them out: ``$ALFWORLD_DATA/json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``.

The archive is checked before anything is moved into place: it is a whole zip (every member's
CRC), every ``game.tw-pddl`` parses as a game (``pddl_domain``, ``pddl_problem``, ``grammar``),
and each split holds the manifest's count of games, counted as the trainer counts them
(``pcsd.eval.games.split_games``: ``json_2.1.1/<split>/*/*/game.tw-pddl``): 3,553 / 140 / 134
for train / valid_seen / valid_unseen. Only the game files are installed: the native engine reads
nothing else (the trajectory and PDDL archives of ``alfworld-download`` are for the original
engine's THOR side).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Optional

from rich.console import Console

from pcsd.data.fetch import (
    DataError,
    Manifest,
    check_from_dir,
    fetch_file,
    partial_dir,
    replace_into,
    sha256_of,
    staging_dir,
)

__all__ = ["ARCHIVE", "GAME_FILE", "ROOT", "count_games", "default_dest", "install"]

ROOT = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
ARCHIVE = "json_2.1.2_tw-pddl.zip"
GAME_KEYS = ("pddl_domain", "pddl_problem", "grammar")


def default_dest() -> Path:
    """``$ALFWORLD_DATA``, else the ``alfworld`` package's own default (``~/.cache/alfworld``)."""
    env = os.environ.get("ALFWORLD_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "alfworld"


def _split_of(rel: PurePosixPath) -> Optional[str]:
    """The split of a game file path relative to the data root, when it is one the trainer reads:
    ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``."""
    parts = rel.parts
    if len(parts) == 5 and parts[0] == ROOT and parts[4] == GAME_FILE:
        return parts[1]
    return None


def count_games(root: Path, splits: dict[str, int]) -> dict[str, int]:
    """Games per split under ``root/json_2.1.1``, counted as the trainer counts them."""
    return {s: sum(1 for _ in (root / ROOT / s).glob(f"*/*/{GAME_FILE}")) for s in splits}


def _check_counts(found: dict[str, int], want: dict[str, int], where: str) -> None:
    bad = [f"{s} {found.get(s, 0):,} (expected {n:,})" for s, n in want.items() if found.get(s, 0) != n]
    if bad:
        raise DataError(f"alfworld: {where} holds the wrong number of games: {', '.join(bad)}")


def _check_game(text: bytes, name: str) -> None:
    try:
        game = json.loads(text)
    except ValueError as exc:
        raise DataError(f"alfworld: {name} does not parse as JSON ({exc}): a damaged archive") from None
    if not isinstance(game, dict) or any(k not in game for k in GAME_KEYS):
        raise DataError(f"alfworld: {name} is not a game file (expected the keys {', '.join(GAME_KEYS)})")


def _unpack(archive: Path, into: Path, want: dict[str, int]) -> None:
    """Checks ``archive`` whole and extracts its games into ``into`` (``json_2.1.1/...``)."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(
            f"alfworld: {archive.name} is not a whole zip archive ({exc}): a damaged or truncated download"
        ) from None
    with zf:
        found: dict[str, int] = {s: 0 for s in want}
        games = []
        for info in zf.infolist():
            rel = PurePosixPath(info.filename)
            split = _split_of(rel)
            if split in found and not info.is_dir():
                found[split] += 1
                games.append((info, rel))
        _check_counts(found, want, archive.name)
        for info, rel in games:
            try:
                text = zf.read(info)  # checks the member's CRC
            except (zipfile.BadZipFile, zlib.error, OSError) as exc:
                raise DataError(f"alfworld: {archive.name}: {info.filename} is damaged ({exc})") from None
            _check_game(text, info.filename)
            out = into.joinpath(*rel.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(text)


def _copy_tree(src_root: Path, into: Path, want: dict[str, int]) -> None:
    """Copies an extracted ``json_2.1.1`` tree (a local copy, ``--from``), game files only."""
    _check_counts(count_games(src_root, want), want, str(src_root / ROOT))
    for split in want:
        for game in sorted((src_root / ROOT / split).glob(f"*/*/{GAME_FILE}")):
            rel = game.relative_to(src_root)
            _check_game(game.read_bytes(), str(rel))
            out = into / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(game, out)


def install(
    manifest: Manifest, dest: Path, *, from_dir: Optional[str] = None, force: bool = False, console: Console
) -> Path:
    """Installs the games into ``dest/json_2.1.1`` and returns ``dest``.

    ``from_dir``: a folder holding ``json_2.1.2_tw-pddl.zip``, or an extracted ``json_2.1.1/``
    (e.g. another machine's ``$ALFWORLD_DATA``). An install already complete is left alone; an
    incomplete one is replaced only with ``force``."""
    want = {str(k): int(v) for k, v in manifest.extra.get("splits", {}).items()}
    if not want:
        raise DataError(f'--manifest {manifest.path}: no "splits" with the expected game counts')
    src = check_from_dir(from_dir) if from_dir is not None else None
    dest = dest.expanduser().resolve()
    final = dest / ROOT
    if final.exists():
        found = count_games(dest, want)
        if all(found[s] == n for s, n in want.items()) and not force:
            console.print(
                f"alfworld: {final} already holds the {sum(want.values()):,} games "
                f"({', '.join(f'{s} {n:,}' for s, n in want.items())})"
            )
            return dest
        if not force:
            raise DataError(
                f"alfworld: {final} exists and is not a complete install "
                f"({', '.join(f'{s} {found[s]:,}/{n:,}' for s, n in want.items())}); "
                f"pass --force to replace it"
            )
    if src is not None and src == dest:
        raise DataError(f"--from {src}: the same folder as the destination (give another --dest)")
    dest.mkdir(parents=True, exist_ok=True)
    stage = staging_dir(dest, "alfworld")
    try:
        if src is not None and (src / ARCHIVE).is_file():
            _check_local_sha(manifest, src / ARCHIVE)  # the user's own copy is never deleted
            _unpack(src / ARCHIVE, stage, want)
        elif src is not None and (src / ROOT).is_dir():
            _copy_tree(src, stage, want)
        elif src is not None:
            raise DataError(f"--from {src}: holds neither {ARCHIVE} nor an extracted {ROOT}/ folder")
        else:
            part = fetch_file(manifest, ARCHIVE, dest, what="alfworld", console=console)
            try:
                _unpack(part, stage, want)
            except DataError as exc:  # a bad download is not resumed: the next run fetches it anew
                part.unlink(missing_ok=True)
                raise DataError(f"{exc} (the download was deleted: run again to fetch it anew)") from None
        replace_into(stage / ROOT, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if src is None:
        shutil.rmtree(partial_dir(dest), ignore_errors=True)
    console.print(
        f"alfworld: installed {sum(want.values()):,} games in {final} "
        f"({', '.join(f'{s} {n:,}' for s, n in want.items())})"
    )
    return dest


def _check_local_sha(manifest: Manifest, path: Path) -> None:
    expected = manifest.file(ARCHIVE).get("sha256")
    if expected and sha256_of(path) != expected.lower():
        raise DataError(f"--from {path.parent}: {ARCHIVE} does not have the published SHA-256 {expected}")
