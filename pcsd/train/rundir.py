"""A run folder belongs to one training at a time, and a new run never mixes with an old one.

:func:`claim_run_dir` is called by rank 0 before anything is written:

* **Lock.** ``<run dir>/.pcsd-lock`` is opened and locked with ``fcntl.flock`` (exclusive, not
  blocking) for the run's whole life. The kernel drops the lock when the process ends, however it
  ends (``kill -9`` included), so a crashed run never leaves its folder stuck; a second training
  into a folder in use is refused with the holder's pid. The file stays (it is not the lock, the
  flock on it is) and records the last holder.
* **New runs start empty.** A new run (no ``--resume``) into a folder holding anything but the lock
  file is refused: it would mix its metrics and checkpoints with the old ones, and a later
  ``--resume`` would load the old checkpoint under the new config. ``--resume`` continues the run
  in the folder; ``run.overwrite=true`` starts a new run there after moving everything the folder
  held into a sibling folder ``<run dir>.replaced-<time>/`` (a rename: instant, on the same file
  system, nothing deleted; delete that folder yourself when it is not needed).
* **Writable.** A folder that cannot be created or written (read-only file system, permissions)
  is a :class:`RunDirError` naming it, before any work.
* **A refused new run leaves nothing.** A check of the config that needs the run's first files (the
  generated tiny model's tokenizer) refuses the run after they were written; the new run's folder
  held nothing before it (above), so :func:`discard_new_run` removes what it wrote and the corrected
  command starts in the same folder.
* **Interrupted writes.** A kill during an atomic write (the warm-up's ``.tmp-sft-model-<pid>/``, a
  checkpoint's ``checkpoints/.tmp-step-*``) leaves its temporary folder; a resumed run, holding the
  lock, removes them (:func:`remove_stale_tmp`).
* **Every node sees the folder.** Rank 0 alone writes the run's files (checkpoints once, however
  many nodes), and every rank reads them (the generated model, the warm-up's model, a checkpoint
  to resume from), so a run over several nodes needs ``run.dir`` on a file system every node
  mounts at the same path (NFS, Lustre, GPFS, ...). :func:`check_shared_run_dir` checks it before
  any work: rank 0 writes a marker file, every rank waits for it (at most
  :data:`SHARED_WAIT_S` seconds: a network file system may show a new file late), and a rank that
  does not see it makes the run stop on every rank with one line naming the ranks and hosts, not
  hang.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path
from typing import Optional

__all__ = [
    "LOCK_NAME",
    "RunDirError",
    "RunLock",
    "claim_run_dir",
    "discard_new_run",
    "remove_stale_tmp",
    "check_shared_run_dir",
]

LOCK_NAME = ".pcsd-lock"
#: how long a rank waits for the marker rank 0 wrote into the run folder (check_shared_run_dir)
SHARED_WAIT_S = 30.0


class RunDirError(ValueError):
    """The run folder cannot be used (in use, holds another run, not writable); one line."""


class RunLock:
    """The lock on a run folder, held until :meth:`release` (or the process ends)."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self._fd = run_dir, fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(lock_path: Path) -> str:
    """Who holds the lock, from what its holder wrote: ``pid N on HOST, since TIME``. A holder pid
    that no longer runs on this host means a process it forked (e.g. a generation engine) lives on
    with the lock's file description."""
    try:
        text = lock_path.read_text().strip()
    except OSError:
        return "another process"
    if not text:
        return "another process"
    words = text.split()
    if len(words) >= 4 and words[0] == "pid" and words[1].isdigit() and words[3].rstrip(",") == socket.gethostname():
        try:
            os.kill(int(words[1]), 0)
        except ProcessLookupError:
            return (
                f"{text}; that process has ended, but a process it started still holds the lock: "
                f"fuser -v {lock_path} names it"
            )
        except OSError:
            pass
    return text


def _lock(run_dir: Path) -> RunLock:
    import fcntl

    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunDirError(f"run.dir={run_dir}: cannot write there ({exc.strerror or exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirError(
                f"run.dir={run_dir} is in use by another training ({_holder(path)}); wait for it "
                f"to end, or choose another run.dir"
            ) from None
        raise RunDirError(f"run.dir={run_dir}: cannot lock {path} ({exc.strerror or exc})") from None
    try:  # who holds it, for the message a second training gets
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0
        )
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        raise RunDirError(f"run.dir={run_dir}: cannot write there ({exc.strerror or exc})") from None
    return RunLock(run_dir, fd)


def _contents(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)


def _move_aside(run_dir: Path, names: list[str]) -> Path:
    """Moves ``names`` (entries of ``run_dir``) into a new sibling ``<run dir>.replaced-<time>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
    k = 1
    while aside.exists():
        k += 1
        aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}-{k}")
    try:
        aside.mkdir()
        for name in names:
            os.rename(run_dir / name, aside / name)
    except OSError as exc:
        raise RunDirError(
            f"run.overwrite=true: cannot move the old content of {run_dir} to {aside} "
            f"({exc.strerror or exc}); nothing of it was deleted"
        ) from None
    return aside


def claim_run_dir(
    run_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool = False
) -> tuple[RunLock, Optional[Path]]:
    """Creates ``run_dir`` if needed, locks it and checks that this run may use it (see the module
    docs). Returns the lock (hold it for the run's life) and, with ``overwrite`` on a folder that
    held something, the folder its old content was moved to (else None).

    Raises:
        RunDirError: the folder cannot be created or written, is in use, or holds something and
            neither ``resume`` nor ``overwrite`` is given; ``resume`` and ``overwrite`` together.
    """
    path = Path(run_dir)
    if resume and overwrite:
        raise RunDirError(
            "run.overwrite=true starts a new run in the folder, --resume continues the run there: give one of them"
        )
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run.dir={path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"run.dir={path}: cannot create it ({exc.strerror or exc})") from None
    lock = _lock(path)
    try:
        held = _contents(path)
        if resume or not held:
            return lock, None
        if not overwrite:
            what = "a run" if "config.yaml" in held else "files that are not a run"
            shown = ", ".join(n + ("/" if (path / n).is_dir() else "") for n in held[:5]) + (
                ", ..." if len(held) > 5 else ""
            )
            raise RunDirError(
                f"run.dir={path} is not empty: it holds {what} ({shown}); continue a run with "
                f"--resume {path}, start over with run.overwrite=true (moves the old content "
                f"to a sibling folder), or choose another run.dir"
            )
        return lock, _move_aside(path, held)
    except BaseException:
        lock.release()
        raise


def remove_stale_tmp(run_dir: Path) -> list[Path]:
    """Removes the ``.tmp-*`` entries of ``run_dir`` and of its ``checkpoints/`` (what a write cut short
    left; the caller holds the folder's lock, so no write of another process is in progress); returns
    what was removed."""
    import shutil

    gone = []
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for p in sorted(folder.glob(".tmp-*")):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            gone.append(p)
    return gone


def discard_new_run(run_dir: Path, lock: RunLock, *, remove_folder: bool) -> None:
    """Removes everything a new run wrote into ``run_dir`` (which held only the lock file when the
    run claimed it) and releases the lock; with ``remove_folder`` (the run created the folder) the
    folder goes too."""
    import shutil

    for name in _contents(run_dir):
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    lock.release()
    if remove_folder:
        (run_dir / LOCK_NAME).unlink(missing_ok=True)
        try:
            run_dir.rmdir()
        except OSError:
            pass


def check_shared_run_dir(run_dir: Path, ctx, *, wait_s: float = SHARED_WAIT_S) -> None:
    """Checks that every rank sees the run folder rank 0 writes (a collective; nothing to do in
    one process). Rank 0 writes ``.tmp-shared-<token>`` holding a random token into ``run_dir``
    (``.tmp-``: a kill before it is removed leaves what ``--resume`` cleans), every other rank
    waits up to ``wait_s`` seconds for that file with that token, and the ranks exchange what they
    saw. Raises :class:`RunDirError` on every rank (marked ``all_ranks``: rank 0 prints it) when
    some rank did not see it, naming those ranks and their hosts."""
    import secrets

    from pcsd.train import distributed as du

    if not ctx.distributed:
        return
    token = du.broadcast_object(secrets.token_hex(8) if ctx.is_main else None, ctx)
    marker = Path(run_dir) / f".tmp-shared-{token}"
    problem = None
    if ctx.is_main:
        try:
            with open(marker, "w", encoding="utf-8") as f:
                f.write(token)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            problem = f"cannot write {marker} ({exc.strerror or exc})"
    problem = du.broadcast_object(problem, ctx)
    seen = ctx.is_main or (problem is None and _wait_for_token(marker, token, wait_s))
    report = du.gather_objects((seen, socket.gethostname()), ctx)
    if ctx.is_main:
        marker.unlink(missing_ok=True)
    if problem is None:
        blind = [(r, host) for r, (ok, host) in enumerate(report) if not ok]
        if not blind:
            return
        hosts = sorted({h for _, h in blind})
        problem = (
            f"rank(s) {du.ranks_text([r for r, _ in blind])} on {', '.join(hosts[:4])}"
            f"{' ...' if len(hosts) > 4 else ''} cannot see the run folder rank 0 writes on "
            f"{report[0][1]} (its file {marker.name} did not appear there within {wait_s:g} s): a run over "
            f"several nodes needs run.dir on a file system every node mounts at the same path"
        )
    err = RunDirError(f"run.dir={run_dir}: {problem}")
    err.all_ranks = True  # type: ignore[attr-defined]
    raise err


def _wait_for_token(path: Path, token: str, wait_s: float) -> bool:
    """Whether ``path`` holds ``token`` within ``wait_s`` seconds (polled)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if path.read_text(encoding="utf-8") == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.2, max(wait_s / 10, 0.01)))
