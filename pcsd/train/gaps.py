"""Recorded teacher-student gaps of training rollouts (``run.record_gaps=true``).

On every logged step (``run.log_every``) the update hands its per-token terms to a
:class:`GapRecorder`, which writes one compressed ``npz`` to ``<run dir>/gaps/step_NNNNNN.npz``
(``step_NNNNNN.rankK.npz`` on rank K > 0 of a distributed run; each rank records its own groups).
Per token ``[T]``: ``gap`` (log pi_teacher - log pi_old), ``weights`` (the rule's distillation
weights; 0 for rules without weights), ``mask`` (valid tokens), ``student_logp`` (log pi_old) and
``teacher_logp``; per response turn: ``cu_seqlens`` ``[R+1]`` (the segments the weights' windows
never cross), ``row_traj`` and ``row_turn``; per trajectory ``traj_reward``; and ``step`` and
``rule``. Float arrays are float32, compressed: about 12 bytes per token (a step of the tiny
preset, 14k tokens, is 170 kB).

:func:`load_gap_records` reads them back (:mod:`pcsd.diagnostics` runs on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

__all__ = ["GapRecorder", "GapRecord", "load_gap_records", "GAPS_DIR"]

GAPS_DIR = "gaps"
_KEYS = ("gap", "weights", "mask", "student_logp", "teacher_logp", "cu_seqlens", "row_traj", "row_turn", "traj_reward")


class GapRecorder:
    """Writes one ``npz`` per recorded step under ``run_dir/gaps``; call :meth:`for_step` to get the
    ``record`` callback of :func:`pcsd.train.update.update_step` (None on steps not logged)."""

    def __init__(self, run_dir: str | Path, rule: str, log_every: int = 1, rank: int = 0):
        self.dir = Path(run_dir) / GAPS_DIR
        self.rule = rule
        self.log_every = max(int(log_every), 1)
        self.rank = rank
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, step: int) -> Path:
        suffix = f".rank{self.rank}" if self.rank else ""
        return self.dir / f"step_{step:06d}{suffix}.npz"

    def for_step(self, step: int):
        """The callback for 1-based ``step`` when it is a logged step, else None."""
        if step % self.log_every:
            return None

        def record(arrays: dict) -> None:
            missing = [k for k in _KEYS if k not in arrays]
            if missing:
                raise ValueError(f"gap record lacks {missing}")
            fields: dict[str, Any] = {k: np.asarray(arrays[k]) for k in _KEYS}
            fields.update(step=np.int64(step), rule=np.str_(self.rule))
            np.savez_compressed(self.path(step), **fields)

        return record


@dataclass
class GapRecord:
    """One recorded step (one rank's share of it)."""

    step: int
    rule: str
    gap: np.ndarray
    weights: np.ndarray
    mask: np.ndarray
    cu_seqlens: np.ndarray
    student_logp: np.ndarray
    teacher_logp: np.ndarray
    row_traj: np.ndarray
    row_turn: np.ndarray
    traj_reward: np.ndarray
    path: Optional[Path] = None

    @property
    def num_tokens(self) -> int:
        return int(self.gap.shape[0])


def load_gap_records(run_dir: str | Path) -> list[GapRecord]:
    """Every recorded step of a run (``<run_dir>/gaps/*.npz``), ordered by step and rank.
    FileNotFoundError when the run recorded none (it was not run with ``run.record_gaps=true``)."""
    d = Path(run_dir) / GAPS_DIR
    files = sorted(d.glob("step_*.npz")) if d.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{d}: no recorded gaps (train with run.record_gaps=true)")
    out = []
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            out.append(GapRecord(step=int(z["step"]), rule=str(z["rule"]), path=f, **{k: z[k] for k in _KEYS}))
    return out
