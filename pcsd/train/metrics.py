"""Per-step training metrics: one JSON line per step (``metrics.jsonl``), TensorBoard scalars, and
PNG plots at the end.

The loop builds a typed record per step with :func:`step_record` (a :class:`StepRecord`: the rollout
batch's :class:`RolloutStats`, the update's :class:`UpdateStats` or none for a skipped step, the
phase timings and the other fields) and hands its flat line (:meth:`StepRecord.line`) to
:meth:`MetricsLogger.log`; :func:`console_line` is its console line. Keys map to
TensorBoard tags by :func:`tag_for` (``reward`` -> ``train/reward``, ``gap_mean`` ->
``pcsd/gap_mean``, ``kl`` -> ``loss/kl``, ``rollout_seconds`` -> ``time/rollout``, ``success/Pick`` as
is, ...). Evaluations (before/after RL) go to ``eval/<category>`` and ``eval/overall`` and into
``evals.jsonl``. With episode records (``run.log_episodes``, :mod:`pcsd.train.episodes`) each
step's and each evaluation's episodes also go to TensorBoard as a markdown table (the Text tab,
tag ``episodes/<step or evaluation>``). With ``run.wandb=true`` (the ``wandb`` extra) the same
scalars and tables go to Weights & Biases (:class:`WandbSink`; ``WANDB_MODE=offline`` keeps them
local, ``WANDB_PROJECT`` names the project, default ``pcsd``). :meth:`MetricsLogger.plot` draws

- ``training_dynamics.png``: mean teacher-student gap and gate-activation ratio (share of valid
  tokens with w > 0.5) against the step, the two curves of the paper's training-dynamics figure;
- ``success.png``: training success per step with the evaluation points (before/after RL) and the
  periodic validations (``eval.every``; also ``val_success`` in the step's metrics.jsonl line).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, TypedDict

__all__ = [
    "MetricsLogger",
    "RolloutStats",
    "StepRecord",
    "UpdateStats",
    "WandbSink",
    "anchor_fields",
    "category_success",
    "console_line",
    "plot_history",
    "read_jsonl",
    "step_record",
    "tag_for",
    "wandb_missing",
    "wandb_settings",
]

#: record key -> TensorBoard tag (keys not listed go to ``train/<key>``; keys with a ``/`` are kept)
TAGS: dict[str, str] = {
    "reward": "train/reward",
    "success": "train/success",
    "turns": "train/turns",
    "valid_actions": "train/valid_actions",
    "gap_mean": "pcsd/gap_mean",
    "gate_activation": "pcsd/gate_activation",
    "weight_mean": "pcsd/weight_mean",
    "loss": "loss/total",
    "pg": "loss/pg",
    "kl": "loss/kl",
    "pcsd": "loss/pcsd",
    "clip_frac": "loss/clip_frac",
    "grad_norm": "optim/grad_norm",
    # updates not applied for a non-finite loss or gradient norm (pcsd.train.update; optim.max_nonfinite_updates)
    "nonfinite_updates": "optim/nonfinite_updates",
    "entropy": "entropy",
    "tokens": "perf/response_tokens",
    "tokens_per_s": "perf/tokens_per_s",
    "gen_tokens_per_s": "perf/gen_tokens_per_s",
    "outside_model_share": "perf/rollout_outside_model_share",
    "rollout_seconds": "time/rollout",
    "score_seconds": "time/scoring",
    "update_seconds": "time/update",
    "sync_seconds": "time/weight_sync",
    "step_seconds": "time/step",
    "val_success": "val/success",  # periodic validation (eval.every); per category val_success/<category>
    # dynamic sampling (rollout.dynamic_sampling, pcsd.train.sampling): batches played, groups trained on,
    # dropped (rewards all equal), left out beyond tasks_per_step; a step left without a group is skipped
    "sample_batches": "sampling/batches",
    "groups_kept": "sampling/groups_kept",
    "groups_dropped": "sampling/groups_dropped",
    "groups_surplus": "sampling/groups_surplus",
    "skipped": "sampling/skipped",
    # GiGPO's anchor groups (algo.estimator=gigpo): how many, their mean size in rows, and the share of
    # rows in a group of two or more (the rows a step-level advantage can reach)
    "anchor_groups": "gigpo/anchor_groups",
    "anchor_group_rows": "gigpo/anchor_group_rows",
    "anchor_shared": "gigpo/anchor_shared",
}


def tag_for(key: str) -> str:
    """The TensorBoard tag of a record key."""
    if key in TAGS:
        return TAGS[key]
    return key if "/" in key else f"train/{key}"


def category_success(task_types: Sequence[str], won: Sequence[bool], kind: Any = None) -> dict[str, float]:
    """``{"success/<category>": %}`` for the categories present, named and ordered by the env kind's
    table (``kind``, default: the default kind; ALFWorld: the paper's names, Pick, Look, ...)."""
    from pcsd.envs import registry

    kind = kind or registry.default()
    if len(task_types) != len(won):
        raise ValueError(f"task_types and won differ in length ({len(task_types)} vs {len(won)})")
    per: dict[str, list[bool]] = {}
    for tt, w in zip(task_types, won):
        per.setdefault(kind.category(tt), []).append(bool(w))
    order = [c for c in kind.categories if c in per] + sorted(c for c in per if c not in kind.categories)
    return {f"success/{c}": 100.0 * sum(per[c]) / len(per[c]) for c in order}


class UpdateStats(TypedDict):
    """What one update measured (:func:`pcsd.train.update.update_step`), over every rank: the
    update's fields of a step's line (``entropy_proxy`` is written ``entropy``)."""

    loss: float  # the loss summed over the micro-batches (and PPO passes)
    pg: float
    kl: float
    pcsd: float  # the distillation term (lambda not applied)
    clip_frac: float
    grad_norm: float  # the last applied pass's (before clipping); the non-finite one when none was
    score_seconds: float
    update_seconds: float
    tokens: int  # response tokens trained on
    gap_mean: float  # mean teacher - student gap per token (0 without a teacher)
    weight_mean: float
    gate_activation: float  # share of tokens with weight > 0.5
    entropy_proxy: float  # mean negative log-prob of the sampled tokens
    nonfinite_updates: int  # PPO passes not applied: their loss or gradient norm was not finite


class RolloutStats(TypedDict):
    """What a step's rollouts measured (every episode played): the line's rollout fields."""

    reward: float
    success: float
    turns: float
    valid_actions: float
    prompt_overflows: int  # episodes ended: prompt over rollout.max_prompt_tokens
    rollout_seconds: float
    outside_model_share: float
    gen_tokens_per_s: float


@dataclass
class StepRecord:
    """One RL step's metrics; its ``metrics.jsonl`` line is :meth:`line`.

    The rule for a **skipped** step (dynamic sampling left no group: nothing trained): ``update`` is
    None, and its line has none of the update's fields (:class:`UpdateStats`: losses, gradient norm,
    tokens trained, the teacher's gap and gate, scoring and update seconds), where a 0 would read as
    a measurement, but ``skipped: true``; every other field is there as on any step (the rollouts,
    the timings, dynamic sampling's counts, GiGPO's anchor-group counts of the groups trained on: 0).
    Readers take the update's fields from ``update`` (typed ``Optional``: mypy refuses a reader that
    does not ask whether the step trained)."""

    step: int
    rollout: RolloutStats
    update: Optional[UpdateStats]  # None: the step trained nothing (skipped)
    tokens_per_s: float  # the rollouts' response tokens per second of the whole step
    sync_seconds: float
    step_seconds: float
    fields: dict[str, Any] = field(default_factory=dict)  # success/<category>, sampling counts, the kind's, ...

    @property
    def skipped(self) -> bool:
        return self.update is None

    def seconds(self, phase: str) -> float:
        """Seconds of ``phase`` (rollout, score, update, weight_sync) in this step (0: it did not run)."""
        if phase == "rollout":
            return self.rollout["rollout_seconds"]
        if phase == "weight_sync":
            return self.sync_seconds
        if phase == "score":
            return 0.0 if self.update is None else self.update["score_seconds"]
        if phase == "update":
            return 0.0 if self.update is None else self.update["update_seconds"]
        raise ValueError(f"unknown phase {phase!r}")

    def line(self) -> dict[str, Any]:
        """The flat ``metrics.jsonl`` line (and TensorBoard's scalars)."""
        rec: dict[str, Any] = dict(step=self.step, **self.rollout)
        rec.update(tokens_per_s=self.tokens_per_s, sync_seconds=self.sync_seconds, step_seconds=self.step_seconds)
        if self.update is None:
            rec["skipped"] = True
        else:
            for k, v in self.update.items():
                rec["entropy" if k == "entropy_proxy" else k] = v
        rec.update(self.fields)
        return rec


def step_record(
    step: int, rb, stats: Optional[UpdateStats], *, step_seconds: float, sync_seconds: float = 0.0
) -> StepRecord:
    """A step's record: rollout results (reward, success overall and per category, turns, valid
    actions, episodes ended by an over-long prompt) of ``rb``, every episode the step played (with
    dynamic sampling the dropped groups too), the update statistics (None: a skipped step), tokens/s
    and the time per phase."""
    tokens = rb.num_tokens()
    rollout = RolloutStats(
        reward=float(rb.reward.mean()),
        success=100.0 * float(rb.won.float().mean()),
        turns=float(rb.length.float().mean()),
        valid_actions=float(rb.action_valid.float().mean()),
        prompt_overflows=rb.prompt_overflows,
        rollout_seconds=rb.timings.total,
        outside_model_share=rb.timings.outside_model_share(),
        gen_tokens_per_s=tokens / max(rb.timings.generation, 1e-9),
    )
    return StepRecord(
        step=step,
        rollout=rollout,
        update=stats,
        tokens_per_s=tokens / max(step_seconds, 1e-9),
        sync_seconds=sync_seconds,
        step_seconds=step_seconds,
        fields=category_success(rb.task_type, rb.won.tolist()),
    )


def console_line(rec: StepRecord, steps: int, teacher: bool) -> str:
    """The step's console line: success and reward; then the update's KL (with a teacher, its gap and
    gate), tokens/s and seconds, or why there was no update."""
    head = f"step {rec.step}/{steps} success {rec.rollout['success']:.1f}% reward {rec.rollout['reward']:.2f} "
    up = rec.update
    if up is None:
        return head + f"no update (no group with a reward signal) {rec.step_seconds:.1f}s"
    gap = f"gap {up['gap_mean']:.3f} gate {up['gate_activation']:.2f} " if teacher else ""
    return head + f"{gap}kl {up['kl']:.4f} {rec.tokens_per_s:.0f} tok/s {rec.step_seconds:.1f}s"


def anchor_fields(rows: int, groups: int, shared: int) -> dict[str, float]:
    """The record's GiGPO fields (an estimator that reads anchor states) from the anchor-group counts
    of the groups the step trained on (:func:`pcsd.ops.estimators.anchor_group_counts`):
    ``anchor_groups``, ``anchor_group_rows`` (rows per group) and ``anchor_shared`` (the share of
    rows in a group of two or more: the rows whose step-level advantage can be other than 0; near 0,
    GiGPO is GRPO). A skipped step (nothing trained) has 0 for each."""
    return dict(
        anchor_groups=float(groups),
        anchor_group_rows=rows / max(groups, 1),
        anchor_shared=shared / max(rows, 1),
    )


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _scalar(v: Any) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


class MetricsLogger:
    """Writes each step's record to ``<run_dir>/metrics.jsonl`` and to TensorBoard event files in
    ``<run_dir>/tensorboard`` (``tensorboard=False``: JSONL only).

    Args:
        run_dir: the run directory.
        tensorboard: also write TensorBoard scalars.
        append: append to an existing ``metrics.jsonl`` (a resumed run) instead of starting anew.
        wandb: ``wandb.init``'s settings (:func:`wandb_settings`) to log to Weights & Biases too, or None.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        append: bool = True,
        wandb: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self.evals_path = self.run_dir / "evals.jsonl"
        # a resumed run (append) plots its whole history: the records written before it (the job has
        # cut them at the checkpoint's step)
        self.history: list[dict[str, Any]] = read_jsonl(self.jsonl_path) if append and self.jsonl_path.exists() else []
        self.evals: list[dict[str, Any]] = read_jsonl(self.evals_path) if append and self.evals_path.exists() else []
        if not append and self.evals_path.exists():
            self.evals_path.unlink()
        self._jsonl = self.jsonl_path.open("a" if append else "w")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self._wandb = WandbSink(self.run_dir, wandb) if wandb is not None else None

    def log(self, record: Mapping[str, Any]) -> None:
        """One step: a JSON line (all keys) and a scalar per numeric key at ``record["step"]``."""
        if "step" not in record:
            raise ValueError("record needs a 'step' key")
        # a value that is not finite (an update not applied) is null: metrics.jsonl stays strict JSON
        rec = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        self.history.append(rec)
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()
        scalars = {tag_for(k): x for k, x in ((k, _scalar(v)) for k, v in rec.items()) if k != "step" and x is not None}
        if self._tb is not None:
            for tag, x in scalars.items():
                self._tb.add_scalar(tag, x, int(record["step"]))
        if self._wandb is not None:
            self._wandb.log(scalars, int(record["step"]))

    def log_eval(self, name: str, result: Mapping[str, Any], step: int) -> None:
        """An evaluation (``name`` e.g. ``"before"``/``"after"``) with ``overall`` and
        ``per_category`` (the dict of :func:`pcsd.eval.evaluate`)."""
        overall, per_category = float(result["overall"]), dict(result.get("per_category", {}))
        rec = dict(name=name, step=int(step), overall=overall, per_category=per_category)
        self.evals.append(rec)
        with self.evals_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        scalars: dict[str, float] = {"eval/overall": overall}
        scalars.update({f"eval/{c}": float(v) for c, v in per_category.items() if v is not None})
        if self._tb is not None:
            for tag, x in scalars.items():
                self._tb.add_scalar(tag, x, int(step))
        if self._wandb is not None:
            self._wandb.log(scalars, int(step))

    def log_episodes(self, title: str, episodes: Sequence[Mapping[str, Any]], step: int) -> None:
        """A table of recorded episodes (:mod:`pcsd.train.episodes`; ``title`` e.g. ``step 3``): a
        markdown table in TensorBoard's Text tab (tag ``episodes/<title>``), a table in W&B."""
        from pcsd.train.episodes import episode_rows

        columns, rows = episode_rows(episodes)
        tag = "episodes/" + title.replace(" ", "_")
        if self._tb is not None:
            head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
            body = "".join("| " + " | ".join(_md_cell(c) for c in r) + " |\n" for r in rows)
            self._tb.add_text(tag, head + body, int(step))
        if self._wandb is not None:
            self._wandb.table(tag, columns, rows, int(step))

    def plot(self, out_dir: Optional[str | Path] = None) -> list[Path]:
        """The PNG plots of this run (see the module docs); returns their paths."""
        return plot_history(self.history, self.evals, out_dir or self.run_dir / "plots")

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _md_cell(v: Any) -> str:
    """A value as one markdown table cell (no line breaks, ``|`` escaped)."""
    text = f"{v:.3g}" if isinstance(v, float) else str(v)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


#: what ``run.wandb=true`` without the package says (at config read)
WANDB_INSTALL = "pip install 'pcsd[wandb]' (or pip install wandb)"


def wandb_missing() -> bool:
    """Whether the ``wandb`` package cannot be imported."""
    import importlib.util

    return importlib.util.find_spec("wandb") is None


def wandb_settings(cfg: Any) -> Optional[dict[str, Any]]:
    """``wandb.init``'s settings for a run config with ``run.wandb=true`` (else None): the project
    (``WANDB_PROJECT``, default ``pcsd``) and the resolved config."""
    import os

    from omegaconf import OmegaConf

    if not cfg.run.get("wandb", False):
        return None
    return dict(project=os.environ.get("WANDB_PROJECT", "pcsd"), config=OmegaConf.to_container(cfg, resolve=True))


class WandbSink:
    """The run's Weights & Biases run: scalars by step, episode tables. Its id is kept in
    ``<run dir>/wandb-id`` so that a resumed run continues the same W&B run; W&B's files go to
    ``<run dir>/wandb/`` (``WANDB_MODE=offline``: only there)."""

    def __init__(self, run_dir: Path, settings: Mapping[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        id_file = run_dir / "wandb-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        self.run = wandb.init(
            dir=str(run_dir), name=run_dir.name, id=run_id, resume="allow" if run_id else None, **settings
        )
        if run_id is None and getattr(self.run, "id", None):
            id_file.write_text(str(self.run.id) + "\n")

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        if scalars:
            self.run.log(dict(scalars), step=step)

    def table(self, tag: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({tag: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()


def plot_history(
    history: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]], out_dir: str | Path
) -> list[Path]:
    """``training_dynamics.png`` (gap and gate-activation vs step) and ``success.png`` (train
    success per step, evaluation before/after and the periodic validations) in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = [int(h["step"]) for h in history]
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in (
        (axes[0], "gap_mean", "mean teacher−student gap"),
        (axes[1], "gate_activation", "gate activation ratio (w > 0.5)"),
    ):
        ys = [h.get(key) for h in history]
        pts = [(s, y) for s, y in zip(steps, ys) if _scalar(y) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, color="tab:blue")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.suptitle("PCSD training dynamics")
    fig.tight_layout()
    p = out / "training_dynamics.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6, 3.8))
    if history:
        ax.plot(
            steps,
            [h.get("success", float("nan")) for h in history],
            marker="o",
            markersize=3,
            label="train (rollouts)",
            color="tab:blue",
        )
    ends = [e for e in evals if e["name"] in ("before", "after")]
    periodic = sorted((e for e in evals if e["name"] not in ("before", "after")), key=lambda e: e["step"])
    if periodic:  # eval.every: the validation curve through every evaluation
        line = sorted(evals, key=lambda e: e["step"])
        ax.plot(
            [e["step"] for e in line],
            [e["overall"] for e in line],
            marker="s",
            markersize=4,
            color="tab:purple",
            label="validation",
        )
    for e, color in zip(ends, ("tab:red", "tab:green")):
        ax.scatter([e["step"]], [e["overall"]], s=60, color=color, zorder=3, label=f"eval {e['name']}")
        ax.annotate(f"{e['overall']:.1f}%", (e["step"], e["overall"]), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("success (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("success")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    p = out / "success.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
