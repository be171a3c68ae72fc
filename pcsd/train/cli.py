"""``python -m pcsd.train [preset=NAME] [method=NAME] [key=value ...]`` — GRPO + PCSD training.

    python -m pcsd.train                                    # the embedded tiny-cpu default
    python -m pcsd.train preset=alfworld-qwen2.5-3b model.path=/models/Qwen2.5-3B-Instruct method=sdar
    python -m pcsd.train --resume runs/my-run               # continue from the newest checkpoint
    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan  # memory plan per GPU; loads nothing
    python -m pcsd.train preset=alfworld-qwen3-1.7b --plan --gpus 8 --gpu-memory-gb 40
    torchrun --nproc_per_node=4 -m pcsd.train preset=...    # FSDP2 over 4 processes

Resolves the configuration (see :mod:`pcsd.train.config`; methods in :mod:`pcsd.train.methods`), creates the
run directory (``run.dir``, printed at start), saves the resolved config there, and runs the
training job. Every run writes ``summary.json`` in its run directory and checkpoints under
``checkpoints/`` (every ``run.save_every`` steps and at the end). ``--resume RUN_DIR`` (or
``run.resume=RUN_DIR``) continues a run from its newest complete checkpoint with the run's saved
configuration; overrides that would change the run's meaning are refused.

Under torchrun (``WORLD_SIZE`` > 1) the student and the frozen teacher/reference are sharded with
FSDP2, each rank plays its share of the task groups, and rank 0 writes every file.

``--plan`` prints the memory plan per GPU (:mod:`pcsd.train.plan`) and exits (status 1 when it does
not fit); a run on CUDA whose plan does not fit the GPU stops before loading anything.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from pcsd.train.config import ConfigError, ConfigWarning, DictConfig, load_config, resume_config


def make_run_dir(cfg: DictConfig, create: bool = True) -> Path:
    if cfg.run.dir:
        path = Path(cfg.run.dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path("runs") / f"{cfg.preset}-{cfg.method}-{stamp}"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


_VALUED = ("--resume", "--gpus", "--gpu-memory-gb")
_OPTIONS = "--resume RUN_DIR, --plan [--gpus N] [--gpu-memory-gb G], -h/--help"


def parse_options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Splits the options (``--resume DIR``, ``--plan``, ``--gpus N``, ``--gpu-memory-gb G``, also
    as ``--opt=value``) from the dotted overrides."""
    overrides, opts = [], {}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{name} needs a value" + (" (a run directory)" if name == "--resume" else ""))
                val = argv[i + 1]
                i += 1
            opts[name] = val
        elif a == "--plan":
            opts[a] = "1"
        elif a.startswith("-"):
            raise ConfigError(f"unknown option {a!r}; options: {_OPTIONS} (everything else is key=value)")
        else:
            overrides.append(a)
        i += 1
    for o in overrides:
        if o.startswith("run.resume="):
            opts["--resume"] = o.split("=", 1)[1] or opts.get("--resume", "")
    return overrides, opts


def parse_args(argv: list[str]) -> tuple[list[str], str | None]:
    """Splits ``--resume DIR`` / ``--resume=DIR`` from the dotted overrides."""
    overrides, opts = parse_options(argv)
    return overrides, opts.get("--resume") or None


def plan_for(cfg: DictConfig, opts: dict[str, str]):
    """The memory plan for ``--gpus`` (default: ``WORLD_SIZE`` or 1) GPUs of ``--gpu-memory-gb``
    GiB (default: this machine's first GPU, else 80)."""
    from pcsd.train.plan import GiB, device_memory_bytes, memory_plan

    def number(name: str, default: float, kind=float) -> float:
        try:
            v = kind(opts.get(name, default))
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {opts[name]!r}") from None
        if v <= 0:
            raise ConfigError(f"{name} must be > 0, got {v}")
        return v

    gpus = int(number("--gpus", int(os.environ.get("WORLD_SIZE", 1)), int))
    mem = number("--gpu-memory-gb", (device_memory_bytes() or 80 * GiB) / GiB)
    return memory_plan(cfg, gpus, int(mem * GiB))


def resolve(argv: list[str]) -> DictConfig:
    overrides, resume = parse_args(argv)
    if resume:
        return resume_config(resume, overrides)
    return load_config(overrides)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    from pcsd.train.plan import PlanError

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            cfg = resolve(argv)
        if os.environ.get("RANK", "0") == "0":  # once per run, not once per rank
            for w in caught:
                if issubclass(w.category, ConfigWarning):
                    print(f"pcsd.train: warning: {w.message}", file=sys.stderr)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        _, opts = parse_options(argv)
        if "--plan" in opts:  # no model load, no GPU needed
            plan = plan_for(cfg, opts)
            print(plan.render())
            return 0 if plan.fits else 1
        plan = _plan_on_this_gpu(cfg)
        if plan is not None and not plan.fits:
            print(plan.render(), file=sys.stderr)
            raise ConfigError("the memory plan above does not fit this GPU; change the setting it names "
                              "(python -m pcsd.train ... --plan shows the plan without starting)")
    except (ConfigError, PlanError) as exc:
        print(f"pcsd.train: {exc}", file=sys.stderr)
        return 2
    from pcsd.train import distributed as dist_utils

    ctx = dist_utils.init_distributed(device=cfg.run.device)
    try:
        t0 = time.time()
        if not cfg.run.dir:  # every rank must use rank 0's directory name
            cfg.run.dir = dist_utils.broadcast_object(str(make_run_dir(cfg, create=False)), ctx)
        run_dir = make_run_dir(cfg, create=ctx.is_main)
        dist_utils.barrier(ctx)
        if ctx.is_main:
            print(f"[pcsd] run directory: {run_dir}")
            if cfg.run.resume:
                # the run's meaning is unchanged (checked); record this invocation's settings
                (run_dir / f"config.resume-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(
                    OmegaConf.to_yaml(cfg, resolve=True))
            else:
                OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
                if cfg.env.skills_dir is not None:  # what the teacher reads, for pcsd.eval --skills
                    from pcsd.train.job import skill_repository

                    skill_repository(cfg).save(run_dir / "skills")
                if cfg.env.get("template") is not None:  # the prompts' template, for resume and pcsd.eval
                    from pcsd.train.textenv import template_source

                    (run_dir / "template.jinja").write_text(template_source(cfg), encoding="utf-8")
        from pcsd import native_info
        from pcsd.rollout.backends import UnsupportedVLLM
        from pcsd.train.job import train

        if ctx.is_main:
            print(f"[pcsd] native modules: {json.dumps(native_info())}")
        try:
            summary = train(cfg, run_dir, ctx)
        except UnsupportedVLLM as exc:  # the installed vLLM, not the run, is at fault: one line
            print(f"pcsd.train: {exc}", file=sys.stderr)
            return 2
        summary.setdefault("wall_seconds", time.time() - t0)
        if ctx.is_main:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            print(f"[pcsd] summary: {json.dumps(summary)}")
    finally:
        dist_utils.shutdown(ctx)
    return 0


def _plan_on_this_gpu(cfg: DictConfig):
    """The plan of a run about to start on CUDA (None on CPU, or when the shape is unknown)."""
    from pcsd.train.plan import PlanError, device_memory_bytes, memory_plan

    mem = device_memory_bytes()
    if mem is None or cfg.run.device == "cpu":
        return None
    try:
        return memory_plan(cfg, int(os.environ.get("WORLD_SIZE", 1)), mem)
    except PlanError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
