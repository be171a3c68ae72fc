"""``python -m pcsd.bench step``: one GRPO + PCSD training step (scoring + update; no rollout) on a
fixed batch of synthetic multi-turn responses, four ways, in the same run (``--estimator``,
``--policy-loss`` and ``--clip-eps-high`` set ``algo.*`` for every side):

* ``pcsd``: :func:`pcsd.train.update.update_step` with the default config (``optim.fused_lm_head``
  on, ``optim.joint_frozen_pass=auto``): log-probs of response tokens only, the lm-head and the
  per-token loss fused, pi_old from the update's own pass; reference and teacher in one frozen
  pass where attention is varlen (flash-attention), two padded passes otherwise (CPU);
* ``pcsd-joint``: the same with ``optim.joint_frozen_pass=always`` (one padded frozen pass on CPU);
* ``pcsd-recompute``: both keys off (chunked log-probs whose backward recomputes the logits
  tiles, reference and teacher in two passes);
* ``straightforward``: what a user would write with transformers: right-padded batches,
  ``model(...).logits`` over every position, ``log_softmax`` + gather, a separate pi_old pass,
  reference and teacher as two separate forwards, micro-batches of at most ``--naive-tokens``
  padded tokens (full logits cost ``tokens x V x 4`` bytes), the same loss.

Each side runs in a fresh subprocess (same model weights, batch and optimizer: SGD, so the
figures are the step's own memory): seconds per phase, peak RSS growth over the loaded model and
batch (polled), tokens/s, and the loss (the three compute the same step: their losses agree).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from pcsd.bench.common import FULL_VOCAB, emit, pos_int

SIDES = ("pcsd", "pcsd-joint", "pcsd-recompute", "straightforward")
MODELS = {  # name -> (vocab, hidden, layers, heads, kv heads, intermediate)
    "tiny": (1024, 64, 2, 2, 2, 128),
    "real-vocab": (FULL_VOCAB, 256, 4, 4, 2, 768),
}


def make_models(name: str, seed: int = 0):
    """The student and a perturbed frozen copy (reference != student: the KL term is not 0)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab, hid, layers, heads, kv, inter = MODELS[name]
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hid,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    student = Qwen2ForCausalLM(cfg).float()
    frozen = copy.deepcopy(student).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in frozen.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return student, frozen


def make_batch(spec: dict, vocab: int):
    from pcsd.tiny_model import synthetic_rollout_batch

    return synthetic_rollout_batch(
        num_groups=spec["tasks"],
        group_size=spec["group_size"],
        vocab_size=vocab,
        turns=(1, spec["max_turns"]),
        prompt_len=tuple(spec["prompt_len"]),
        response_len=tuple(spec["response_len"]),
        skill_len=spec["skill_len"],
        seed=5,
    )


# ----------------------------------------------------------------------------- the straightforward step
def _padded_microbatches(rb, budget: int) -> list[list[int]]:
    """Rows (with responses) grouped in order so that rows x longest (teacher) sequence <= budget."""
    mbs, cur, width = [], [], 0
    for i, (p, tp, r) in enumerate(zip(rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids)):
        if not r:
            continue
        n = max(len(p), len(tp)) + len(r)
        w = max(width, n)
        if cur and (len(cur) + 1) * w > budget:
            mbs.append(cur)
            cur, w = [], n
        cur.append(i)
        width = w
    if cur:
        mbs.append(cur)
    return mbs


def full_logits_logprobs(model, ctxs, responses, rows) -> torch.Tensor:
    """Packed ``[R]`` log-probs of ``rows``' response tokens: a right-padded batch, logits at every
    position, ``log_softmax`` over the vocabulary, gather."""
    from pcsd.ops.scoring import pad_sequences

    ids, attn = pad_sequences([list(ctxs[i]) + list(responses[i]) for i in rows])
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    return torch.cat([logp[k, len(ctxs[i]) - 1 : len(ctxs[i]) - 1 + len(responses[i])] for k, i in enumerate(rows)])


def straightforward_step(student, frozen, opt, rb, cfg, step: int, naive_tokens: int) -> dict:
    """One GRPO + PCSD step the straightforward way (same loss as update_step)."""
    from omegaconf import OmegaConf

    from pcsd.ops.grpo import k3_kl, token_coefficients
    from pcsd.ops.losses import TokenTerms, pcsd_loss
    from pcsd.ops.policy_losses import get_policy_loss
    from pcsd.ops.weighting import get_rule
    from pcsd.train.update import estimate_advantages

    algo = cfg.algo
    rule = get_rule(cfg.rule)
    mbs = _padded_microbatches(rb, naive_tokens)
    offsets = [0]
    for r in rb.response_ids:
        offsets.append(offsets[-1] + len(r))
    T = offsets[-1]
    idxs = [torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]) for rows in mbs]

    def score(model, ctxs):
        out = torch.zeros(T)
        with torch.no_grad():
            for rows, idx in zip(mbs, idxs):
                out[idx] = full_logits_logprobs(model, ctxs, rb.response_ids, rows)
        return out

    phases = {}
    t0 = time.perf_counter()
    student.eval()
    old = score(student, rb.prompt_ids)
    phases["old_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    ref = score(frozen, rb.prompt_ids)
    phases["ref_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    teacher = score(frozen, rb.teacher_prompt_ids)
    phases["teacher_s"] = time.perf_counter() - t1
    phases["score_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tok_traj = rb.token_traj_ids()
    adv = estimate_advantages(rb, cfg, tok_traj)  # algo.estimator's, as the update takes them
    policy = get_policy_loss(algo.policy_loss)  # algo.policy_loss, with algo.clip_eps / clip_eps_high
    mask = torch.ones(T, dtype=torch.bool)
    coef = token_coefficients(mask, tok_traj, rb.num_trajectories, algo.loss_agg).float()
    cu = torch.tensor(offsets)
    params = {k: v for k, v in OmegaConf.to_container(algo.pcsd).items() if k in rule.defaults}
    weights = rule(teacher - old, cu, mask, **params)
    student.train()
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for rows, idx in zip(mbs, idxs):
        lp = full_logits_logprobs(student, rb.prompt_ids, rb.response_ids, rows)
        lengths = [len(rb.response_ids[i]) for i in rows]
        terms = TokenTerms(
            old_logp=old[idx],
            advantages=adv[idx],
            coef=coef[idx],
            mask=mask[idx],
            traj_ids=tok_traj[idx],
            segments=tuple(int(x) for x in torch.tensor([0, *lengths]).cumsum(0)),
            gap=(teacher - old)[idx],
        )
        pg, _ = policy(lp, terms, algo)
        kl = k3_kl(lp, ref[idx])
        loss = (coef[idx] * pg).sum() + algo.kl_beta * (coef[idx] * kl).sum()
        loss = loss + algo.lambda_distill * pcsd_loss(lp, teacher[idx], weights[idx], mask[idx]) * (len(idx) / T)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
    opt.step()
    student.eval()
    phases["update_s"] = time.perf_counter() - t0
    phases["loss"] = total
    phases["microbatches"] = len(mbs)
    return phases


# ----------------------------------------------------------------------------- one side, in a subprocess
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def step_worker(side: str, model: str, spec: dict) -> dict:
    """Runs ``spec['warmup']`` untimed steps and ``spec['repeats']`` timed steps of ``side``."""
    from pcsd.train.config import load_config
    from pcsd.train.update import update_step

    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    student, frozen = make_models(model)
    rb = make_batch(spec, MODELS[model][0])
    fused = side != "pcsd-recompute"
    joint = {"pcsd": "auto", "pcsd-joint": "always"}.get(side, "never")
    cfg = load_config(
        [
            "method=pcsd",
            "rollout.backend=hf",
            "optim.lr=1e-6",
            f"optim.tokens_per_microbatch={spec['tokens_per_microbatch']}",
            # the config's row budget must fit a micro-batch (a longer row is one of its own)
            f"rollout.max_response_tokens={spec['tokens_per_microbatch'] // 4}",
            f"rollout.max_prompt_tokens={spec['tokens_per_microbatch'] - spec['tokens_per_microbatch'] // 4}",
            f"optim.fused_lm_head={fused}",
            f"optim.joint_frozen_pass={joint}",
            *spec.get("algo", []),  # --estimator, --policy-loss, --clip-eps-high
        ]
    )
    opt = torch.optim.SGD(student.parameters(), lr=cfg.optim.lr)
    peak, stop = [0], threading.Event()

    def run_one() -> dict:
        if side == "straightforward":
            return straightforward_step(student, frozen, opt, rb, cfg, 0, spec["naive_tokens"])
        s = update_step(student, frozen, opt, rb, cfg, step=0)
        return dict(score_s=s["score_seconds"], update_s=s["update_seconds"], loss=s["loss"])

    for _ in range(spec["warmup"]):
        run_one()
    base = _rss()
    peak[0] = base

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            stop.wait(0.002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    runs = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        r = run_one()
        r["step_s"] = time.perf_counter() - t0
        runs.append(r)
    stop.set()
    th.join()
    best = min(runs, key=lambda r: r["step_s"])
    return dict(
        side=side,
        model=model,
        peak_extra_bytes=peak[0] - base,
        runs=runs,
        **best,
        tokens=sum(len(p) + len(r) for p, r in zip(rb.prompt_ids, rb.response_ids)),
        teacher_tokens=sum(len(p) + len(r) for p, r in zip(rb.teacher_prompt_ids, rb.response_ids)),
        response_tokens=rb.num_tokens(),
        rows=len(rb.response_ids),
        trajectories=rb.num_trajectories,
    )


def _run_side(side: str, model: str, spec: dict) -> dict:
    code = (
        "import json; from pcsd.bench.step import step_worker as f; "
        f"print('@@' + json.dumps(f({side!r}, {model!r}, json.loads({json.dumps(spec)!r}))))"
    )
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"step benchmark subprocess ({side}, {model}) failed: {res.stderr[-800:]}")
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("@@")][-1]
    return json.loads(line[2:])


def cmd_step(args) -> dict:
    spec = dict(
        tasks=args.tasks,
        group_size=args.group_size,
        max_turns=args.max_turns,
        prompt_len=list(args.prompt_len),
        response_len=list(args.response_len),
        skill_len=args.skill_len,
        tokens_per_microbatch=args.tokens_per_microbatch,
        naive_tokens=args.naive_tokens,
        warmup=args.warmup,
        repeats=args.repeats,
        algo=algo_overrides(args),
    )
    rows = []
    for model in args.models:
        res = {}
        for side in args.sides:
            t0 = time.perf_counter()
            res[side] = _run_side(side, model, spec)
            print(f"[step {model} {side}: {time.perf_counter() - t0:.1f} s]", flush=True)
        vocab = MODELS[model][0]
        base = res.get("straightforward")
        for side in args.sides:
            r = res[side]
            su = r["score_s"] + r["update_s"]
            row = dict(
                model=model,
                vocab=vocab,
                side=side,
                rows=r["rows"],
                trajectories=r["trajectories"],
                tokens=r["tokens"],
                response_tokens=r["response_tokens"],
                old_s=r.get("old_s", float("nan")),
                ref_s=r.get("ref_s", float("nan")),
                teacher_s=r.get("teacher_s", float("nan")),
                score_s=r["score_s"],
                update_s=r["update_s"],
                score_update_s=su,
                step_s=r["step_s"],
                tokens_per_s=r["tokens"] / su,
                peak_extra_MB=r["peak_extra_bytes"] / 2**20,
                loss=r["loss"],
            )
            if base is not None:
                bsu = base["score_s"] + base["update_s"]
                row["speedup_vs_straightforward"] = bsu / su
                row["memory_vs_straightforward"] = (
                    r["peak_extra_bytes"] / base["peak_extra_bytes"] if base["peak_extra_bytes"] > 0 else float("nan")
                )
                row["loss_rel_diff"] = abs(r["loss"] - base["loss"]) / max(abs(base["loss"]), 1e-12)
            rows.append(row)
    notes = [
        f"batch: {args.tasks} tasks x {args.group_size} rollouts, 1-{args.max_turns} turns, prompts "
        f"{args.prompt_len[0]}-{args.prompt_len[1]} tokens (+{args.skill_len} skill tokens for the teacher), "
        f"responses {args.response_len[0]}-{args.response_len[1]} tokens (synthetic ids, seed 5)",
        f"pcsd sides: optim.tokens_per_microbatch={args.tokens_per_microbatch}; straightforward: padded "
        f"micro-batches of <= {args.naive_tokens} tokens; SGD; {args.warmup} warm-up step(s), best of "
        f"{args.repeats}; each side in a fresh subprocess; "
        + (", ".join(spec["algo"]) if spec["algo"] else "algo.estimator=grpo, algo.policy_loss=ppo (the defaults)"),
        "peak_extra_MB: RSS growth over the loaded models and batch during the timed steps (polled every 2 ms); "
        "tokens_per_s: prompt+response tokens of the batch / (score_s + update_s)",
    ]
    cols = [
        "model",
        "vocab",
        "side",
        "rows",
        "tokens",
        "response_tokens",
        "old_s",
        "ref_s",
        "teacher_s",
        "score_s",
        "update_s",
        "score_update_s",
        "speedup_vs_straightforward",
        "tokens_per_s",
        "peak_extra_MB",
        "memory_vs_straightforward",
        "loss",
        "loss_rel_diff",
    ]

    def plot(ax, rows):
        labels = [f"{r['model']}\n{r['side']}" for r in rows]
        x = range(len(rows))
        ax.bar(list(x), [r["score_s"] for r in rows], label="scoring")
        ax.bar(list(x), [r["update_s"] for r in rows], bottom=[r["score_s"] for r in rows], label="update")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_ylabel("seconds per step")
        ax.legend()

    return emit(
        "step",
        "One GRPO + PCSD step (scoring + update), vs the straightforward implementation",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
        plot,
    )


NAME = "step"
HELP = "one GRPO + PCSD training step (scoring + update) vs the straightforward transformers implementation"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(
    models=(["tiny", "real-vocab"], ["tiny", "real-vocab"], ["tiny"]),
    tasks=(16, 4, 2),
    group_size=(8, 4, 2),
    max_turns=(2, 2, 2),
    prompt_len=([48, 128], [48, 128], [6, 16]),
    response_len=([4, 24], [4, 24], [1, 6]),
    skill_len=(24, 24, 4),
    tokens_per_microbatch=(8192, 8192, 64),
    naive_tokens=(1024, 1024, 32),
    warmup=(0, 0, 0),
    repeats=(1, 1, 1),
)


def algo_overrides(args) -> list[str]:
    """The config overrides of ``--estimator``, ``--policy-loss`` and ``--clip-eps-high`` (both sides
    of the step read them: the update through the config, the straightforward step through the same
    registries)."""
    out = []
    if getattr(args, "estimator", None):
        out.append(f"algo.estimator={args.estimator}")
    if getattr(args, "policy_loss", None):
        out.append(f"algo.policy_loss={args.policy_loss}")
    if getattr(args, "clip_eps_high", None) is not None:
        out.append(f"algo.clip_eps_high={args.clip_eps_high}")
    return out


def _len_range(s: str) -> int:
    return pos_int(s)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), help="models to run (default tiny real-vocab)")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--tasks", type=pos_int, help="tasks (GRPO groups) in the batch")
    p.add_argument("--group-size", type=pos_int, help="rollouts per task")
    p.add_argument("--max-turns", type=pos_int, help="turns per trajectory drawn in 1..max")
    p.add_argument("--prompt-len", type=_len_range, nargs=2, metavar=("MIN", "MAX"))
    p.add_argument("--response-len", type=_len_range, nargs=2, metavar=("MIN", "MAX"))
    p.add_argument("--skill-len", type=pos_int, help="skill tokens before the teacher's prompt")
    p.add_argument("--tokens-per-microbatch", type=pos_int, help="optim.tokens_per_microbatch of the pcsd sides")
    p.add_argument("--naive-tokens", type=pos_int, help="padded tokens per micro-batch of the straightforward side")
    p.add_argument("--warmup", type=int, help="untimed steps before the timed ones")
    from pcsd.ops.estimators import available_estimators
    from pcsd.ops.policy_losses import available_policy_losses

    p.add_argument("--estimator", choices=available_estimators(), help="algo.estimator (default grpo)")
    p.add_argument("--policy-loss", choices=available_policy_losses(), help="algo.policy_loss (default ppo)")
    p.add_argument("--clip-eps-high", type=float, help="algo.clip_eps_high, the upper clip (default: algo.clip_eps)")


def run(args) -> dict:
    for name in ("prompt_len", "response_len"):
        lo, hi = getattr(args, name)
        if lo > hi:
            raise SystemExit(f"error: --{name.replace('_', '-')}: expected MIN <= MAX, got {lo} {hi}")
    if args.warmup < 0:
        raise SystemExit(f"error: --warmup: expected >= 0, got {args.warmup}")
    return cmd_step(args)
