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
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from pcsd import distributed as dist_utils
from pcsd.distributed import DistContext, single_process
from pcsd.eval import evaluate, render_table
from pcsd.grpo import group_advantages, grpo_token_terms, token_coefficients
from pcsd.losses import pcsd_loss
from pcsd.metrics import MetricsLogger, step_record
from pcsd.progress import ProgressReporter
from pcsd.rollout.backends import make_backend, usable_backend
from pcsd.rollout.loop import RolloutBatch, collect_rollouts
from pcsd.scoring import score_packed
from pcsd.sft import expert_episodes, game_corpus, sft_examples, sft_warmup
from pcsd.weighting import get_rule

log = logging.getLogger("pcsd.train")

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")


# ----------------------------------------------------------------------------- games
def procedural_games(out_dir: Path, count: int, seed: int, task_types=None, **knobs) -> list[str]:
    """Writes ``count`` procedural games (task types in rotation, seeds from ``seed``; ``None``:
    all six in the paper's column order)."""
    from pcsd.envs.procedural import write_games

    return write_games(out_dir, count, seed, tuple(task_types or TASK_TYPES), **knobs)


def procedural_knobs(cfg: DictConfig) -> dict[str, Any]:
    """The generator's knobs set in the config (``env.receptacles``, ``env.distractors``,
    ``env.task_types``, ``env.rooms``) as keyword arguments of :func:`procedural_games`."""
    kw: dict[str, Any] = {k: int(cfg.env[k]) for k in ("receptacles", "distractors") if cfg.env.get(k) is not None}
    if cfg.env.get("task_types") is not None:
        kw["task_types"] = tuple(cfg.env.task_types)
    if cfg.env.get("rooms") is not None:
        kw["rooms"] = tuple(cfg.env.rooms)
    return kw


def split_games(split: str) -> list[str]:
    root = os.environ.get("ALFWORLD_DATA")
    if not root:
        raise FileNotFoundError("env.source=files needs ALFWORLD_DATA (the folder holding json_2.1.1/)")
    base = Path(root) / "json_2.1.1" / split
    games = sorted(str(p) for p in base.glob("*/*/game.tw-pddl"))
    if not games:
        raise FileNotFoundError(f"no game.tw-pddl files under {base}")
    return games


# ----------------------------------------------------------------------------- model
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_model(path: str | Path, device: torch.device, dtype: str = "auto"):
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model.path={p}: no config.json there (expected a HF checkpoint directory)")
    cfg = AutoConfig.from_pretrained(p)
    if not any(a.endswith("ForCausalLM") for a in (cfg.architectures or [])):
        raise ValueError(f"model.path={p} is not a causal LM (architectures: {cfg.architectures})")
    torch_dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    kwargs = {}
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            # varlen flash attention over packed sequences (position ids restart per sequence)
            kwargs["attn_implementation"] = "flash_attention_2"
    return AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, **kwargs).to(device)


# ----------------------------------------------------------------------------- SFT warm-up
def eos_id(builder) -> int:
    ids = builder.tokenizer.encode("<|im_end|>")
    if len(ids) != 1:
        raise ValueError("the tokenizer has no single <|im_end|> token (ChatML models only)")
    return ids[0]


# ----------------------------------------------------------------------------- one update
def microbatches(rb: RolloutBatch, budget: int) -> list[list[int]]:
    """Rows grouped greedily in order into micro-batches of at most ``budget`` prompt+response
    tokens (a longer row is a micro-batch of its own); rows without response tokens are left out."""
    mbs, cur, size = [], [], 0
    for i, (p, r) in enumerate(zip(rb.prompt_ids, rb.response_ids)):
        if not r:
            continue
        n = len(p) + len(r)
        if cur and size + n > budget:
            mbs.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        mbs.append(cur)
    return mbs


_PAD_ROW = ([0], [0])  # a 2-token sequence for the padding passes of ranks with fewer micro-batches


def _mb_logprobs(model, prompts, responses, rows: Optional[list[int]]) -> torch.Tensor:
    """One packed forward pass over ``rows`` (None: a padding pass), log-probs of the responses."""
    if rows is None:
        return torch.cat(score_packed(model, [_PAD_ROW[0]], [_PAD_ROW[1]]))
    ps, rs = [prompts[i] for i in rows], [responses[i] for i in rows]
    return torch.cat(score_packed(model, ps, rs, max_tokens_per_pass=sum(len(p) + len(r) for p, r in zip(ps, rs))))


def _device(model) -> torch.device:
    return next(model.parameters()).device  # a DTensor's device under FSDP


def scores(model, prompts, responses, mbs: list[list[int]], n_passes: int, T: int) -> torch.Tensor:
    """``[T]`` float32 log-probs of every packed response token, one forward per micro-batch,
    padded to ``n_passes`` forwards (FSDP: every rank runs the same number of passes)."""
    out = torch.zeros(T, device=_device(model))
    offsets = [0]
    for r in responses:
        offsets.append(offsets[-1] + len(r))
    with torch.no_grad():
        for k in range(n_passes):
            rows = mbs[k] if k < len(mbs) else None
            lp = _mb_logprobs(model, prompts, responses, rows).float()
            if rows is not None:
                idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(out.device)
                out[idx] = lp
    return out


def update_step(student, frozen, opt, rb: RolloutBatch, cfg: DictConfig, step: int,
                ctx: Optional[DistContext] = None, progress=None) -> dict:
    """Scores the batch and applies one GRPO + lambda * PCSD update (ppo_epochs passes).

    ``progress(name, total)`` (e.g. :meth:`pcsd.progress.ProgressReporter.phase`) may return a
    ``cb(done, total)`` that is called after each scoring pass and each micro-batch.

    Distributed (``ctx`` with world_size > 1, FSDP2-sharded ``student``/``frozen``): ``rb`` holds
    this rank's whole groups; the loss normalisers (trajectory count, valid-token count) are
    summed over ranks so that the summed gradient is the one-process gradient of the whole batch.
    """
    ctx = ctx or single_process()
    algo = cfg.algo
    budget = cfg.optim.tokens_per_microbatch
    rule = get_rule(cfg.rule)
    T = rb.num_tokens()
    mbs = microbatches(rb, budget)
    n_passes = dist_utils.global_max(len(mbs), ctx)  # every rank runs as many forwards (FSDP)
    t0 = time.perf_counter()
    student.eval()
    need_ref = algo.grpo and algo.kl_beta > 0
    use_teacher = algo.distill or rule.kind == "advantage"
    # one PPO epoch: the parameters do not change before the update's own forward pass, so that
    # pass gives log pi_old exactly (ratio 1) and a separate scoring pass of the student is skipped
    reuse_old = cfg.optim.ppo_epochs == 1
    n_score = int(not reuse_old) + int(need_ref) + int(use_teacher)
    score_cb = progress("scoring", n_score) if progress and n_score else None
    done_passes = 0
    old = None
    if not reuse_old:
        old = scores(student, rb.prompt_ids, rb.response_ids, mbs, n_passes, T)  # log pi_old, student prompt
        done_passes += 1
        score_cb and score_cb(done_passes, n_score)
    ref = scores(frozen, rb.prompt_ids, rb.response_ids, mbs, n_passes, T) if need_ref else None
    done_passes += int(need_ref)
    score_cb and need_ref and score_cb(done_passes, n_score)
    teacher_model = student if algo.teacher == "current" else frozen
    teacher = (scores(teacher_model, rb.teacher_prompt_ids, rb.response_ids, mbs, n_passes, T)
               if use_teacher else None)
    score_cb and use_teacher and score_cb(n_score, n_score)
    t_score = time.perf_counter() - t0

    dev = _device(student)  # every per-token tensor lives beside the model
    tok_traj = rb.token_traj_ids().to(dev)
    adv_traj = group_advantages(rb.reward.to(dev), rb.traj_group.to(dev), eps=algo.adv_eps)
    tok_adv_all = adv_traj[tok_traj].float()
    mask_all = torch.ones(T, dtype=torch.bool, device=dev)
    coef = token_coefficients(mask_all, tok_traj, rb.num_trajectories, algo.loss_agg)
    # global normalisers: the aggregation's denominator (trajectories with tokens, or tokens) and
    # PCSD's M are counts over the whole batch, i.e. over every rank
    n_seq = int((torch.bincount(tok_traj, minlength=rb.num_trajectories) > 0).sum()) if T else 0
    local_norm = T if algo.loss_agg == "token-mean" else n_seq
    g_norm, T_all = dist_utils.global_sum([local_norm, T], ctx)
    coef = (coef * (local_norm / max(g_norm, 1.0))).float()
    T_all = max(T_all, 1.0)
    pcsd_params = {k: v for k, v in OmegaConf.to_container(algo.pcsd).items() if k in rule.defaults}
    lengths = [len(r) for r in rb.response_ids]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)

    def token_terms(rows: list[int], idx: torch.Tensor, old_mb: torch.Tensor):
        """Advantages, PCSD weights and gaps of a micro-batch's tokens. Its rows are whole response
        turns and the weights' windows never cross a turn, so per micro-batch equals the whole batch."""
        mask = mask_all[idx]
        gap = (teacher[idx] - old_mb) if teacher is not None else torch.zeros_like(old_mb)
        tok_adv = tok_adv_all[idx]
        weights = torch.zeros_like(old_mb)
        if rule.kind == "advantage":
            tok_adv = rule(tok_adv, gap, mask, step)
        elif algo.distill:
            cu = torch.tensor([0] + [lengths[i] for i in rows], device=dev).cumsum(0)
            weights = rule(gap, cu, mask, **pcsd_params)
        return tok_adv, weights, gap, mask

    gscale = dist_utils.grad_scale(ctx)
    student.train()
    stats = dict(loss=0.0, pg=0.0, kl=0.0, pcsd=0.0, clip_frac=0.0, grad_norm=0.0)
    tok_sums = dict(gap=0.0, w=0.0, gate=0.0, nll=0.0)  # over the batch's tokens (first epoch)
    t0 = time.perf_counter()
    n_mb = len(mbs) * cfg.optim.ppo_epochs
    update_cb = progress("update", n_mb) if progress else None
    cached: dict[int, tuple] = {}  # micro-batch -> its token terms (computed once)
    for _epoch in range(cfg.optim.ppo_epochs):
        opt.zero_grad(set_to_none=True)
        for k in range(n_passes):
            rows = mbs[k] if k < len(mbs) else None
            lp = _mb_logprobs(student, rb.prompt_ids, rb.response_ids, rows)
            if rows is None:  # padding pass: joins the collectives, adds nothing
                (lp.sum() * 0.0).backward()
                continue
            idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(dev)
            if k not in cached:
                old_mb = lp.detach().float() if old is None else old[idx]
                cached[k] = (old_mb, *token_terms(rows, idx, old_mb))
                _, _, w_mb, gap_mb, _ = cached[k]
                tok_sums["gap"] += float(gap_mb.sum())
                tok_sums["w"] += float(w_mb.sum())
                tok_sums["gate"] += float((w_mb > 0.5).float().sum())
                tok_sums["nll"] += float(-old_mb.sum())
            old_mb, tok_adv, w_mb, _gap, mask = cached[k]
            loss = lp.sum() * 0.0
            if algo.grpo:
                pg, kl, clipped = grpo_token_terms(lp, old_mb, None if ref is None else ref[idx],
                                                   tok_adv, algo.clip_eps)
                c = coef[idx]
                pg_l, kl_l = (c * pg).sum(), (c * kl).sum()
                loss = loss + pg_l + algo.kl_beta * kl_l
                stats["pg"] += float(pg_l.detach())
                stats["kl"] += float(kl_l.detach())
                stats["clip_frac"] += float(clipped.float().sum()) / T_all
            if algo.distill and rule.kind == "weights":
                # sum over this micro-batch of m w (T - S) / M, M = all valid tokens of the batch
                d = pcsd_loss(lp, teacher[idx], w_mb, mask) * (len(idx) / T_all)
                loss = loss + algo.lambda_distill * d
                stats["pcsd"] += float(d.detach())
            (loss * gscale).backward()  # FSDP averages over ranks; the global loss is their sum
            stats["loss"] += float(loss.detach())
            update_cb and update_cb(_epoch * len(mbs) + k + 1, n_mb)
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
        stats["grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        opt.step()
    student.eval()
    sums = dist_utils.global_sum(
        [stats["loss"], stats["pg"], stats["kl"], stats["pcsd"], stats["clip_frac"], tok_sums["gap"],
         tok_sums["w"], tok_sums["gate"], tok_sums["nll"]], ctx)
    for key, v in zip(("loss", "pg", "kl", "pcsd", "clip_frac"), sums[:5]):
        stats[key] = v
    stats.update(
        score_seconds=t_score, update_seconds=time.perf_counter() - t0, tokens=int(T_all),
        gap_mean=sums[5] / T_all if teacher is not None else 0.0,
        weight_mean=sums[6] / T_all,
        gate_activation=sums[7] / T_all,
        entropy_proxy=sums[8] / T_all,
    )
    return stats


# ----------------------------------------------------------------------------- the job
def train(cfg: DictConfig, run_dir: Path, ctx: Optional[DistContext] = None) -> dict[str, Any]:
    """Runs the job in ``run_dir``; with ``cfg.run.resume`` continues from the run's newest
    complete checkpoint. ``ctx`` (default: one process) says which rank this is; all ranks call
    ``train`` and rank 0 writes the files. Returns the summary (rank 0's, broadcast)."""
    from rich.console import Console

    from pcsd.checkpoint import capture_rng, load_checkpoint, restore_rng
    from pcsd.prompts import PromptBuilder

    ctx = ctx or single_process(resolve_device(cfg.run.device))
    # "[pcsd]" is text, not a rich style tag; no wrapping; only rank 0 prints
    console = Console(quiet=not ctx.is_main, markup=False, soft_wrap=True)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    device = ctx.device
    t_start = time.time()
    if ctx.distributed and cfg.rollout.tasks_per_step < ctx.world_size:
        raise ValueError(f"rollout.tasks_per_step={cfg.rollout.tasks_per_step} must be >= the number of "
                         f"ranks ({ctx.world_size}): every rank plays whole groups")
    ckpt = load_checkpoint(run_dir) if cfg.run.resume else None
    if ckpt is not None:
        console.print(f"[pcsd] resuming from {ckpt.path} (step {ckpt.step})")

    # games (rank 0 writes the files, the others read the same paths)
    def games_at(out_dir: Path, count: int, seed: int, **kw) -> list[str]:
        if ctx.is_main:
            procedural_games(out_dir, count, seed, **kw)
        dist_utils.barrier(ctx)
        return procedural_games(out_dir, count, seed, **kw)

    knobs = procedural_knobs(cfg)
    if cfg.env.source == "procedural":
        pool_n = max(64, cfg.rollout.tasks_per_step * max(cfg.optim.steps, 1))
        train_games = games_at(run_dir / "games" / "train", pool_n, seed=1000, **knobs)
        n_eval = cfg.eval.episodes or 48
        eval_games = games_at(run_dir / "games" / "eval", n_eval, seed=900_000, **knobs)
    else:
        train_games = split_games(cfg.env.split)
        eval_games = split_games(cfg.eval.split)
        if cfg.eval.episodes:
            eval_games = eval_games[: cfg.eval.episodes]
    summary: dict[str, Any] = {"preset": cfg.preset, "method": cfg.method, "rule": cfg.rule,
                               "run_dir": str(run_dir), "world_size": ctx.world_size,
                               "eval_episodes": len(eval_games)}

    # the warm-up's expert episodes (rank 0, new runs): SFT data, and the generated model's
    # tokenizer is trained on their text so that every name of the games is one token
    policy_dir = run_dir / "sft-model"
    warm_up = cfg.optim.sft_steps > 0 and ckpt is None and ctx.is_main
    episodes = []
    if warm_up:
        t0 = time.time()
        sft_games = procedural_games(run_dir / "games" / "sft", cfg.optim.sft_games, seed=500_000, **knobs)
        episodes = expert_episodes(sft_games, cfg.env.max_steps, cfg.optim.sft_navigation)
        summary["sft_expert_success"] = 100.0 * sum(ep.won for ep in episodes) / len(episodes)
        summary["sft_expert_seconds"] = time.time() - t0

    # model (the tiny generated model when no path is given)
    if cfg.model.path:
        model_dir = Path(cfg.model.path)
    else:
        from pcsd.testing import make_tiny_model

        model_dir = run_dir / "base-model"
        if ctx.is_main and not (model_dir / "config.json").exists():
            # heads of 32 dimensions (the smallest vLLM's CPU attention takes): more heads to copy with
            make_tiny_model(model_dir, hidden_size=cfg.model.tiny_hidden_size, num_layers=cfg.model.tiny_layers,
                            num_heads=max(1, cfg.model.tiny_hidden_size // 32), seed=cfg.run.seed,
                            corpus=game_corpus(episodes))
        dist_utils.barrier(ctx)
        console.print(f"[pcsd] tiny model written to {model_dir}")
    student = load_model(model_dir, device, cfg.model.dtype)
    builder = PromptBuilder("alfworld", history_length=cfg.env.history_length,
                            max_prompt_tokens=cfg.rollout.max_prompt_tokens, tokenizer_dir=model_dir)

    # SFT warm-up for the generated model (so that RL has signal); rank 0 trains it, a resumed
    # run reuses the saved one
    if warm_up:
        t0 = time.time()
        examples = sft_examples(builder, episodes, eos_id(builder), teacher_share=cfg.optim.sft_teacher_share,
                                seed=cfg.run.seed)
        losses = sft_warmup(student, examples, steps=cfg.optim.sft_steps, lr=cfg.optim.sft_lr,
                            batch_size=cfg.optim.sft_batch_size, seed=cfg.run.seed,
                            prompt_weight=cfg.optim.sft_prompt_weight, schedule=cfg.optim.sft_schedule,
                            tokens_per_pass=cfg.optim.tokens_per_microbatch,
                            progress=lambda s, n, l: console.print(f"[pcsd] sft {s}/{n} loss {l:.3f}")
                            if s % 25 == 0 else None)
        summary["sft_examples"] = len(examples)
        summary["sft_loss_first_last"] = [losses[0], losses[-1]]
        summary["sft_seconds"] = time.time() - t0
        student.save_pretrained(policy_dir)
        for f in model_dir.glob("*token*"):
            (policy_dir / f.name).write_bytes(f.read_bytes())
        for f in model_dir.glob("chat_template*"):
            (policy_dir / f.name).write_bytes(f.read_bytes())
    dist_utils.barrier(ctx)
    if cfg.optim.sft_steps > 0:
        base_dir = policy_dir
        if ckpt is not None or not ctx.is_main:
            if not (policy_dir / "config.json").is_file():
                raise FileNotFoundError(f"{policy_dir}: the SFT model of this run is missing")
            student = load_model(policy_dir, device, cfg.model.dtype)
    else:
        base_dir = model_dir

    # one frozen copy of the base: teacher (teacher prompt) and reference (student prompt)
    frozen = copy.deepcopy(student).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    backend_name = usable_backend(cfg.rollout.backend, console.print)
    # sharded training: the hf backend generates with a full copy refreshed after every update;
    # with vLLM a CPU copy only carries the HF config for save_pretrained of gathered weights
    gen_model = student
    if ctx.distributed:
        gen_model = copy.deepcopy(student).eval()
        if backend_name == "vllm":
            gen_model = gen_model.to("cpu")
    dist_utils.shard_model(student, ctx)
    dist_utils.shard_model(frozen, ctx)
    if backend_name == "vllm":
        backend = make_backend("vllm", model_path=base_dir, dtype="float32" if device.type == "cpu" else "bfloat16",
                               seed=cfg.run.seed,
                               max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)
    else:
        backend = make_backend("hf", model=gen_model, pad_token_id=eos_id(builder))
    summary["backend"] = backend_name
    console.print(f"[pcsd] rollout backend: {backend_name}")

    progress = ProgressReporter(cfg.run.progress and ctx.is_main, console=console)
    eval_split = "procedural" if cfg.env.source == "procedural" else cfg.eval.split
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.optim.lr,
                            weight_decay=cfg.optim.weight_decay)
    rng = random.Random(cfg.run.seed)  # game sampling
    metrics_path = run_dir / "metrics.jsonl"

    def sync_generation_weights() -> None:
        if ctx.distributed:  # gather the shards (collective), then every rank refreshes its engine
            backend.load_weights(dist_utils.full_model_state(student, ctx, all_ranks=True).items())
        elif backend_name == "vllm":
            backend.load_weights(student.state_dict().items())

    start = 0
    before = None  # rank 0's evaluation before RL (from the checkpoint when resuming)
    progress.start()
    if ckpt is not None:
        dist_utils.load_full_state(student, opt, ckpt.model_state, ckpt.optimizer_state, ctx)
        sync_generation_weights()
        summary.update(ckpt.state.get("summary", {}))
        before = ckpt.state.get("eval_before")
        summary["world_size"] = ctx.world_size
        start = ckpt.step
        if ctx.is_main and metrics_path.exists():  # drop records written after the checkpoint
            keep = [ln for ln in metrics_path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= start]
            metrics_path.write_text("".join(ln + "\n" for ln in keep))
        if ckpt.state.get("torch_threads") not in (None, torch.get_num_threads()):
            console.print(f"[pcsd] note: the checkpoint was written with {ckpt.state['torch_threads']} torch "
                          f"threads, this process has {torch.get_num_threads()}: CPU results may differ in "
                          f"the last bits")
    else:
        if ctx.is_main:
            before = evaluate(backend, builder, eval_games, cfg, seed=12345, label="before RL", split=eval_split,
                              progress=progress.rollout("eval before"))
            console.print(f"[pcsd] success before RL: {before['overall']:.1f}% {before['per_category']}")
            summary["success_before"] = before["overall"]
            summary["success_before_per_task"] = before["per_task"]
        summary = dist_utils.broadcast_object(summary, ctx)

    def save(done: int) -> None:
        from pcsd.checkpoint import save_checkpoint

        model_state = dist_utils.full_model_state(student, ctx)  # collective under FSDP
        optim_state = dist_utils.full_optimizer_state(student, opt, ctx)
        if ctx.is_main:
            path = save_checkpoint(
                run_dir, done, gen_model if ctx.distributed else student, optim_state,
                capture_rng({"games": rng}), config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                state={"summary": summary, "eval_before": before, "torch_threads": torch.get_num_threads()},
                model_state=model_state if ctx.distributed else None, tokenizer_dir=model_dir,
                keep_last=cfg.run.keep_last)
            console.print(f"[pcsd] checkpoint {path}")
        dist_utils.barrier(ctx)

    if ckpt is not None:  # every RNG exactly as the uninterrupted run had it after step `start`
        restore_rng(ckpt.rng, {"games": rng})
    stopped_at = None
    phases: dict[str, float] = {"sft": float(summary.get("sft_seconds", 0.0))}  # wall seconds per phase
    with (MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard) if ctx.is_main
          else contextlib.nullcontext(None)) as metrics:
        if metrics is not None and ckpt is None:
            metrics.log_eval("before", before, step=0)
        for step in range(start, cfg.optim.steps):
            t0 = time.time()
            games = [train_games[rng.randrange(len(train_games))] for _ in range(cfg.rollout.tasks_per_step)]
            mine = dist_utils.split_groups(len(games), ctx)  # whole groups per rank
            rb = collect_rollouts(backend, builder, games[mine.start:mine.stop], cfg.rollout.group_size,
                                  max_steps=cfg.env.max_steps,
                                  max_response_tokens=cfg.rollout.max_response_tokens,
                                  temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  seed=(cfg.run.seed * 100_000 + step) * ctx.world_size + ctx.rank,
                                  stop_token_ids=[eos_id(builder)],
                                  success_reward=cfg.algo.success_reward,
                                  invalid_action_penalty=cfg.rollout.invalid_action_penalty,
                                  student_skills=cfg.algo.student_skills, num_threads=cfg.env.num_threads,
                                  progress=progress.rollout("rollout"))
            backend.sleep()
            st = update_step(student, frozen, opt, rb, cfg, step, ctx, progress=progress.phase)
            backend.wake()
            t_sync = time.time()
            sync_generation_weights()
            rec = step_record(step + 1, rb, st, sync_seconds=time.time() - t_sync, step_seconds=time.time() - t0)
            if ctx.distributed:  # the batch's totals over every rank (per-category success: this rank's)
                n_traj, r_sum, won_sum, len_sum, n_rows, valid_sum = dist_utils.global_sum(
                    [rb.num_trajectories, float(rb.reward.sum()), float(rb.won.float().sum()),
                     float(rb.length.float().sum()), rb.num_rows, float(rb.action_valid.float().sum())], ctx)
                rec.update(reward=r_sum / max(n_traj, 1), success=100.0 * won_sum / max(n_traj, 1),
                           turns=len_sum / max(n_traj, 1), valid_actions=valid_sum / max(n_rows, 1))
            if metrics is not None:
                metrics.log(rec)
            for ph, key in (("rollout", "rollout_seconds"), ("score", "score_seconds"),
                            ("update", "update_seconds"), ("weight_sync", "sync_seconds")):
                phases[ph] = phases.get(ph, 0.0) + float(rec.get(key, 0.0))
            console.print(f"[pcsd] step {step + 1}/{cfg.optim.steps} success {rec['success']:.1f}% "
                          f"reward {rec['reward']:.2f} gap {rec['gap_mean']:.3f} gate {rec['gate_activation']:.2f} "
                          f"kl {rec['kl']:.4f} {rec['tokens_per_s']:.0f} tok/s {rec['step_seconds']:.1f}s")
            done = step + 1
            stop = bool(cfg.run.stop_after) and done >= cfg.run.stop_after and done < cfg.optim.steps
            if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.optim.steps or stop:
                save(done)
            if stop:
                stopped_at = done
                break
        if stopped_at is None and ctx.is_main:
            after = evaluate(backend, builder, eval_games, cfg, seed=12345, label="after RL", split=eval_split,
                             progress=progress.rollout("eval after"))
            metrics.log_eval("after", after, step=cfg.optim.steps)
            console.print(f"[pcsd] success after RL: {after['overall']:.1f}% {after['per_category']}")
            summary.update(success_after=after["overall"], success_after_per_task=after["per_task"])
            evals = [e for e in (before, after) if e is not None]
            table = render_table(evals)
            (run_dir / "eval.md").write_text(table)
            (run_dir / "eval.json").write_text(json.dumps(dict(before=before, after=after), indent=2))
            console.print(table, soft_wrap=True)
            plots = metrics.plot()
            console.print(f"[pcsd] plots: {', '.join(str(p) for p in plots)}; "
                          f"TensorBoard: {run_dir / 'tensorboard'}")
        progress.stop()

    if stopped_at is not None:
        backend.close()
        console.print(f"[pcsd] stopped after step {stopped_at} (run.stop_after); continue with "
                      f"python -m pcsd.train --resume {run_dir}")
        summary.update(steps=stopped_at, stopped_after=stopped_at, success_after=None,
                       wall_seconds=time.time() - t_start)
        return summary
    backend.close()
    final_state = dist_utils.full_model_state(student, ctx)
    if ctx.is_main:
        m = gen_model if ctx.distributed else student
        m.save_pretrained(run_dir / "final-model", **({"state_dict": final_state} if ctx.distributed else {}))
    summary.update(steps=cfg.optim.steps, wall_seconds=time.time() - t_start,
                   phase_seconds={k: round(v, 2) for k, v in phases.items()})
    return dist_utils.broadcast_object(summary, ctx)
