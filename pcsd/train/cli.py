"""``python -m pcsd.train [preset=NAME] [method=NAME] [key=value ...]`` — GRPO + PCSD training.

    python -m pcsd.train                                    # the embedded tiny-cpu default
    python -m pcsd.train preset=alfworld-qwen2.5-3b model.path=/models/Qwen2.5-3B-Instruct method=sdar
    python -m pcsd.train --resume runs/my-run               # continue from the newest checkpoint
    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan  # memory plan per GPU; loads nothing
    python -m pcsd.train preset=alfworld-qwen3-1.7b --plan --gpus 8 --gpu-memory-gb 40
    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan --nodes 2 --gpus 8   # 2 nodes of 8 GPUs
    torchrun --nproc_per_node=4 -m pcsd.train preset=...    # FSDP2 over 4 processes
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
        -m pcsd.train preset=... dist.mesh=hsdp             # on each of 2 nodes (docs/paper-runs.md)

Resolves the configuration (see :mod:`pcsd.train.config`; methods in :mod:`pcsd.train.methods`), creates the
run directory (``run.dir``, printed at start) and locks it for this run (:mod:`pcsd.train.rundir`: a
folder in use is refused; a new run into a non-empty folder is refused unless ``run.overwrite=true``,
which moves the old content to ``<run.dir>.replaced-<time>/``), saves the resolved config there, and
runs the training job. Every run writes ``summary.json`` in its run directory, the warm-up's model
(``sft-model/``) when it ends, and checkpoints under ``checkpoints/`` (every ``run.save_every`` steps
and at the end). ``--resume RUN_DIR`` (or ``run.resume=RUN_DIR``) continues a run from its newest
intact checkpoint (a damaged one is skipped with a warning), else from its saved warm-up, with the
run's saved configuration; overrides that would change the run's meaning are refused.

A bad value or file is one line on stderr and exit status 2, before anything is written to the run
folder: a check that needs what the run makes first (the generated tiny model's tokenizer: the
prompt and response budgets) removes what this new run wrote before it says so, so that the
corrected command starts in the same folder. An environment that fails as a whole (every env of an
evaluation failing at reset) is one line naming the env and its first error. Ctrl-C is one line
with the ``--resume`` command and exit status 130; ``--resume`` removes what an interrupted write
left (``.tmp-*``).

Under torchrun (``WORLD_SIZE`` > 1) the student and the frozen teacher/reference are sharded with
FSDP2 (over several nodes: ``dist.mesh``, :mod:`pcsd.train.distributed`), each rank plays its share
of the task groups, and rank 0 writes every file; every node must see ``run.dir`` (a shared file
system, checked at the start: one line naming the ranks that cannot).

``--plan`` prints the memory plan per GPU (:mod:`pcsd.train.plan`) and exits (status 1 when it does
not fit); ``--gpus`` is the GPUs of one node (torchrun's ``--nproc_per_node``) and ``--nodes`` the
nodes, whose mesh (``dist.mesh``) decides what a GPU keeps; a run on CUDA whose plan does not fit
the GPU stops before loading anything.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from pcsd.train.config import ConfigError, ConfigWarning, DictConfig, load_config, resume_config
from pcsd.train.rundir import RunDirError, claim_run_dir

#: a write that failed for want of space or permission (a full disk while checkpointing, ...)
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def make_run_dir(cfg: DictConfig, create: bool = True) -> Path:
    """``run.dir``, or a new ``runs/<preset>-<method>-<time>`` (``-2``, ``-3``, ... when taken)."""
    if cfg.run.dir:
        path = Path(cfg.run.dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path("runs") / f"{cfg.preset}-{cfg.method}-{stamp}"
        k = 1
        while path.exists():
            k += 1
            path = Path("runs") / f"{cfg.preset}-{cfg.method}-{stamp}-{k}"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


_VALUED = ("--resume", "--gpus", "--gpu-memory-gb", "--nodes")
#: bounds of --plan's inputs (far beyond any machine; values past them make the plan's figures absurd)
MAX_PLAN_GPUS, MAX_PLAN_GPU_GB = 65536, 4096.0
_OPTIONS = "--resume RUN_DIR, --plan [--gpus N] [--nodes M] [--gpu-memory-gb G], -h/--help"


def parse_options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Splits the options (``--resume DIR``, ``--plan``, ``--gpus N``, ``--nodes M``,
    ``--gpu-memory-gb G``, also as ``--opt=value``) from the dotted overrides."""
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


def launch_layout() -> tuple[int, int]:
    """(nodes, processes per node) of this launch, from torchrun's ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE`` (one node of ``WORLD_SIZE`` or 1 without them)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node < 1 or world % per_node:
        return 1, world
    return world // per_node, per_node


def plan_for(cfg: DictConfig, opts: dict[str, str]):
    """The memory plan for ``--nodes`` nodes (default: this launch's, else 1) of ``--gpus`` GPUs
    each (default: ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE`` or 1) of ``--gpu-memory-gb`` GiB (default:
    this machine's first GPU, else 80), with ``dist.mesh``."""
    import math

    from pcsd.train.plan import GiB, device_memory_bytes, memory_plan

    def number(name: str, default: float, kind, limit: float) -> float:
        raw = opts.get(name, default)
        try:
            v = kind(raw)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{name} must be {what}, got {raw!r}") from None
        if not math.isfinite(v):
            raise ConfigError(f"{name} must be a finite number, got {raw!r}")
        if v <= 0:
            raise ConfigError(f"{name} must be > 0, got {v}")
        if v > limit:  # beyond any machine: the plan's arithmetic would mean nothing
            raise ConfigError(f"{name} must be at most {limit:g}, got {v:g}")
        return v

    nodes0, gpus0 = launch_layout()
    gpus = int(number("--gpus", gpus0, int, MAX_PLAN_GPUS))
    nodes = int(number("--nodes", nodes0, int, MAX_PLAN_GPUS))
    if gpus * nodes > MAX_PLAN_GPUS:
        raise ConfigError(f"--nodes x --gpus must be at most {MAX_PLAN_GPUS}, got {nodes} x {gpus}")
    mem = number("--gpu-memory-gb", (device_memory_bytes() or 80 * GiB) / GiB, float, MAX_PLAN_GPU_GB)
    return memory_plan(cfg, gpus * nodes, int(mem * GiB), nodes=nodes)


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
            raise ConfigError(
                "the memory plan above does not fit this GPU; change the setting it names "
                "(python -m pcsd.train ... --plan shows the plan without starting)"
            )
        _check_device(cfg)
    except (ConfigError, PlanError) as exc:
        print(f"pcsd.train: {exc}", file=sys.stderr)
        return 2
    from pcsd.envs.kind import EnvFailure
    from pcsd.models import ModelLoadError, ModelNotFound
    from pcsd.train import distributed as dist_utils
    from pcsd.train.checkpoint import CheckpointError
    from pcsd.train.rundir import check_shared_run_dir, discard_new_run, remove_stale_tmp
    from pcsd.train.update import NonFiniteUpdate

    # errors of the user's input, files or environment, reported in one line (exit status 2); a run that
    # non-finite updates stopped (pcsd.train.update) too
    user_errors = (
        ConfigError,
        RunDirError,
        CheckpointError,
        ModelLoadError,
        ModelNotFound,
        EnvFailure,
        NonFiniteUpdate,
    )
    try:
        ctx = dist_utils.init_distributed(device=cfg.run.device, mesh=cfg.dist.mesh)
    except ValueError as exc:  # the launcher's layout (LOCAL_WORLD_SIZE, LOCAL_RANK): one line
        print(f"pcsd.train: {exc}", file=sys.stderr)
        return 2
    lock = None
    run_dir = None
    try:
        t0 = time.time()
        if not cfg.run.dir:  # every rank must use rank 0's directory name
            cfg.run.dir = dist_utils.broadcast_object(str(make_run_dir(cfg, create=False)), ctx)
        run_dir = make_run_dir(cfg, create=False)
        problem = None
        new_folder = not run_dir.exists()
        if ctx.is_main:  # the folder is this run's alone (pcsd.train.rundir), then the config goes in
            try:
                lock, aside = claim_run_dir(run_dir, resume=bool(cfg.run.resume), overwrite=bool(cfg.run.overwrite))
                if aside is not None:
                    print(f"[pcsd] run.overwrite=true: the old content of {run_dir} was moved to {aside}")
                if cfg.run.resume:  # what a write cut short left (a kill during a save)
                    for gone in remove_stale_tmp(run_dir):
                        print(f"[pcsd] removed {gone}, left by an interrupted write")
                _write_config(cfg, run_dir)
            except RunDirError as exc:
                problem = str(exc)
        problem = dist_utils.broadcast_object(problem, ctx)
        if problem:
            print(f"pcsd.train: {problem}", file=sys.stderr)
            return 2
        check_shared_run_dir(run_dir, ctx)  # several nodes: each sees what rank 0 writes
        if ctx.is_main:
            print(f"[pcsd] run directory: {run_dir}")
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
        except ConfigError:  # a check of the config that needed the run's first files: a new run leaves none
            if ctx.is_main and not cfg.run.resume and lock is not None:
                discard_new_run(run_dir, lock, remove_folder=new_folder)
                lock = None
            raise
        summary.setdefault("wall_seconds", time.time() - t0)
        if ctx.is_main:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            print(f"[pcsd] summary: {json.dumps(summary)}")
    except user_errors as exc:  # one line: what is wrong and where (no traceback)
        if ctx.is_main or not getattr(exc, "all_ranks", False):  # an error every rank raised: said once
            print(f"pcsd.train: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(
            f"pcsd.train: cannot write{where}: {exc.strerror or exc}; the run's complete checkpoints are intact "
            f"(free space or fix the folder, then: python -m pcsd.train --resume {shlex.quote(str(run_dir))})",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        if run_dir is not None and ctx.is_main:
            print(
                f"\npcsd.train: interrupted; continue with python -m pcsd.train --resume {shlex.quote(str(run_dir))}",
                file=sys.stderr,
            )
        return 130
    finally:
        if lock is not None:
            lock.release()
        dist_utils.shutdown(ctx)
    return 0


def _write_config(cfg: DictConfig, run_dir: Path) -> None:
    """A new run's ``config.yaml`` (and its skills folder); a resumed run records this invocation's
    settings beside it (its meaning is unchanged: checked by :func:`resume_config`)."""
    try:
        if cfg.run.resume:
            (run_dir / f"config.resume-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(
                OmegaConf.to_yaml(cfg, resolve=True)
            )
        else:
            OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
            from pcsd.train.job import skill_repository

            skills = skill_repository(cfg, only_if_read=True)
            if skills is not None:  # what the teacher reads, for pcsd.eval --skills
                skills.save(run_dir / "skills")
            from pcsd.envs import registry

            template = registry.get(str(cfg.env.name)).template(cfg)
            if template is not None:  # the prompts' template, for resume and pcsd.eval
                (run_dir / "template.jinja").write_text(template, encoding="utf-8")
    except OSError as exc:
        raise RunDirError(f"run.dir={run_dir}: cannot write there ({exc.strerror or exc})") from None


def _check_device(cfg: DictConfig) -> None:
    """``run.device=cuda`` needs a GPU that torch can use; ``model.attn_impl=flash|flex`` an
    attention that runs on the run's device (``--plan`` plans a GPU run from anywhere: not here)."""
    if cfg.run.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "run.device=cuda, but torch sees no CUDA GPU (torch.cuda.is_available() is false); "
                "use run.device=cpu or run.device=auto"
            )
    from pcsd.models import attention_choice, resolve_device

    try:
        attention_choice(cfg.model.attn_impl, resolve_device(cfg.run.device))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _plan_on_this_gpu(cfg: DictConfig):
    """The plan of a run about to start on CUDA (None on CPU, or when the shape is unknown)."""
    from pcsd.train.plan import PlanError, device_memory_bytes, memory_plan

    mem = device_memory_bytes()
    if mem is None or cfg.run.device == "cpu":
        return None
    try:
        nodes, per_node = launch_layout()
        return memory_plan(cfg, nodes * per_node, mem, nodes=nodes)
    except PlanError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
