"""Where a run keeps its episode records: ``<run>/episodes/``, one JSONL file per training step
(``step_NNNNNN.jsonl``) and one per evaluation's failed episodes (``eval_NNNNNN_<name>.jsonl``).
The trainer writes them (:mod:`pcsd.train.episodes`), the page reads them (:mod:`pcsd.view.page`)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["EPISODES_DIR", "episode_files"]

EPISODES_DIR = "episodes"
_STEP_FILE = re.compile(r"^step_(\d{6,})\.jsonl$")
_EVAL_FILE = re.compile(r"^eval_(\d{6,})_([A-Za-z0-9_-]+)\.jsonl$")


def episode_files(run_dir: str | Path) -> list[tuple[int, str, Path]]:
    """The episode files of a run as ``(step, name, path)``: ``name`` is ``"train"`` for a training
    step's file, else the evaluation's name; ordered by step, training before evaluations."""
    d = Path(run_dir) / EPISODES_DIR
    out = []
    if d.is_dir():
        for p in d.iterdir():
            m = _STEP_FILE.match(p.name)
            if m:
                out.append((int(m.group(1)), "train", p))
                continue
            m = _EVAL_FILE.match(p.name)
            if m:
                out.append((int(m.group(1)), m.group(2), p))
    return sorted(out, key=lambda x: (x[0], x[1] != "train", x[1]))
