"""Episode records (``run.log_episodes``): what the agent said and did, token by token.

Each RL step, rank 0 writes up to ``run.log_episodes`` of the episodes its update trained on to
``<run dir>/episodes/step_NNNNNN.jsonl`` (one JSON object a line), and each evaluation (before RL,
the periodic validations, after RL) its failed episodes, up to ``run.log_eval_failures``, to
``episodes/eval_NNNNNN_<name>.jsonl`` (``NNNNNN``: the step it ran at). An episode holds its task,
task type, success, reward, score, env error and, per turn, the observation the response answered,
the student's prompt (and the teacher's: the same text with the teacher-only part, the skills and
the env's privileged text, stored once where it changes), the sampled response, the parsed action,
whether it was valid and the step's reward. A training episode's turns also hold each response
token's text, log pi_old (``student_logp``), the teacher's log-prob (``teacher_logp``), the gap and
the rule's ``weight``: the arrays the update computed, the same numbers ``run.record_gaps`` writes
(float32 values written in their shortest exact form; a non-finite value is ``null``).

Which training episodes: one per group, round-robin over the groups, alternately the group's first
failed and first won episode (a group without one gives the other), then the rest in order; a step
dynamic sampling skips (no update) records its played episodes without token values.

Bounds: at most ``run.log_episodes`` (training) and ``run.log_eval_failures`` (each evaluation)
episodes a file; when ``episodes/`` grows past ``run.episodes_max_mb``, the oldest training steps'
files are removed (never the one just written, never an evaluation's) with one warning. Each file
is written whole (a temporary file renamed), keyed by its step: a resumed run first removes the
files of steps after its checkpoint (:func:`cut_episodes`) and writes the steps it plays again
anew, so no step is recorded twice. Distributed runs record rank 0's groups.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from pcsd.view.files import EPISODES_DIR, episode_files

__all__ = [
    "EpisodeLog",
    "cut_episodes",
    "episode_records",
    "episode_rows",
    "pick_episodes",
    "prompt_parts",
    "update_record",
]

#: the per-token arrays a training turn holds (the name in the record, the key of the update's arrays)
TOKEN_FIELDS = (
    ("student_logp", "student_logp"),
    ("teacher_logp", "teacher_logp"),
    ("gap", "gap"),
    ("weight", "weights"),
)


def cut_episodes(run_dir: str | Path, last_step: int) -> None:
    """Removes the episode files of steps after ``last_step`` (-1: all) and temporary files a
    killed write left: what a resumed run plays again (its records are written anew)."""
    d = Path(run_dir) / EPISODES_DIR
    if not d.is_dir():
        return
    for p in d.glob(".tmp-*"):
        p.unlink(missing_ok=True)
    for step, _name, p in episode_files(run_dir):
        if step > last_step:
            p.unlink(missing_ok=True)


def _floats(values: Iterable[Any]) -> list[Optional[float]]:
    """float32 values in their shortest exact decimal form (JSON numbers; non-finite: None)."""
    out: list[Optional[float]] = []
    for v in np.asarray(values, dtype=np.float32).tolist():
        out.append(float(str(np.float32(v))) if math.isfinite(v) else None)
    return out


def prompt_parts(student: Sequence[int], teacher: Sequence[int], decode: Callable[[list[int]], str]) -> dict:
    """A turn's two prompts as the parts they share and the parts only one has: the student's is
    ``head + student_only + tail``, the teacher's ``head + teacher_only + tail`` (``head``/``tail``:
    the longest common prefix and suffix of the token ids; the teacher's skills and the env's
    privileged text come between the chat template's header and the student's text)."""
    s, t = list(student), list(teacher)
    p = 0
    while p < min(len(s), len(t)) and s[p] == t[p]:
        p += 1
    q = 0
    while q < min(len(s), len(t)) - p and s[len(s) - 1 - q] == t[len(t) - 1 - q]:
        q += 1
    return dict(
        head=decode(s[:p]),
        student_only=decode(s[p : len(s) - q]),
        teacher_only=decode(t[p : len(t) - q]),
        tail=decode(s[len(s) - q :]),
    )


def pick_episodes(rb: Any, n: int) -> list[int]:
    """Which trajectories of ``rb`` to record, at most ``n``: round-robin over the groups, one each
    pass, alternately preferring a failed and a won episode; see the module docs."""
    if n <= 0 or rb.num_trajectories == 0:
        return []
    won = [bool(w) for w in rb.won.tolist()]
    left: dict[int, list[int]] = {}
    for t, g in enumerate(rb.traj_group.tolist()):
        left.setdefault(int(g), []).append(t)
    out: list[int] = []
    while len(out) < n and any(left.values()):
        for g in sorted(left):
            if len(out) >= n or not left[g]:
                continue
            want_won = len(out) % 2 == 1
            pool = left[g]
            t = next((x for x in pool if won[x] == want_won), pool[0])
            pool.remove(t)
            out.append(t)
    return out


def episode_records(
    rb: Any,
    trajs: Sequence[int],
    decode: Callable[[list[int]], str],
    arrays: Optional[dict] = None,
    teacher: bool = True,
    **common: Any,
) -> list[dict]:
    """The records of trajectories ``trajs`` of ``rb`` (a :class:`pcsd.rollout.loop.RolloutBatch`),
    each starting with ``common`` (``kind``, ``step``, ...). With ``arrays`` (the update's per-token
    arrays, :func:`pcsd.train.update._record_arrays`, rows packed in ``rb``'s order) each turn gets
    its tokens' texts and values; with ``teacher``, the teacher's prompt beside the student's."""
    rows_of: dict[int, list[int]] = {}
    for i, t in enumerate(rb.traj_id.tolist()):
        rows_of.setdefault(int(t), []).append(i)
    cu = None
    if arrays is not None:
        cu = np.asarray(arrays["cu_seqlens"])
        if len(cu) != rb.num_rows + 1:
            raise ValueError(f"the update's arrays have {len(cu) - 1} rows, the batch {rb.num_rows}")
    step_reward = rb.row_step_rewards().tolist()
    out = []
    for t in trajs:
        turns = []
        teacher_only_before: Optional[str] = None
        for i in sorted(rows_of.get(int(t), []), key=lambda r: int(rb.turn[r])):
            ids = [int(x) for x in rb.response_ids[i]]
            turn: dict[str, Any] = dict(
                turn=int(rb.turn[i]),
                observation=rb.observation[i] if rb.observation else None,
                response=decode(ids),
                action=rb.actions[i],
                valid=bool(rb.action_valid[i]),
                reward=float(step_reward[i]),
            )
            parts = prompt_parts(rb.prompt_ids[i], rb.teacher_prompt_ids[i] if teacher else rb.prompt_ids[i], decode)
            turn["prompt"] = dict(head=parts["head"], student_only=parts["student_only"], tail=parts["tail"])
            if teacher:
                if parts["teacher_only"] == teacher_only_before:
                    turn["prompt"]["teacher_only_as_before"] = True
                else:
                    turn["prompt"]["teacher_only"] = teacher_only_before = parts["teacher_only"]
            turn["tokens"] = [decode([x]) for x in ids]
            if cu is not None and arrays is not None:
                lo, hi = int(cu[i]), int(cu[i + 1])
                if hi - lo != len(ids):
                    raise ValueError(f"row {i}: {hi - lo} token values for {len(ids)} response tokens")
                for name, key in TOKEN_FIELDS:
                    turn[name] = _floats(np.asarray(arrays[key])[lo:hi])
            turns.append(turn)
        task_type = rb.task_type[t]
        rec = dict(
            common,
            traj=int(t),
            group=int(rb.traj_group[t]),
            task=rb.task[t],
            task_type=task_type,
            won=bool(rb.won[t]),
            reward=float(rb.reward[t]),
            score=None if rb.score is None else float(rb.score[t]),
            length=int(rb.length[t]),
            env_error=rb.env_error[t] if rb.env_error else "",
            env_error_step=int(rb.env_error_step[t]) if rb.env_error_step else 0,
            prompt_overflow=bool(rb.prompt_overflow[t]) if rb.prompt_overflow is not None else False,
            token_values=cu is not None,
            turns=turns,
        )
        out.append(rec)
    return out


def _mean(xs: list) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def episode_rows(recs: Sequence[Mapping[str, Any]], max_actions: int = 8) -> tuple[list[str], list[list[Any]]]:
    """Recorded episodes as a table (TensorBoard's markdown table, a W&B table): the columns and
    one row per episode: where (step or evaluation), task type, task, success, reward, turns, the
    actions (the first ``max_actions``; the invalid ones marked ``!``), the mean gap and weight over
    the response tokens (training episodes) and the env error."""
    columns = [
        "where",
        "task_type",
        "task",
        "won",
        "reward",
        "turns",
        "actions",
        "mean_gap",
        "mean_weight",
        "env_error",
    ]
    rows = []
    for r in recs:
        turns = r.get("turns", [])
        acts = [("" if t.get("valid", True) else "!") + str(t.get("action", "")) for t in turns]
        acts_text = " > ".join(acts[:max_actions]) + (f" > ... ({len(acts)})" if len(acts) > max_actions else "")
        gaps = [x for t in turns for x in t.get("gap", [])]
        weights = [x for t in turns for x in t.get("weight", [])]
        g, w = _mean(gaps), _mean(weights)
        rows.append(
            [
                f"step {r['step']}" if r.get("kind") == "train" else f"{r.get('eval', 'eval')} (step {r.get('step')})",
                r.get("task_type", ""),
                r.get("task", ""),
                bool(r.get("won")),
                float(r.get("reward", 0.0)),
                len(turns),
                acts_text,
                "" if g is None else round(g, 4),
                "" if w is None else round(w, 4),
                r.get("env_error", ""),
            ]
        )
    return columns, rows


def _dumps(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class EpisodeLog:
    """Rank 0's episode records of a run (see the module docs). :meth:`update_callback` captures the
    update's arrays, :meth:`log_step` writes a step's file, :meth:`eval_sink` and :meth:`log_eval`
    an evaluation's. The metrics logger (:meth:`attach`) gets each file's episode table (TensorBoard,
    Weights & Biases); the tables written before it is attached (the evaluation before RL) on attaching."""

    def __init__(
        self,
        run_dir: str | Path,
        decode: Callable[[list[int]], str],
        *,
        per_step: int = 4,
        eval_failures: int = 32,
        max_mb: float = 100.0,
        teacher: bool = True,
        warn: Callable[[str], Any] = print,
    ) -> None:
        self.dir = Path(run_dir) / EPISODES_DIR
        self.run_dir = Path(run_dir)
        self.decode = decode
        self.per_step, self.eval_failures, self.max_bytes = int(per_step), int(eval_failures), float(max_mb) * 2**20
        self.teacher = teacher
        self.warn = warn
        self.metrics: Any = None
        self._pending: list[tuple[str, list[dict], int]] = []
        self._arrays: dict[int, dict] = {}
        self._warned = False

    def update_callback(self, step: int, inner: Optional[Callable[[dict], None]] = None) -> Callable[[dict], None]:
        """The ``record`` callback of :func:`pcsd.train.update.update_step` for 1-based ``step``:
        keeps the arrays for :meth:`log_step` and hands them on to ``inner`` (the gap recorder's)."""

        def record(arrays: dict) -> None:
            if self.per_step > 0:
                self._arrays[step] = arrays
            if inner is not None:
                inner(arrays)

        return record

    def log_step(self, step: int, trained: Any, played: Any) -> Optional[Path]:
        """Step ``step``'s file: episodes of ``trained`` (the batch the update saw, with its token
        values) or, for a step without an update, of ``played`` (without them)."""
        arrays = self._arrays.pop(step, None)
        if self.per_step <= 0:
            return None
        rb = trained if arrays is not None else played
        trajs = pick_episodes(rb, self.per_step)
        recs = episode_records(rb, trajs, self.decode, arrays, self.teacher, kind="train", step=step)
        return self._write(self.dir / f"step_{step:06d}.jsonl", recs, f"step {step}", step)

    def eval_sink(self) -> "EvalSink":
        """Where an evaluation's batches go (``on_batch`` of :func:`pcsd.eval.run.evaluate`)."""
        return EvalSink(self)

    def log_eval(self, name: str, step: int, sink: "EvalSink") -> Optional[Path]:
        if self.eval_failures <= 0:
            return None
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "eval"
        for r in sink.records:
            r.update(eval=name, step=step)
        return self._write(self.dir / f"eval_{step:06d}_{slug}.jsonl", sink.records, f"evaluation {name}", step)

    def _write(self, path: Path, recs: list[dict], title: str, step: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".tmp-{path.name}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(_dumps(r) + "\n")
        os.replace(tmp, path)
        self._keep_under_cap(path)
        if recs:
            self._pending.append((title, recs, step))
            self._flush()
        return path

    def attach(self, metrics: Any) -> None:
        """Sends the episode tables to ``metrics`` (a :class:`pcsd.train.metrics.MetricsLogger`)."""
        self.metrics = metrics
        self._flush()

    def _flush(self) -> None:
        if self.metrics is None:
            return
        for title, recs, step in self._pending:
            self.metrics.log_episodes(title, recs, step)
        self._pending.clear()

    def _keep_under_cap(self, newest: Path) -> None:
        files = episode_files(self.run_dir)
        total = sum(p.stat().st_size for _, _, p in files)
        if total <= self.max_bytes:
            return
        for _step, name, p in files:
            if total <= self.max_bytes:
                break
            if name != "train" or p == newest:
                continue
            total -= p.stat().st_size
            p.unlink()
            if not self._warned:
                self._warned = True
                self.warn(
                    f"warning: {self.dir} is over run.episodes_max_mb={self.max_bytes / 2**20:g}: the oldest "
                    f"training steps' episode records are removed (first: {p.name})"
                )


class EvalSink:
    """Collects an evaluation's failed episodes, batch by batch, up to the log's bound."""

    def __init__(self, log: EpisodeLog) -> None:
        self.log = log
        self.records: list[dict] = []

    def __call__(self, rb: Any) -> None:
        room = self.log.eval_failures - len(self.records)
        if room <= 0:
            return
        failed = [t for t, w in enumerate(rb.won.tolist()) if not w][:room]
        self.records += episode_records(rb, failed, self.log.decode, None, False, kind="eval")


def open_episode_log(job: Any) -> Optional[EpisodeLog]:
    """The job's episode log (rank 0, ``run.log_episodes`` or ``run.log_eval_failures`` > 0), else None."""
    from pcsd.ops.weighting import uses_teacher

    run = job.cfg.run
    per_step, failures = int(run.get("log_episodes", 0)), int(run.get("log_eval_failures", 0))
    if not job.ctx.is_main or (per_step <= 0 and failures <= 0) or job.builder.tokenizer is None:
        return None
    return EpisodeLog(
        job.run_dir,
        job.builder.tokenizer.decode,
        per_step=per_step,
        eval_failures=failures,
        max_mb=float(run.get("episodes_max_mb", 100)),
        teacher=uses_teacher(job.cfg),
        warn=job.say,
    )


def update_record(job: Any, step: int) -> Optional[Callable[[dict], None]]:
    """The update's ``record`` callback for 1-based ``step``: the gap recorder's (``run.record_gaps``,
    logged steps) and the episode log's, or None when neither wants the arrays."""
    inner = job.gap_recorder.for_step(step) if job.gap_recorder else None
    log = job.episode_log
    if log is None or log.per_step <= 0:
        return inner
    return log.update_callback(step, inner)
