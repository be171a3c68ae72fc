"""Per-step training metrics: one JSON line per step (``metrics.jsonl``), TensorBoard scalars, and
PNG plots at the end.

The loop builds a flat record per step with :func:`step_record` (from the rollout batch, the update
statistics and the phase timings) and hands it to :meth:`MetricsLogger.log`. Keys map to
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
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = [
    "MetricsLogger",
    "WandbSink",
    "anchor_fields",
    "category_success",
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


def step_record(
    step: int, rb, stats: Mapping[str, Any], *, step_seconds: float, sync_seconds: float = 0.0
) -> dict[str, Any]:
    """The flat per-step record: rollout results (reward, success overall and per category, turns,
    valid actions, episodes ended by an over-long prompt) of ``rb``, every episode the step played
    (with dynamic sampling the dropped groups too), the update statistics (none for a skipped step),
    tokens/s and the time per phase."""
    won = rb.won.tolist()
    tokens = rb.num_tokens()
    rec: dict[str, Any] = dict(
        step=step,
        reward=float(rb.reward.mean()),
        success=100.0 * float(rb.won.float().mean()),
        **category_success(rb.task_type, won),
        turns=float(rb.length.float().mean()),
        valid_actions=float(rb.action_valid.float().mean()),
        prompt_overflows=rb.prompt_overflows,  # episodes ended: prompt over rollout.max_prompt_tokens
        rollout_seconds=rb.timings.total,
        outside_model_share=rb.timings.outside_model_share(),
        gen_tokens_per_s=tokens / max(rb.timings.generation, 1e-9),
        tokens_per_s=tokens / max(step_seconds, 1e-9),
        sync_seconds=sync_seconds,
        step_seconds=step_seconds,
    )
    for k, v in stats.items():
        rec["entropy" if k == "entropy_proxy" else k] = v
    return rec


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
        rec = dict(record)
        self.history.append(rec)
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()
        scalars = {tag_for(k): x for k, x in ((k, _scalar(v)) for k, v in rec.items()) if k != "step" and x is not None}
        if self._tb is not None:
            for tag, x in scalars.items():
                self._tb.add_scalar(tag, x, int(rec["step"]))
        if self._wandb is not None:
            self._wandb.log(scalars, int(rec["step"]))

    def log_eval(self, name: str, result: Mapping[str, Any], step: int) -> None:
        """An evaluation (``name`` e.g. ``"before"``/``"after"``) with ``overall`` and
        ``per_category`` (the dict of :func:`pcsd.eval.evaluate`)."""
        rec = dict(
            name=name,
            step=int(step),
            overall=float(result["overall"]),
            per_category=dict(result.get("per_category", {})),
        )
        self.evals.append(rec)
        with self.evals_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        scalars = {"eval/overall": rec["overall"]}
        scalars.update({f"eval/{c}": float(v) for c, v in rec["per_category"].items() if v is not None})
        if self._tb is not None:
            for tag, x in scalars.items():
                self._tb.add_scalar(tag, x, rec["step"])
        if self._wandb is not None:
            self._wandb.log(scalars, rec["step"])

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
