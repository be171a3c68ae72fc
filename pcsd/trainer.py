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

import copy
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from pcsd.grpo import group_advantages, grpo_token_terms, token_coefficients
from pcsd.losses import pcsd_loss
from pcsd.rollout.backends import GenerationBackend, make_backend
from pcsd.rollout.loop import RolloutBatch, collect_rollouts
from pcsd.scoring import score_packed
from pcsd.weighting import get_rule

log = logging.getLogger("pcsd.train")

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")


# ----------------------------------------------------------------------------- games
def procedural_games(out_dir: Path, count: int, seed: int, task_types=TASK_TYPES, **knobs) -> list[str]:
    """Writes ``count`` procedural games (task types in rotation, seeds from ``seed``)."""
    from pcsd.envs.procedural import write_game

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        tt = task_types[i % len(task_types)]
        p = out_dir / f"{i:05d}-{tt}.tw-pddl"
        if not p.exists():
            write_game(p, tt, seed + i, **knobs)
        paths.append(str(p))
    return paths


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
def expert_episodes(games: list[str], max_steps: int) -> list[tuple[str, list[tuple[str, list[str], str]]]]:
    """(task, [(observation, admissible, expert action), ...]) for each game, played by the
    native engine's expert."""
    from pcsd.envs.alfworld import AlfworldGame

    out = []
    for path in games:
        g = AlfworldGame.from_file(path, max_steps=max_steps)
        obs, info = g.reset()
        plan = g.expert_plan() or []
        steps = []
        for action in plan[:max_steps]:
            steps.append((obs, list(info["admissible_commands"]), action))
            obs, _, done, info = g.step(action)
            if done:
                break
        out.append((g.task, steps))
    return out


def think_for(task: str, action: str) -> str:
    """The reasoning text of the SFT targets: the kind of the next step (``go``, ``take``, ...).
    Kept short on purpose: every token is generated at every turn of every rollout, and on a CPU
    generation is the larger part of the default's time (the task is in the prompt already)."""
    return f"Next: {action.split(' ', 1)[0]}."


def sft_warmup(model, builder, games: list[str], cfg: DictConfig, steps: int, lr: float, seed: int,
               progress=None) -> list[float]:
    """Short supervised warm-up on expert trajectories so that RL starts with signal."""
    rng = random.Random(seed)
    examples = []
    for task, steps_ in expert_episodes(games, cfg.env.max_steps):
        hist: list[tuple[str, str]] = []
        for obs, adm, action in steps_:
            reqs = [dict(task=task, observation=obs, admissible=adm, history=hist, step=len(hist))]
            (_, ids), = builder.build_batch(reqs)
            text = f"<think>{think_for(task, action)}</think><action>{action}</action>"
            resp = builder.tokenizer.encode(text) + [eos_id(builder)]
            examples.append((ids, resp))
            hist = hist + [(obs, action)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    batch = 16
    for step in range(steps):
        chunk = [examples[rng.randrange(len(examples))] for _ in range(batch)]
        lps = score_packed(model, [c[0] for c in chunk], [c[1] for c in chunk],
                           max_tokens_per_pass=cfg.optim.tokens_per_microbatch)
        loss = -torch.cat(lps).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(step + 1, steps, losses[-1])
    model.eval()
    return losses


def eos_id(builder) -> int:
    ids = builder.tokenizer.encode("<|im_end|>")
    if len(ids) != 1:
        raise ValueError("the tokenizer has no single <|im_end|> token (ChatML models only)")
    return ids[0]


# ----------------------------------------------------------------------------- evaluation
def evaluate(backend: GenerationBackend, builder, games: list[str], cfg: DictConfig, seed: int) -> dict:
    """Success rate (%) overall and per task type; each game once, fixed order and seed."""
    temp = 0.0 if cfg.eval.greedy else cfg.eval.temperature
    rb = collect_rollouts(backend, builder, games, 1, max_steps=cfg.env.max_steps,
                          max_response_tokens=cfg.rollout.max_response_tokens, temperature=temp,
                          seed=seed, stop_token_ids=[eos_id(builder)], student_skills=cfg.eval.skills,
                          teacher_prompts=False, num_threads=cfg.env.num_threads)
    per: dict[str, list[bool]] = {}
    for tt, w in zip(rb.task_type, rb.won.tolist()):
        per.setdefault(tt, []).append(w)
    return {"overall": 100.0 * float(rb.won.float().mean()),
            "per_task": {k: 100.0 * sum(v) / len(v) for k, v in sorted(per.items())},
            "episodes": len(games)}


# ----------------------------------------------------------------------------- one update
def scores(model, prompts, responses, budget: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(score_packed(model, prompts, responses, max_tokens_per_pass=budget)).float()


def update_step(student, frozen, opt, rb: RolloutBatch, cfg: DictConfig, step: int) -> dict:
    """Scores the batch and applies one GRPO + lambda * PCSD update (ppo_epochs passes)."""
    algo = cfg.algo
    budget = cfg.optim.tokens_per_microbatch
    rule = get_rule(cfg.rule)
    t0 = time.perf_counter()
    student.eval()
    old = scores(student, rb.prompt_ids, rb.response_ids, budget)  # log pi_old, student prompt
    need_ref = algo.grpo and algo.kl_beta > 0
    ref = scores(frozen, rb.prompt_ids, rb.response_ids, budget) if need_ref else None
    use_teacher = algo.distill or rule.kind == "advantage"
    teacher_model = student if algo.teacher == "current" else frozen
    teacher = scores(teacher_model, rb.teacher_prompt_ids, rb.response_ids, budget) if use_teacher else None
    t_score = time.perf_counter() - t0

    T = rb.num_tokens()
    mask = torch.ones(T, dtype=torch.bool)
    tok_traj = rb.token_traj_ids()
    cu = rb.cu_seqlens()
    adv_traj = group_advantages(rb.reward, rb.traj_group, eps=algo.adv_eps)
    tok_adv = adv_traj[tok_traj].float()
    gap = (teacher - old) if teacher is not None else torch.zeros(T)
    weights = torch.zeros(T)
    if rule.kind == "advantage":
        tok_adv = rule(tok_adv, gap, mask, step)
    elif algo.distill:
        p = OmegaConf.to_container(algo.pcsd)
        params = {k: v for k, v in p.items() if k in rule.defaults}
        weights = rule(gap, cu, mask, **params)
    coef = token_coefficients(mask, tok_traj, rb.num_trajectories, algo.loss_agg).float()

    # micro-batches of whole rows by token budget
    row_len = [len(p) + len(r) for p, r in zip(rb.prompt_ids, rb.response_ids)]
    mbs, cur, size = [], [], 0
    for i, n in enumerate(row_len):
        if cur and size + n > budget:
            mbs.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        mbs.append(cur)
    offsets = cu.tolist()
    student.train()
    stats = dict(loss=0.0, pg=0.0, kl=0.0, pcsd=0.0, clip_frac=0.0, grad_norm=0.0)
    t0 = time.perf_counter()
    for _epoch in range(cfg.optim.ppo_epochs):
        opt.zero_grad(set_to_none=True)
        for rows in mbs:
            idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows])
            lp = torch.cat(score_packed(student, [rb.prompt_ids[i] for i in rows],
                                        [rb.response_ids[i] for i in rows], max_tokens_per_pass=budget))
            loss = lp.sum() * 0.0
            if algo.grpo:
                pg, kl, clipped = grpo_token_terms(lp, old[idx], None if ref is None else ref[idx],
                                                   tok_adv[idx], algo.clip_eps)
                c = coef[idx]
                pg_l, kl_l = (c * pg).sum(), (c * kl).sum()
                loss = loss + pg_l + algo.kl_beta * kl_l
                stats["pg"] += float(pg_l)
                stats["kl"] += float(kl_l)
                stats["clip_frac"] += float(clipped.float().sum()) / T
            if algo.distill and rule.kind == "weights":
                # sum over this micro-batch of m w (T - S) / M, M = all valid tokens of the batch
                d = pcsd_loss(lp, teacher[idx], weights[idx], mask[idx]) * (len(idx) / T)
                loss = loss + algo.lambda_distill * d
                stats["pcsd"] += float(d)
            loss.backward()
            stats["loss"] += float(loss)
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
        stats["grad_norm"] = float(gn)
        opt.step()
    student.eval()
    stats.update(
        score_seconds=t_score, update_seconds=time.perf_counter() - t0, tokens=T,
        gap_mean=float(gap.mean()) if teacher is not None else 0.0,
        weight_mean=float(weights.mean()),
        gate_activation=float((weights > 0.5).float().mean()),
        entropy_proxy=float(-old.mean()),
    )
    return stats


# ----------------------------------------------------------------------------- the job
def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    from rich.console import Console

    from pcsd.prompts import PromptBuilder

    console = Console()
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    device = resolve_device(cfg.run.device)
    t_start = time.time()
    phases: dict[str, float] = {}  # wall seconds per phase, written to summary.json

    def lap(name: str, since: float) -> float:
        now = time.time()
        phases[name] = phases.get(name, 0.0) + now - since
        return now

    # model (the tiny generated model when no path is given)
    if cfg.model.path:
        model_dir = Path(cfg.model.path)
    else:
        from pcsd.testing import make_tiny_model

        model_dir = run_dir / "base-model"
        if not (model_dir / "config.json").exists():
            make_tiny_model(model_dir, hidden_size=cfg.model.tiny_hidden_size, num_layers=cfg.model.tiny_layers,
                            seed=cfg.run.seed)
        console.print(f"[pcsd] tiny model written to {model_dir}")
    student = load_model(model_dir, device, cfg.model.dtype)
    builder = PromptBuilder("alfworld", history_length=cfg.env.history_length,
                            max_prompt_tokens=cfg.rollout.max_prompt_tokens, tokenizer_dir=model_dir)
    t = lap("model", t_start)

    # games
    knobs = {k: cfg.env[k] for k in ("receptacles", "distractors") if cfg.env[k] is not None}
    if cfg.env.source == "procedural":
        pool_n = max(64, cfg.rollout.tasks_per_step * max(cfg.optim.steps, 1))
        train_games = procedural_games(run_dir / "games" / "train", pool_n, seed=1000, **knobs)
        n_eval = cfg.eval.episodes or 48
        eval_games = procedural_games(run_dir / "games" / "eval", n_eval, seed=900_000, **knobs)
    else:
        train_games = split_games(cfg.env.split)
        eval_games = split_games(cfg.eval.split)
        if cfg.eval.episodes:
            eval_games = eval_games[: cfg.eval.episodes]
    summary: dict[str, Any] = {"preset": cfg.preset, "rule": cfg.rule, "run_dir": str(run_dir),
                               "eval_episodes": len(eval_games)}
    t = lap("games", t)

    # SFT warm-up for the generated model (so that RL has signal)
    if cfg.optim.sft_steps > 0:
        sft_games = procedural_games(run_dir / "games" / "sft", 96, seed=500_000, **knobs)
        losses = sft_warmup(student, builder, sft_games, cfg, steps=cfg.optim.sft_steps,
                            lr=cfg.optim.sft_lr, seed=cfg.run.seed,
                            progress=lambda s, n, l: console.print(f"[pcsd] sft {s}/{n} loss {l:.3f}")
                            if s % 25 == 0 else None)
        summary["sft_loss_first_last"] = [losses[0], losses[-1]]
        policy_dir = run_dir / "sft-model"
        student.save_pretrained(policy_dir)
        for f in model_dir.glob("*token*"):
            (policy_dir / f.name).write_bytes(f.read_bytes())
        for f in model_dir.glob("chat_template*"):
            (policy_dir / f.name).write_bytes(f.read_bytes())
        base_dir = policy_dir
        t = lap("sft", t)
    else:
        base_dir = model_dir

    # one frozen copy of the base: teacher (teacher prompt) and reference (student prompt)
    frozen = copy.deepcopy(student).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)

    backend_name = cfg.rollout.backend
    if backend_name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            console.print("[pcsd] vLLM is not installed: using the hf backend")
            backend_name = "hf"
    if backend_name == "vllm":
        backend = make_backend("vllm", model_path=base_dir, dtype="float32" if device.type == "cpu" else "bfloat16",
                               seed=cfg.run.seed,
                               max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)
    else:
        backend = make_backend("hf", model=student, pad_token_id=eos_id(builder))
    summary["backend"] = backend_name
    console.print(f"[pcsd] rollout backend: {backend_name}")
    t = lap("backend_start", t)

    before = evaluate(backend, builder, eval_games, cfg, seed=12345)
    t = lap("eval_before", t)
    console.print(f"[pcsd] success before RL: {before['overall']:.1f}% {before['per_task']}")
    summary["success_before"] = before["overall"]
    summary["success_before_per_task"] = before["per_task"]

    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.optim.lr,
                            weight_decay=cfg.optim.weight_decay)
    metrics_path = run_dir / "metrics.jsonl"
    rng = random.Random(cfg.run.seed)
    history = []
    with metrics_path.open("a") as mf:
        for step in range(cfg.optim.steps):
            t0 = time.time()
            games = [train_games[rng.randrange(len(train_games))] for _ in range(cfg.rollout.tasks_per_step)]
            rb = collect_rollouts(backend, builder, games, cfg.rollout.group_size, max_steps=cfg.env.max_steps,
                                  max_response_tokens=cfg.rollout.max_response_tokens,
                                  temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  seed=cfg.run.seed * 100_000 + step, stop_token_ids=[eos_id(builder)],
                                  success_reward=cfg.algo.success_reward,
                                  invalid_action_penalty=cfg.rollout.invalid_action_penalty,
                                  student_skills=cfg.algo.student_skills, num_threads=cfg.env.num_threads)
            phases["rollout"] = phases.get("rollout", 0.0) + rb.timings.total
            backend.sleep()
            st = update_step(student, frozen, opt, rb, cfg, step)
            phases["score"] = phases.get("score", 0.0) + st["score_seconds"]
            phases["update"] = phases.get("update", 0.0) + st["update_seconds"]
            t = time.time()
            backend.wake()
            if backend_name == "vllm":
                backend.load_weights(student.state_dict().items())
            lap("weight_sync", t)
            rec = dict(step=step + 1, reward=float(rb.reward.mean()), success=100.0 * float(rb.won.float().mean()),
                       turns=float(rb.length.float().mean()),
                       valid_actions=float(rb.action_valid.float().mean()),
                       rollout_seconds=rb.timings.total, outside_model_share=rb.timings.outside_model_share(),
                       step_seconds=time.time() - t0, **st)
            history.append(rec)
            mf.write(json.dumps(rec) + "\n")
            mf.flush()
            console.print(f"[pcsd] step {step + 1}/{cfg.optim.steps} success {rec['success']:.1f}% "
                          f"reward {rec['reward']:.2f} gap {rec['gap_mean']:.3f} gate {rec['gate_activation']:.2f} "
                          f"kl {rec['kl']:.4f} {rec['step_seconds']:.1f}s")

    t = time.time()
    after = evaluate(backend, builder, eval_games, cfg, seed=12345)
    lap("eval_after", t)
    console.print(f"[pcsd] success after RL: {after['overall']:.1f}% {after['per_task']}")
    backend.close()
    student.save_pretrained(run_dir / "final-model")
    summary.update(success_after=after["overall"], success_after_per_task=after["per_task"],
                   steps=cfg.optim.steps, wall_seconds=time.time() - t_start,
                   phase_seconds={k: round(v, 2) for k, v in phases.items()})
    summary["sft_seconds"] = phases.get("sft", 0.0)
    return summary
