"""Rich progress bars for the training loop and evaluation: rollout (episodes, turns), scoring and
update (micro-batches).

The loop asks the reporter for a callback per phase and calls it with ``(done, total)``;
:func:`pcsd.rollout.loop.collect_rollouts` calls its ``progress`` once per turn with the number of
finished episodes. In quiet mode (stdout not a terminal, ``CI`` set, or ``enabled=False``) every
callback is ``None`` and nothing is drawn, so tests and logs stay clean; :meth:`print` still prints.

    with ProgressReporter() as pr:
        rb = collect_rollouts(..., progress=pr.rollout("rollout"))
        stats = update_step(..., progress=pr.phase)
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["ProgressReporter", "progress_enabled"]

Callback = Callable[[int, int], None]


def progress_enabled(console: Console, enabled: Optional[bool] = None) -> bool:
    """Bars are drawn when asked (``enabled=True``), or by default on an interactive terminal
    outside CI."""
    if enabled is not None:
        return bool(enabled)
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return console.is_terminal and not ci


class ProgressReporter:
    """One live display holding a bar per phase; bars are reused from step to step.

    Args:
        enabled: True/False forces the bars on/off; None decides by :func:`progress_enabled`.
        console: the rich console to draw on (default: stdout).
    """

    def __init__(self, enabled: Optional[bool] = None, console: Optional[Console] = None) -> None:
        self.console = console or Console()
        self.enabled = progress_enabled(self.console, enabled)
        self._progress: Optional[Progress] = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "ProgressReporter":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Starts the live display (no-op in quiet mode or when already started)."""
        if self.enabled and self._progress is None:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()

    def stop(self) -> None:
        """Stops the live display; the bars' last state stays on screen."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._tasks.clear()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Prints above the bars (or plainly in quiet mode)."""
        self.console.print(*args, **kwargs)

    def _bar(self, name: str, total: int, info: str = "") -> TaskID:
        assert self._progress is not None
        if name in self._tasks:
            tid = self._tasks[name]
            self._progress.reset(tid, total=total, completed=0, info=info, visible=True)
        else:
            tid = self._progress.add_task(name, total=total, info=info)
            self._tasks[name] = tid
        return tid

    def phase(self, name: str, total: int) -> Optional[Callback]:
        """A bar for ``total`` units of ``name`` (e.g. ``"update"``, micro-batches); returns
        ``cb(done, total)`` or None in quiet mode."""
        if self._progress is None:
            return None
        tid = self._bar(name, total)

        def cb(done: int, total_: int) -> None:
            self._progress.update(tid, completed=done, total=total_)  # type: ignore[union-attr]

        return cb

    def rollout(self, name: str = "rollout") -> Optional[Callback]:
        """A bar of finished episodes for one :func:`collect_rollouts` call; the info column counts
        turns (one callback per turn). None in quiet mode."""
        if self._progress is None:
            return None
        tid: Optional[TaskID] = None
        turns = 0

        def cb(done: int, total: int) -> None:
            nonlocal tid, turns
            turns += 1
            if tid is None:
                tid = self._bar(name, total)
            self._progress.update(tid, completed=done, total=total, info=f"turn {turns}")  # type: ignore[union-attr]

        return cb
