"""The training job: rollouts -> scoring -> GRPO + lambda * PCSD update, read top to bottom.

One step (the paper's Algorithm 1):
  1. sample B games, play G rollouts each with the current policy (no skills for the student);
  2. score the sampled response tokens: old policy (student prompt), frozen reference (student
     prompt) and frozen teacher (teacher prompt = skills + student prompt). Teacher and reference
     are ONE frozen copy of the base model scored on two contexts;
  3. group-normalised trajectory advantages; PCSD weights from the teacher-student gaps, per
     response turn (windows never cross a turn);
  4. micro-batches by token budget, loss = GRPO + lambda * L_PCSD, AdamW, gradient clipping;
  5. send the new weights to the generation engine.

Steps 2-4 are :func:`pcsd.train.update.update_step`. The job names no environment: it holds the
env side of the run (:attr:`Job.env`, an :class:`pcsd.envs.kind.EnvRun` of the kind ``env.name``
names, :mod:`pcsd.envs.registry`) and asks it for the tasks of every phase, the pools, the warm-up's
expert episodes and what the kind's results report. :func:`train` runs the job as named phases,
each a function of the :class:`Job` it fills in: :func:`setup` (seeds, checkpoint, games),
:func:`load_student` (the model and the prompt builder; the warm-up's expert episodes first when
the tiny model is generated from their text), :func:`warm_up` (SFT), :func:`build_models`
(frozen copy, sharding, rollout backend, optimizer), :func:`start` (resume state, or the
evaluation before RL), :func:`rl_loop` and :func:`finish` (evaluation after RL, the final model).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from pcsd.envs import registry
from pcsd.eval.run import evaluate, render_table
from pcsd.lora import AdaptersOff, LoraSpec, save_adapter
from pcsd.models import eos_id, load_model, resolve_device, resolve_model_path
from pcsd.ops.estimators import get_estimator
from pcsd.ops.weighting import uses_teacher
from pcsd.progress import ProgressReporter
from pcsd.rollout.backends import make_backend, usable_backend
from pcsd.rollout.loop import collect_rollouts
from pcsd.train import distributed as dist_utils
from pcsd.train.distributed import DistContext, single_process
from pcsd.train.episodes import cut_episodes, open_episode_log, update_record
from pcsd.train.metrics import (
    MetricsLogger,
    StepRecord,
    UpdateStats,
    anchor_fields,
    console_line,
    step_record,
    wandb_settings,
)
from pcsd.train.optim import make_adamw
from pcsd.train.precision import (
    export_model,
    frozen_copy,
    fsdp_policy,
    precision_of,
    prepare_lora_student,
    prepare_student,
    torch_dtype,
)
from pcsd.train.sampling import sample_groups
from pcsd.train.sft import game_corpus, sft_examples, sft_warmup
from pcsd.train.update import NonFiniteUpdate, params_finite, update_step
from pcsd.view import write_run_page

__all__ = ["Job", "train"]

EVAL_SEED = 12345  # rollout seed of the evaluations before and after RL


@dataclass
class Job:
    """Everything one training run holds, filled in phase by phase."""

    cfg: DictConfig
    run_dir: Path
    ctx: DistContext
    console: Any  # rich Console, quiet on every rank but 0
    t_start: float
    summary: dict[str, Any] = field(default_factory=dict)
    ckpt: Any = None  # the checkpoint resumed from (pcsd.train.checkpoint.Checkpoint) or None
    # a resumed run without an RL checkpoint: the saved warm-up's state (RL starts from sft-model/), else None
    warmup_saved: Optional[dict] = None
    # setup: the env side of the run (pcsd.envs.kind.EnvRun: tasks, pools, warm-up) and its task lists
    env: Any = None
    train_games: Sequence = field(default_factory=list)  # the training tasks (game files, seeds, ...)
    eval_games: list = field(default_factory=list)  # the first evaluation's tasks
    eval_split: str = ""
    # load_student / warm_up
    episodes: list = field(default_factory=list)  # the warm-up's expert episodes (rank 0, new runs)
    teacher_episodes: Optional[list] = None  # the skill-following expert's (optim.sft_teacher_demos=skills)
    model_dir: Optional[Path] = None  # the base model (tokenizer source)
    base_dir: Optional[Path] = None  # what RL starts from: the base, or the SFT model
    student: Any = None
    builder: Any = None
    # build_models
    frozen: Any = None  # the frozen base: teacher (teacher prompt) and reference; a copy, or (LoRA) the
    # student with its adapters off (pcsd.lora.AdaptersOff)
    peft: Any = None  # LoRA (model.lora_rank > 0): peft's PeftModel around the student (saving, the adapter switch)
    gen_model: Any = None  # the model the hf backend generates with / save_pretrained's config
    rollout_dtype: str = "float32"  # the generation engine's weights (vLLM; the hf copy under FSDP)
    backend: Any = None
    backend_name: str = ""
    opt: Any = None
    rng: random.Random = field(default_factory=random.Random)  # game sampling
    progress: Any = None
    # start / rl_loop
    before: Optional[dict] = None  # rank 0's evaluation before RL (from the checkpoint when resuming)
    first_step: int = 0
    stopped_at: Optional[int] = None
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase
    gap_recorder: Any = None  # pcsd.train.gaps.GapRecorder with run.record_gaps
    episode_log: Any = None  # pcsd.train.episodes.EpisodeLog (rank 0) with run.log_episodes / log_eval_failures
    nonfinite_in_a_row: int = 0  # RL steps in a row whose update was not applied (not finite)

    @property
    def kind(self) -> Any:
        """The env kind (:class:`pcsd.envs.kind.EnvKind`)."""
        return registry.get(str(self.cfg.env.name))

    @property
    def warm_up_here(self) -> bool:
        """SFT runs on rank 0 with ``optim.sft_steps`` > 0, unless a resumed run has its result
        (an RL checkpoint or the saved warm-up)."""
        return self.cfg.optim.sft_steps > 0 and self.ckpt is None and self.warmup_saved is None and self.ctx.is_main

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def say(self, text: str) -> None:
        self.console.print(f"[pcsd] {text}")


def train(cfg: DictConfig, run_dir: Path, ctx: Optional[DistContext] = None) -> dict[str, Any]:
    """Runs the job in ``run_dir``; with ``cfg.run.resume`` continues from the run's newest
    complete checkpoint. ``ctx`` (default: one process) says which rank this is; all ranks call
    ``train`` and rank 0 writes the files. Returns the summary (rank 0's, broadcast)."""
    job = setup(cfg, run_dir, ctx)
    load_student(job)
    warm_up(job)
    build_models(job)
    start(job)
    rl_loop(job)
    return finish(job)


# ----------------------------------------------------------------------------- phases
def setup(cfg: DictConfig, run_dir: Path, ctx: Optional[DistContext]) -> Job:
    """Seeds, the checkpoint to resume from, the training and evaluation games, the summary."""
    from rich.console import Console

    ctx = ctx or single_process(resolve_device(cfg.run.device))
    # "[pcsd]" is text, not a rich style tag; no wrapping; only rank 0 prints
    job = Job(cfg, run_dir, ctx, Console(quiet=not ctx.is_main, markup=False, soft_wrap=True), time.time())
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    if ctx.distributed and cfg.rollout.tasks_per_step < ctx.world_size:
        raise ValueError(
            f"rollout.tasks_per_step={cfg.rollout.tasks_per_step} must be >= the number of "
            f"ranks ({ctx.world_size}): every rank plays whole groups"
        )
    if cfg.run.resume:
        resume_point(job)
    # the env side: task lists (files under games/ written by rank 0), shops, worker processes
    job.env = job.kind.open(cfg, run_dir, main=ctx.is_main, barrier=lambda: dist_utils.barrier(ctx))
    job.train_games = job.env.train_tasks
    job.eval_games = eval_episodes(job, 0)
    job.eval_split = job.env.split
    job.summary = {
        "preset": cfg.preset,
        "method": cfg.method,
        **({"rule": cfg.rule} if uses_teacher(cfg) else {}),
        "run_dir": str(run_dir),
        "world_size": ctx.world_size,
        "eval_episodes": len(job.eval_games),
    }
    return job


def resume_point(job: Job) -> None:
    """Where a resumed run continues: its newest intact RL checkpoint (damaged ones are skipped
    with a warning, :func:`pcsd.train.checkpoint.load_checkpoint`); without one, RL from step 0
    on the saved warm-up (``sft-model/``); without that either, the run starts over. Rank 0
    decides and checks the files; the other ranks load what it chose."""
    from pcsd.train.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, load_model_dir_state

    ctx, run_dir = job.ctx, job.run_dir
    choice: dict[str, Any] = {"ckpt": None, "warmup": None}
    if ctx.is_main:
        if list_checkpoints(run_dir):
            try:
                job.ckpt = load_checkpoint(run_dir, warn=lambda m: job.say(f"warning: {m}"))
                choice["ckpt"] = str(job.ckpt.path)
            except CheckpointError as exc:
                job.say(f"warning: {exc}")
        if job.ckpt is None and job.cfg.optim.sft_steps > 0:
            try:
                choice["warmup"] = load_model_dir_state(run_dir / "sft-model")
            except CheckpointError as exc:
                job.say(f"warning: {exc}; the warm-up runs again")
    choice = dist_utils.broadcast_object(choice, ctx)
    if choice["ckpt"] is not None:
        _load_chosen_checkpoint(job, Path(choice["ckpt"]))
        job.say(f"resuming from {job.ckpt.path} (step {job.ckpt.step})")
    elif choice["warmup"] is not None:
        job.warmup_saved = choice["warmup"]
        job.say(f"resuming: no RL checkpoint yet; RL starts at step 0 from the saved warm-up {run_dir / 'sft-model'}")
    elif job.cfg.optim.sft_steps > 0:
        job.say("resuming: neither an RL checkpoint nor a finished warm-up; the run starts over with the warm-up")
    else:
        job.say("resuming: no RL checkpoint yet; RL starts at step 0")


def _load_chosen_checkpoint(job: Job, path: Path) -> None:
    """The other ranks load the checkpoint rank 0 checked; a rank that cannot read it (a node that
    does not see the run folder's file system) stops every rank with one line, not a hang."""
    from pcsd.train.checkpoint import CheckpointError, load_checkpoint

    problem = None
    if job.ckpt is None:
        try:
            job.ckpt = load_checkpoint(path, verify=False)
        except (CheckpointError, OSError) as exc:
            problem = f"cannot read the checkpoint rank 0 chose: {exc}"
    problem = dist_utils.agree(problem, job.ctx)
    if problem:
        err = CheckpointError(
            f"{problem} (every node must see run.dir at the same path: a shared file system, docs/paper-runs.md)"
        )
        err.all_ranks = True  # type: ignore[attr-defined]
        raise err


def skill_repository(cfg: DictConfig, only_if_read: bool = False):
    """The teacher's skills from ``env.skills_dir`` (a :class:`pcsd.text.prompts.SkillRepository`),
    or None for the built-in ones; with ``only_if_read``, None too when the method reads no skills
    (its folder is then not checked, :func:`pcsd.train.config.skills_readers`)."""
    from pcsd.text.prompts import SkillRepository
    from pcsd.train.config import resolve_skills_dir, skills_readers

    if cfg.env.get("skills_dir") is None or (only_if_read and not any(skills_readers(cfg))):
        return None
    return SkillRepository(resolve_skills_dir(cfg.env.skills_dir), registry.get(str(cfg.env.name)).prompt)


def load_student(job: Job) -> None:
    """The student model and the prompt builder. Without ``model.path`` the tiny model is
    generated, its tokenizer trained on the text of the warm-up's expert episodes (played first)
    so that every name of the games is one token."""
    from pcsd.text.prompts import PromptBuilder

    cfg, ctx = job.cfg, job.ctx
    kind = job.kind
    if job.warm_up_here:  # the kind's expert on the warm-up's tasks
        t0 = time.time()
        warm = job.env.warmup(cfg.optim.sft_games, skills=skill_repository(cfg, only_if_read=True))
        job.episodes, job.teacher_episodes = warm.episodes, warm.teacher_episodes
        job.summary.update(warm.summary)
        if job.episodes:
            job.summary["sft_expert_success"] = 100.0 * sum(ep.won for ep in job.episodes) / len(job.episodes)
        job.summary["sft_expert_seconds"] = time.time() - t0
    from pcsd.train.config import ConfigError, lora_rank_problem, warmup_problem

    problem = (
        warmup_problem(kind, job.episodes, job.env.demonstrations(job.episodes), cfg) if job.warm_up_here else None
    )
    problem = dist_utils.broadcast_object(problem, ctx)  # rank 0 alone played the expert
    if problem:  # before anything is written (the tiny model, the warm-up's model)
        raise ConfigError(problem)
    if cfg.model.path:  # a folder, or a Hugging Face model id: its snapshot (rank 0 fetches it first)
        if ctx.is_main:
            job.model_dir = resolve_model_path(cfg.model.path)
        dist_utils.barrier(ctx)
        if not ctx.is_main:
            job.model_dir = resolve_model_path(cfg.model.path, download=False)
        assert job.model_dir is not None  # resolved just above, on every rank
        problem = lora_rank_problem(cfg.model.lora_rank, job.model_dir) if cfg.model.lora_rank > 0 else None
        if problem:  # model.path's config could not be read at config read (a model id not fetched yet)
            raise ConfigError(problem)
    else:
        from pcsd.tiny_model import make_tiny_model

        job.model_dir = job.run_dir / "base-model"
        if ctx.is_main and not (job.model_dir / "config.json").exists():
            # heads of 32 dimensions (the smallest vLLM's CPU attention takes): more heads to copy with.
            # The kind's words stay one token each (e.g. WebShop's product ids, as the clickables write them)
            ids = job.env.tokenizer_words()
            corpus = game_corpus(job.episodes, skill_repository(cfg, only_if_read=True), env=kind.prompt)
            corpus += job.env.tokenizer_corpus(job.episodes)  # e.g. without an expert: the envs' first pages
            tmp = job.run_dir / f".tmp-base-model-{os.getpid()}"  # renamed into place when whole
            make_tiny_model(
                tmp,
                hidden_size=cfg.model.tiny_hidden_size,
                num_layers=cfg.model.tiny_layers,
                num_heads=max(1, cfg.model.tiny_hidden_size // 32),
                seed=cfg.run.seed,
                corpus=corpus,
                words=ids,
            )
            if job.model_dir.exists():  # an incomplete one (no config.json), written before writes were atomic
                shutil.rmtree(job.model_dir)
            os.replace(tmp, job.model_dir)
        dist_utils.barrier(ctx)
        job.say(f"tiny model written to {job.model_dir}")
    assert job.model_dir is not None  # set on every rank by either branch
    job.student = load_model(job.model_dir, ctx.device, cfg.model.param_dtype, cfg.model.attn_impl)
    job.say(job.student.pcsd_attention)  # which path the scoring and update passes take (model.attn_impl)
    job.builder = PromptBuilder(
        kind.prompt,
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        tokenizer_dir=job.model_dir,
        enable_thinking=cfg.model.enable_thinking,  # student and teacher prompts alike
        skills=skill_repository(cfg, only_if_read=True),
        template=kind.template(cfg, job.run_dir),
        max_privileged_tokens=cfg.rollout.max_privileged_tokens,
    )
    from pcsd.train.config import prompt_budget_problem, response_budget_problem

    problem = prompt_budget_problem(job.builder, cfg.rollout.max_prompt_tokens)  # the tiny model's tokenizer is new
    if problem is None and job.warm_up_here and cfg.optim.sft_steps > 0:  # the warm-up's targets, tokenized
        problem = response_budget_problem(job.builder, job.env.demonstrations(job.episodes), cfg)
    problem = dist_utils.broadcast_object(problem, ctx)  # rank 0 alone has the warm-up's episodes
    if problem:
        raise ConfigError(problem)
    job.base_dir = job.model_dir


def warm_up(job: Job) -> None:
    """SFT on the expert episodes (so that RL has signal): rank 0 trains and saves the model to
    ``sft-model/``; the other ranks, and a resumed run, load the saved one."""
    from pcsd.train.checkpoint import CheckpointError, save_model_dir

    cfg, ctx = job.cfg, job.ctx
    if cfg.optim.sft_steps <= 0:
        return
    why = job.env.no_expert()
    if why is not None:
        job.say(
            f"warm-up skipped: {why} (optim.sft_steps={cfg.optim.sft_steps} ignored; RL starts from the base model)"
        )
        job.summary["sft_skipped"] = "no expert"
        return
    policy_dir = job.run_dir / "sft-model"
    if job.warm_up_here:
        t0 = time.time()
        episodes = job.env.demonstrations(job.episodes)
        examples = sft_examples(
            job.builder,
            episodes,
            eos_id(job.builder),
            teacher_share=cfg.optim.sft_teacher_share,
            seed=cfg.run.seed,
            teacher_episodes=job.teacher_episodes,
        )
        losses = sft_warmup(
            job.student,
            examples,
            steps=cfg.optim.sft_steps,
            lr=cfg.optim.sft_lr,
            batch_size=cfg.optim.sft_batch_size,
            seed=cfg.run.seed,
            prompt_weight=cfg.optim.sft_prompt_weight,
            schedule=cfg.optim.sft_schedule,
            tokens_per_pass=cfg.optim.tokens_per_microbatch,
            progress=lambda s, n, l: job.say(f"sft {s}/{n} loss {l:.3f}") if s % 25 == 0 else None,
        )
        job.summary["sft_examples"] = len(examples)
        job.summary["sft_loss_first_last"] = [losses[0], losses[-1]]
        job.summary["sft_seconds"] = time.time() - t0
        # the warm-up's result, written atomically with checksums: --resume continues from it
        save_model_dir(
            policy_dir,
            job.student,
            tokenizer_dir=job.model_dir,
            extra={"summary": {k: v for k, v in job.summary.items() if k.startswith("sft_")}},
        )
        job.say(f"warm-up saved to {policy_dir}")
    dist_utils.barrier(ctx)
    job.base_dir = policy_dir
    if job.ckpt is not None or job.warmup_saved is not None or not ctx.is_main:
        if not (policy_dir / "config.json").is_file():
            raise CheckpointError(f"{policy_dir}: the warm-up's model of this run is missing")
        job.student = load_model(policy_dir, ctx.device, cfg.model.param_dtype, cfg.model.attn_impl)
        if job.warmup_saved is not None:  # what the summary said about the warm-up
            job.summary.update(job.warmup_saved.get("summary", {}))


def build_models(job: Job) -> None:
    """The frozen base (teacher and reference), sharding, the rollout backend, the optimizer.
    Precision (:mod:`pcsd.train.precision`): the student keeps ``model.param_dtype`` weights (and
    so AdamW state) and computes in ``model.compute_dtype``; the frozen copy is cast to
    ``model.teacher_dtype``; vLLM runs in the compute dtype (float32 on CPU). With LoRA
    (``model.lora_rank`` > 0, :mod:`pcsd.lora`) no copy is made: the base weights are frozen in the
    compute dtype, the adapters train in ``model.param_dtype``, and the frozen base is the student
    with its adapters off."""
    cfg, ctx = job.cfg, job.ctx
    prec = precision_of(cfg)
    spec = LoraSpec.of(cfg.model)
    job.backend_name = usable_backend(cfg.rollout.backend, job.console.print)
    job.rollout_dtype = "float32" if ctx.device.type == "cpu" else prec.compute
    # sharded training: the hf backend generates with a full copy (compute dtype) refreshed after
    # every update; with vLLM a CPU copy only carries the HF config for save_pretrained of gathered weights
    # (a plain model: LoRA's merged weights are streamed into it under the base model's names)
    job.gen_model = job.student
    if ctx.distributed:
        job.gen_model = frozen_copy(job.student, job.rollout_dtype)
        if job.backend_name == "vllm":
            job.gen_model = job.gen_model.to("cpu")
    if spec.on:
        try:
            job.peft = prepare_lora_student(job.student, prec, spec, ctx.distributed)
        except ValueError as exc:  # targets the model does not have
            from pcsd.train.config import ConfigError

            raise ConfigError(str(exc)) from None
        job.frozen = AdaptersOff(job.peft)
        n_train = sum(p.numel() for p in job.student.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in job.student.parameters())
        job.say(f"LoRA rank {spec.rank}: {n_train:,} trained parameters of {n_all:,}; the teacher is the base")
    else:
        job.frozen = frozen_copy(job.student, prec.teacher)
        prepare_student(job.student, prec, ctx.distributed)
    if cfg.optim.gradient_checkpointing:  # each decoder layer recomputed in the backward
        job.student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    dist_utils.shard_model(job.student, ctx, mp_policy=fsdp_policy(prec))
    if job.peft is None:
        dist_utils.shard_model(job.frozen, ctx)
    if job.backend_name == "vllm":
        job.backend = make_backend(
            "vllm",
            model_path=job.base_dir,
            dtype=job.rollout_dtype,
            seed=cfg.run.seed,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens,
            rank=ctx.rank,
            world_size=ctx.world_size,
            local_rank=ctx.local_rank,
        )
    else:
        job.backend = make_backend("hf", model=job.gen_model, pad_token_id=eos_id(job.builder))
    job.summary["backend"] = job.backend_name
    job.say(f"rollout backend: {job.backend_name}")
    job.progress = ProgressReporter(cfg.run.progress and ctx.is_main, console=job.console)
    job.opt = make_adamw(  # fused on CUDA (no parameter-sized temporary at the step), see pcsd.train.optim
        [p for p in job.student.parameters() if p.requires_grad],
        lr=cfg.optim.lr,
        weight_decay=cfg.optim.weight_decay,
        device=ctx.device,
    )
    job.rng = random.Random(cfg.run.seed)
    if cfg.run.get("record_gaps", False):
        from pcsd.train.gaps import GapRecorder

        job.gap_recorder = GapRecorder(job.run_dir, cfg.rule, cfg.run.log_every, rank=ctx.rank)
    job.episode_log = open_episode_log(job)


def sync_generation_weights(job: Job) -> None:
    """Sends the student's weights to the generation engine in the engine's dtype, streamed in
    buckets of ``rollout.sync_bucket_mb`` (:func:`pcsd.train.distributed.iter_weights`: device to
    device, a tied lm-head cast once, gathered from the shards bucket by bucket under FSDP2, where
    every rank refreshes its own engine). The hf backend on one process generates with the student
    itself."""
    if not (job.ctx.distributed or job.backend_name == "vllm"):
        return
    job.backend.load_weights(
        dist_utils.iter_weights(
            job.student, job.ctx, torch_dtype(job.rollout_dtype), int(job.cfg.rollout.sync_bucket_mb * 2**20)
        )
    )


def release_device_memory() -> None:
    """Returns what torch's caching allocator holds but no tensor uses (the update's peak) to the
    device, so that a generation engine waking up next can have it."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def refresh_generation(job: Job) -> None:
    """After the update, with the engine asleep: the gradients (the optimizer has applied them) and
    the allocator's cache are released, then the engine wakes its weights, gets the new ones and
    only then wakes its KV cache, so the update's peak, the weights and the cache never add up
    (the order verl's and TRL's colocated vLLM use)."""
    job.opt.zero_grad(set_to_none=True)
    release_device_memory()
    job.backend.wake(("weights",))
    sync_generation_weights(job)
    job.backend.wake(("kv_cache",))


def eval_episodes(job: Job, index: int) -> list:
    """The tasks of validation number ``index`` (0 = before RL), the kind's (``eval.protocol``:
    ``full``, the same list every time; ``paper``, the draw verl-agent's validation ``index`` makes
    with ``env.seed = run.seed``)."""
    return job.env.eval_tasks(index)


def validation_index(cfg: DictConfig, step: int) -> int:
    """Which validation a step's evaluation is: ``step // eval.every`` (verl-agent validates before
    training and every ``test_freq`` steps); without ``eval.every``, 0 before RL and 1 after."""
    return step // cfg.eval.every if cfg.eval.every else int(step > 0)


def _evaluate(job: Job, label: str, bar: str, step: int = 0) -> dict:
    index = validation_index(job.cfg, step)
    sink = job.episode_log.eval_sink() if job.episode_log is not None else None  # its failed episodes
    out = evaluate(
        job.backend,
        job.builder,
        eval_episodes(job, index),
        job.cfg,
        seed=EVAL_SEED,
        label=label,
        split=job.eval_split,
        progress=job.progress.rollout(bar),
        pools=job.env.eval_pools,
        on_batch=sink,
    )
    if sink is not None:
        job.episode_log.log_eval(label, step, sink)
    out["settings"].update(validation_index=index, draw_seed=job.cfg.run.seed)
    return out


def start(job: Job) -> None:
    """A resumed run restores the weights, the optimizer, the summary and the metrics up to its
    checkpoint; a new run evaluates the policy before RL."""
    ctx, ckpt = job.ctx, job.ckpt
    job.progress.start()
    if ckpt is None:
        if ctx.is_main and job.cfg.run.resume:  # RL starts over: the records of the attempt before go
            _cut_records(job, -1)
        if ctx.is_main and job.cfg.eval.before:
            job.before = _evaluate(job, "before RL", "eval before")
            job.say(f"success before RL: {_result_text(job, job.before)}")
            job.summary["success_before"] = job.before["overall"]
            job.summary.update(job.kind.summary_fields(job.before, "before"))
            job.summary["success_before_per_task"] = job.before["per_task"]
        job.summary = dist_utils.broadcast_object(job.summary, ctx)
        return
    from pcsd.train.checkpoint import restore_rng

    if job.peft is not None:  # the adapters, named as peft saves them
        from pcsd.lora import from_peft_names

        dist_utils.load_full_state(
            job.student, job.opt, from_peft_names(ckpt.model_state), ckpt.optimizer_state, ctx, trainable_only=True
        )
    else:
        dist_utils.load_full_state(job.student, job.opt, ckpt.model_state, ckpt.optimizer_state, ctx)
    sync_generation_weights(job)
    job.summary.update(ckpt.state.get("summary", {}))
    job.before = ckpt.state.get("eval_before")
    job.summary["world_size"] = ctx.world_size
    job.first_step = ckpt.step
    if ctx.is_main:  # drop records written after the checkpoint
        _cut_records(job, job.first_step)
    if ckpt.state.get("torch_threads") not in (None, torch.get_num_threads()):
        job.say(
            f"note: the checkpoint was written with {ckpt.state['torch_threads']} torch threads, this "
            f"process has {torch.get_num_threads()}: CPU results may differ in the last bits"
        )
    restore_rng(ckpt.rng, {"games": job.rng})  # every RNG exactly as the uninterrupted run had it


def _cut_records(job: Job, last_step: int) -> None:
    """Keeps the lines of ``metrics.jsonl``, ``evals.jsonl`` and ``env_errors.jsonl`` up to step ``last_step``
    (-1: none);
    a line cut short by a crash is dropped."""

    def step_of(line: str) -> float:
        try:
            return json.loads(line).get("step", 0)
        except ValueError:
            return float("inf")

    for path in (job.metrics_path, job.run_dir / "evals.jsonl", job.run_dir / "env_errors.jsonl"):
        if path.exists():
            keep = [ln for ln in path.read_text().splitlines() if ln.strip() and step_of(ln) <= last_step]
            path.write_text("".join(ln + "\n" for ln in keep))
    cut_episodes(job.run_dir, last_step)


def save(job: Job, done: int) -> None:
    """A checkpoint after ``done`` steps (collective under FSDP; rank 0 writes). A LoRA run's holds
    the adapters (peft's format) and their optimizer state, never the frozen base."""
    from pcsd.train.checkpoint import capture_rng, save_checkpoint

    ctx = job.ctx
    lora = job.peft is not None
    if not params_finite(job.student, ctx):  # never a checkpoint of non-finite weights (agreed on every rank)
        raise NonFiniteUpdate(f"the checkpoint after step {done} is not written: the model has non-finite parameters")
    model_state = dist_utils.full_model_state(job.student, ctx, trainable_only=lora)
    optim_state = dist_utils.full_optimizer_state(job.student, job.opt, ctx)
    if ctx.is_main:
        path = save_checkpoint(
            job.run_dir,
            done,
            AdapterWriter(job.peft, _base_path(job)) if lora else job.gen_model if ctx.distributed else job.student,
            optim_state,
            capture_rng({"games": job.rng}),
            config_yaml=OmegaConf.to_yaml(job.cfg, resolve=True),
            state={"summary": job.summary, "eval_before": job.before, "torch_threads": torch.get_num_threads()},
            model_state=model_state if (ctx.distributed or lora) else None,
            tokenizer_dir=job.model_dir,
            keep_last=job.cfg.run.keep_last,
        )
        job.say(f"checkpoint {path}")
    dist_utils.barrier(ctx)


def _base_path(job: Job) -> str:
    """The base model a LoRA run's adapters belong to (an adapter folder's ``base_model_name_or_path``):
    ``model.path`` as given when it is a model id, else the folder, absolute."""
    assert job.base_dir is not None
    spec = str(job.cfg.model.path or "")
    if job.base_dir == job.model_dir and spec and not Path(spec).exists():
        return spec  # a Hugging Face model id
    return str(Path(job.base_dir).resolve())


class AdapterWriter:
    """What :func:`pcsd.train.checkpoint.save_checkpoint` calls for a LoRA run's ``model/``:
    ``save_pretrained(dir, state_dict=...)`` writing the adapter in peft's format, its
    ``adapter_config.json`` naming the base model."""

    def __init__(self, peft_model: Any, base: str):
        self.peft, self.base = peft_model, base

    def save_pretrained(self, out_dir, state_dict=None, **kw: Any) -> None:
        save_adapter(self.peft, out_dir, self.base, state=state_dict, **kw)


def rollout_seed(job: Job, step: int, batch: int = 0) -> int:
    """The rollout seed of batch ``batch`` of RL step ``step`` on this rank: ``(run.seed * 100_000 +
    step) * ranks + rank`` for the step's first batch; a hash of that and ``batch`` for the further
    batches dynamic sampling plays (56 bits: never another step's first seed by construction)."""
    ctx = job.ctx
    base = (job.cfg.run.seed * 100_000 + step) * ctx.world_size + ctx.rank
    if batch == 0:
        return base
    import hashlib

    return int.from_bytes(hashlib.blake2b(f"{base}/{batch}".encode(), digest_size=7).digest(), "little")


def play_batch(job: Job, step: int, batch: int = 0, played: Optional[list] = None):
    """This rank's share (whole groups) of the games of batch ``batch`` of step ``step``, played
    (the games: the kind's draw, :meth:`pcsd.envs.kind.EnvRun.step_tasks`; ``played`` gets this
    rank's games, one per group, in the batch's order)."""
    cfg, ctx, rb_builder = job.cfg, job.ctx, job.builder
    games = job.env.step_tasks(step, job.rng, batch)
    mine = dist_utils.split_groups(len(games), ctx)  # whole groups per rank
    if played is not None:
        played += games[mine.start : mine.stop]
    return collect_rollouts(
        job.backend,
        rb_builder,
        games[mine.start : mine.stop],
        cfg.rollout.group_size,
        max_steps=cfg.env.max_steps,
        max_response_tokens=cfg.rollout.max_response_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        seed=rollout_seed(job, step, batch),
        stop_token_ids=[eos_id(rb_builder)],
        success_reward=cfg.algo.success_reward,
        invalid_action_penalty=cfg.rollout.invalid_action_penalty,
        student_skills=cfg.algo.student_skills,
        num_threads=cfg.env.num_threads,
        progress=job.progress.rollout("rollout"),
        pools=job.env.train_pools,
        teacher_context=cfg.algo.get("teacher_context", "env"),
        teacher_context_tokens=cfg.algo.get("teacher_context_tokens", 1024),
    )


def rl_step(job: Job, step: int) -> StepRecord:
    """One RL step: rollouts on this rank's share of the sampled games (with
    ``rollout.dynamic_sampling``, batches until enough groups carry a signal:
    :mod:`pcsd.train.sampling`), the update, the weight sync. Returns the step's metrics record
    (batch totals over every rank; rollout figures over every episode played). A step dynamic
    sampling leaves without a group trains nothing (its record has no update: ``skipped``, the
    rule of :class:`pcsd.train.metrics.StepRecord`) and still counts."""
    cfg, ctx = job.cfg, job.ctx
    t0 = time.time()
    played: list = []  # this rank's games of every batch played, one per group, in the batches' order
    sampled = sample_groups(
        lambda b: play_batch(job, step, b, played),
        target=cfg.rollout.tasks_per_step,
        max_batches=cfg.rollout.max_sample_batches,
        dynamic=bool(cfg.rollout.dynamic_sampling),
        ctx=ctx,
        report=lambda line: job.say(f"step {step + 1}: {line}"),
    )
    if sampled.warning:
        job.say(f"warning: step {step + 1}: {sampled.warning}")
    st: Optional[UpdateStats] = None  # a skipped step trains nothing: no update fields (StepRecord's rule)
    t_sync = time.time()
    if not sampled.skipped:
        job.backend.sleep()  # the rollouts are done: the engine's memory goes to the update
        st = update_step(
            job.student,
            job.frozen,
            job.opt,
            sampled.train,
            cfg,
            step,
            ctx,
            progress=job.progress.phase,
            record=update_record(job, step + 1),
        )
        t_sync = time.time()
        refresh_generation(job)
        _count_nonfinite(job, step, st)
    rb = sampled.played
    if job.episode_log is not None:  # run.log_episodes: the step's episodes, with the update's token values
        job.episode_log.log_step(step + 1, sampled.train, rb)
    rec = step_record(step + 1, rb, st, sync_seconds=time.time() - t_sync, step_seconds=time.time() - t0)
    # GiGPO's anchor groups, of the groups the step trained on (what the estimator read)
    anchored = get_estimator(cfg.algo.get("estimator", "grpo")).needs_anchor  # the same on every rank
    counts = sampled.anchor_counts() if anchored else (0, 0, 0)
    rec.fields.update(sampled.metrics())
    rec.fields.update(job.kind.step_fields(rb))  # the kind's figures of the batch (WebShop's Score, env errors)
    _report_env_errors(job, step, played, rb)
    if ctx.distributed:  # the batch's totals over every rank (per-category success: this rank's)
        # every rank holds whole task groups, so their anchor groups add up too
        n_traj, r_sum, won_sum, len_sum, n_rows, valid_sum, a_rows, a_groups, a_shared = dist_utils.global_sum(
            [
                rb.num_trajectories,
                float(rb.reward.sum()),
                float(rb.won.float().sum()),
                float(rb.length.float().sum()),
                rb.num_rows,
                float(rb.action_valid.float().sum()),
                *counts,
            ],
            ctx,
        )
        rec.rollout["reward"] = r_sum / max(n_traj, 1)
        rec.rollout["success"] = 100.0 * won_sum / max(n_traj, 1)
        rec.rollout["turns"] = len_sum / max(n_traj, 1)
        rec.rollout["valid_actions"] = valid_sum / max(n_rows, 1)
        counts = (int(a_rows), int(a_groups), int(a_shared))
    if anchored:
        rec.fields.update(anchor_fields(*counts))
    return rec


def _count_nonfinite(job: Job, step: int, st: UpdateStats) -> None:
    """One line for an update not applied (its loss or gradient norm not finite,
    :func:`pcsd.train.update.train_epochs`), counted in the summary; ``optim.max_nonfinite_updates``
    such steps in a row stop the run (:func:`rl_loop`, after the step's metrics line)."""
    if not st["nonfinite_updates"]:
        job.nonfinite_in_a_row = 0
        return
    job.nonfinite_in_a_row += 1
    job.summary["nonfinite_updates"] = job.summary.get("nonfinite_updates", 0) + st["nonfinite_updates"]
    n, passes = st["nonfinite_updates"], job.cfg.optim.ppo_epochs
    which = "the update was" if n == passes else f"{n} of the update's {passes} passes were"
    job.say(
        f"warning: step {step + 1}: {which} not applied: loss {st['loss']:.3g}, gradient norm {st['grad_norm']:.3g} "
        f"({job.nonfinite_in_a_row} in a row; the run stops at optim.max_nonfinite_updates="
        f"{job.cfg.optim.max_nonfinite_updates})"
    )


def rl_loop(job: Job) -> None:
    """The RL steps with their metrics and checkpoints; on rank 0 of a run that was not stopped
    early, the evaluation after RL, the table and the plots."""
    cfg, ctx = job.cfg, job.ctx
    job.phases = {"sft": float(job.summary.get("sft_seconds", 0.0))}
    with (
        MetricsLogger(job.run_dir, tensorboard=cfg.run.tensorboard, wandb=wandb_settings(cfg))
        if ctx.is_main
        else contextlib.nullcontext(None)
    ) as metrics:
        if job.episode_log is not None:
            job.episode_log.attach(metrics)  # the episode tables go to TensorBoard / W&B too
        if metrics is not None and job.ckpt is None and job.before is not None:
            metrics.log_eval("before", job.before, step=0)
        for step in range(job.first_step, cfg.optim.steps):
            rec = rl_step(job, step)
            done = step + 1
            val = None
            if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.optim.steps and ctx.is_main:
                val = _evaluate(job, f"step {done}", "validation", step=done)  # periodic validation
                rec.fields.update(job.kind.validation_fields(val))
                rec.fields.update(
                    val_success=val["overall"],
                    **{f"val_success/{c}": v for c, v in val["per_category"].items() if v is not None},
                )
            if metrics is not None:
                metrics.log(rec.line())
                if val is not None:
                    metrics.log_eval(f"step {done}", val, step=done)
                    job.say(f"validation at step {done}: {val['overall']:.1f}% {val['per_category']}")
            for ph in ("rollout", "score", "update", "weight_sync"):
                job.phases[ph] = job.phases.get(ph, 0.0) + rec.seconds(ph)
            job.say(console_line(rec, cfg.optim.steps, uses_teacher(cfg)))
            if job.nonfinite_in_a_row >= cfg.optim.max_nonfinite_updates:
                raise NonFiniteUpdate(
                    f"stopped at step {done}: {job.nonfinite_in_a_row} updates in a row had a loss or gradient norm "
                    f"that is not finite (optim.max_nonfinite_updates={cfg.optim.max_nonfinite_updates}); none was "
                    f"applied, the checkpoints hold finite weights (lower optim.lr or the reward scales)"
                )
            stop = bool(cfg.run.stop_after) and done >= cfg.run.stop_after and done < cfg.optim.steps
            if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.optim.steps or stop:
                save(job, done)
            if stop:
                job.stopped_at = done
                break
        if job.stopped_at is None and metrics is not None:  # rank 0
            after = _evaluate(job, "after RL", "eval after", step=cfg.optim.steps)
            metrics.log_eval("after", after, step=cfg.optim.steps)
            job.say(f"success after RL: {_result_text(job, after)}")
            job.summary.update(success_after=after["overall"], success_after_per_task=after["per_task"])
            job.summary.update(job.kind.summary_fields(after, "after"))
            table = render_table([e for e in (job.before, after) if e is not None])
            (job.run_dir / "eval.md").write_text(table)
            (job.run_dir / "eval.json").write_text(json.dumps(dict(before=job.before, after=after), indent=2))
            job.console.print(table, soft_wrap=True)
            plots = metrics.plot()
            job.say(f"plots: {', '.join(str(p) for p in plots)}; TensorBoard: {job.run_dir / 'tensorboard'}")
        job.progress.stop()


def finish(job: Job) -> dict[str, Any]:
    """Closes the backend and writes ``final-model/``; returns the summary (broadcast)."""
    cfg, ctx = job.cfg, job.ctx
    job.backend.close()
    job.env.close()  # e.g. the Python envs' worker processes
    if ctx.is_main:
        write_run_page(job.run_dir, job.say)  # python -m pcsd.view: the run's episodes page
    if job.stopped_at is not None:
        job.say(
            f"stopped after step {job.stopped_at} (run.stop_after); continue with "
            f"python -m pcsd.train --resume {shlex.quote(str(job.run_dir))}"
        )
        job.summary.update(
            steps=job.stopped_at,
            stopped_after=job.stopped_at,
            success_after=None,
            wall_seconds=time.time() - job.t_start,
        )
        return job.summary
    write_final_model(job)
    job.summary.update(
        steps=cfg.optim.steps,
        wall_seconds=time.time() - job.t_start,
        phase_seconds={k: round(v, 2) for k, v in job.phases.items()},
    )
    return dist_utils.broadcast_object(job.summary, ctx)


def write_final_model(job: Job) -> None:
    """``final-model/`` in ``model.export_dtype`` (the checkpoints keep the fp32 master weights); a
    LoRA run's is the merged model (``W + B A alpha / r`` per targeted layer), and ``final-adapter/``
    holds the adapter in peft's format (with the tokenizer files), naming its base model.
    Collective under FSDP; rank 0 writes."""
    cfg, ctx = job.cfg, job.ctx
    if job.peft is not None:
        merged = dist_utils.merged_model_state(job.student, ctx, torch_dtype(cfg.model.export_dtype))
        adapter = dist_utils.full_model_state(job.student, ctx, trainable_only=True)
        if ctx.is_main:
            export_model(job.gen_model, job.run_dir / "final-model", cfg.model.export_dtype, state_dict=merged)
            out = save_adapter(job.peft, job.run_dir / "final-adapter", _base_path(job), state=adapter)
            _copy_tokenizer(job.model_dir, out)
            job.say(f"merged model: {job.run_dir / 'final-model'}; adapter: {out}")
        return
    final_state = dist_utils.full_model_state(job.student, ctx)
    if ctx.is_main:
        m = job.gen_model if ctx.distributed else job.student
        export_model(
            m, job.run_dir / "final-model", cfg.model.export_dtype, state_dict=final_state if ctx.distributed else None
        )


def _copy_tokenizer(src: Optional[Path], dst: Path) -> None:
    from pcsd.train.checkpoint import copy_tokenizer_files

    if src is not None:
        copy_tokenizer_files(src, dst)


def _result_text(job: Job, result: dict) -> str:
    """An evaluation on the console: Success, then the kind's figures (per category, Score, mean reward)."""
    per = result.get("per_category")
    return f"{result['overall']:.1f}%" + (f" {per}" if per else "") + job.kind.describe_result(result)


def _report_env_errors(job: Job, step: int, tasks: Sequence, rb: Any) -> None:
    """One console line per step with env errors (how many, the first message) and one
    ``env_errors.jsonl`` line per error in the run folder (rank 0): RL step, env, task (its seed,
    game or goal), the episode's step and the message."""
    errors = [(e, m) for e, m in enumerate(getattr(rb, "env_error", None) or []) if m]
    if not errors:
        return
    group = int(rb.traj_group[errors[0][0]])
    job.say(
        f"step {step + 1}: {len(errors)} env error(s) ended their episodes; the first, env {errors[0][0]} "
        f"(task {tasks[group]}): {errors[0][1]} (all: {job.run_dir / 'env_errors.jsonl'})"
    )
    if not job.ctx.is_main:
        return
    with open(job.run_dir / "env_errors.jsonl", "a", encoding="utf-8") as f:
        for e, message in errors:
            task = tasks[int(rb.traj_group[e])]
            f.write(
                json.dumps(
                    dict(
                        step=step + 1,
                        env=e,
                        seed=task if isinstance(task, int) else str(task),
                        episode_step=int(rb.env_error_step[e]) if rb.env_error_step else None,
                        message=message,
                    )
                )
                + "\n"
            )
