"""``python -m pcsd.bench rollout``: end-to-end multi-turn rollouts on the tiny model, vLLM vs HF
(or a real model on a CUDA GPU with ``--model-path``)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from pcsd.bench.common import emit, measure, pos_int, rel_spread
from pcsd.bench.env import make_games


def _first_turn_prompts(builder, games: Sequence[str], group_size: int) -> list[list[int]]:
    """The turn-1 student prompts (token ids) of ``len(games) x group_size`` episodes."""
    from pcsd.envs.pool import EnvPool

    with EnvPool(
        "alfworld", len(games) * group_size, group_size=group_size, games=list(games), max_steps=None, num_threads=1
    ) as pool:
        b = pool.reset()
        reqs = [
            dict(task=pool.task_of(e)[1], observation=o, admissible=list(a), history=[], step=0)
            for e, o, a in zip(b.env_id.tolist(), b.obs, b.admissible)
        ]
    return builder.encode_batch(reqs)


def check_model_path(args) -> None:
    """``--model-path`` selects the real-hardware run: a HF checkpoint, a CUDA GPU and vLLM."""
    import importlib.util

    if args.model_path is None:
        return
    if not (Path(args.model_path) / "config.json").is_file():
        raise SystemExit(
            f"error: --model-path: expected a Hugging Face checkpoint folder with a config.json, "
            f"got {args.model_path!r}"
        )
    if not torch.cuda.is_available():
        raise SystemExit(
            "error: --model-path: the real-model rollout needs a CUDA GPU and torch.cuda.is_available() "
            "is False here; without --model-path the benchmark runs the tiny model on the CPU"
        )
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("error: --model-path: the real-model rollout needs vLLM (pip install 'pcsd[vllm]')")


def cmd_rollout(args) -> dict:
    import importlib.util

    from transformers import AutoModelForCausalLM

    from pcsd.ops.scoring import score_packed
    from pcsd.rollout.backends import make_backend
    from pcsd.rollout.loop import collect_rollouts
    from pcsd.text.prompts import PromptBuilder
    from pcsd.tiny_model import make_tiny_model

    check_model_path(args)
    real = args.model_path is not None
    device = "cuda" if torch.cuda.is_available() else "cpu"  # vLLM takes the GPU when there is one: HF too
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-rollout-") as tmp:
        model_dir = Path(args.model_path) if real else make_tiny_model(Path(tmp) / "model")
        games = make_games(Path(tmp) / "games", args.games)
        builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=2048, tokenizer_dir=model_dir)
        eos = builder.tokenizer.encode("<|im_end|>")[0]
        dtype = torch.bfloat16 if real else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        sync = torch.cuda.synchronize if device == "cuda" else None
        backends = [("hf", lambda: make_backend("hf", model=model, pad_token_id=eos))]
        if args.no_vllm:
            notes.append("vllm backend skipped: --no-vllm")
        elif importlib.util.find_spec("vllm") is None:
            notes.append("vllm backend skipped: vllm is not importable in this environment")
        elif real:  # GPU: the engine takes its share of the device, the trainer's copy sits beside it
            backends.append(
                (
                    "vllm",
                    lambda: make_backend(
                        "vllm",
                        model_path=str(model_dir),
                        dtype="bfloat16",
                        max_model_len=4096,
                        gpu_memory_utilization=0.4,
                    ),
                )
            )
        else:
            backends.append(
                (
                    "vllm",
                    lambda: make_backend(
                        "vllm", model_path=str(model_dir), dtype="float32", max_model_len=2048, kv_cache_bytes=256 << 20
                    ),
                )
            )
        first = _first_turn_prompts(builder, games, args.group_size)
        for name, mk in backends:
            try:
                backend = mk()
            except Exception as exc:
                notes.append(f"{name} backend skipped: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            try:
                # generation alone: the turn-1 prompts of every episode, one batch
                gen = []

                def gen_once():
                    gen.append(backend.generate(first, n=1, max_tokens=args.max_tokens, seed=len(gen)))

                mg = measure(gen_once, args.repeats, sync=sync)
                ntok = round(statistics.median(sum(len(s[0].token_ids) for s in out) for out in gen[1:]))
                rows.append(
                    dict(
                        backend=name,
                        phase="generate only",
                        episodes=len(first),
                        gen_tokens=ntok,
                        seconds=mg["median_s"],
                        spread_rel=rel_spread(mg),
                        gen_tokens_per_s=ntok / mg["median_s"],
                    )
                )

                results = []

                def once():
                    b = collect_rollouts(
                        backend,
                        builder,
                        games=games,
                        group_size=args.group_size,
                        max_steps=args.max_steps,
                        max_response_tokens=args.max_tokens,
                        seed=len(results),
                        stop_token_ids=[eos],
                    )
                    t0 = time.perf_counter()
                    with torch.no_grad():  # what the trainer does next: log-probs of the sampled tokens
                        score_packed(model, b.prompt_ids, b.response_ids)  # student prompts
                        score_packed(model, b.teacher_prompt_ids, b.response_ids)  # teacher prompts
                    if sync:
                        sync()
                    results.append((b, time.perf_counter() - t0))

                m = measure(once, args.repeats, sync=sync)
            finally:
                backend.close()
            timed = results[1:]  # the first is the warm-up
            k = min(range(len(timed)), key=lambda i: abs(timed[i][0].timings.total + timed[i][1] - m["median_s"]))
            b, scoring_s = timed[k]
            tm = b.timings
            eps = b.num_trajectories
            rows.append(
                dict(
                    backend=name,
                    phase="rollout",
                    episodes=eps,
                    turns=b.num_rows,
                    gen_tokens=b.num_tokens(),
                    seconds=m["median_s"],
                    spread_rel=rel_spread(m),
                    episodes_per_s=eps / tm.total,
                    turns_per_s=b.num_rows / tm.total,
                    gen_tokens_per_s=b.num_tokens() / tm.total,
                    generation_s=tm.generation,
                    env_s=tm.env,
                    prompts_s=tm.prompts,
                    parsing_s=tm.parsing,
                    scoring_s=scoring_s,
                    rollout_s=tm.total,
                    outside_model_share=tm.outside_model_share(),
                    win_rate=float(b.won.float().mean()),
                )
            )
        model = None  # the weights freed before the summary (the closures above are done with it)
    gen_rows = {r["backend"]: r for r in rows if r["phase"] == "generate only"}
    roll_rows = {r["backend"]: r for r in rows if r["phase"] == "rollout"}
    if "hf" in gen_rows and "vllm" in gen_rows:
        gen_rows["vllm"]["vllm_vs_hf"] = gen_rows["vllm"]["gen_tokens_per_s"] / gen_rows["hf"]["gen_tokens_per_s"]
    if "hf" in roll_rows and "vllm" in roll_rows:
        roll_rows["vllm"]["vllm_vs_hf"] = roll_rows["vllm"]["episodes_per_s"] / roll_rows["hf"]["episodes_per_s"]
    what = f"model {model_dir} (bfloat16, CUDA)" if real else f"tiny Qwen2 model (random weights, float32, {device})"
    notes.append(
        f"{args.games} procedural games x group {args.group_size}, max_steps={args.max_steps}, "
        f"max_response_tokens={args.max_tokens}, {what}, torch threads {torch.get_num_threads()}"
    )
    notes.append(
        "generate only: one batch of the turn-1 prompts of every episode (no stop token); vllm_vs_hf = "
        "generated tokens/s (generate only) or episodes/s (rollout) of vLLM over HF"
    )
    notes.append(
        "rollout: rates and time split (generation, env, prompt assembly, parsing) of the repeat closest to "
        "the median; rates over rollout_s; scoring_s = log-probs of the sampled tokens on the student and "
        "the teacher prompts (pcsd.ops.scoring.score_packed, no grad), timed after the rollout; "
        "outside_model_share = (env + prompts + parsing) / rollout_s (goal <= 5 %)"
    )
    cols = [
        "backend",
        "phase",
        "episodes",
        "turns",
        "gen_tokens",
        "seconds",
        "spread_rel",
        "episodes_per_s",
        "turns_per_s",
        "gen_tokens_per_s",
        "vllm_vs_hf",
        "generation_s",
        "env_s",
        "prompts_s",
        "parsing_s",
        "scoring_s",
        "rollout_s",
        "outside_model_share",
        "win_rate",
    ]

    def plot(ax, rows):
        rs = [r for r in rows if r["phase"] == "rollout"]
        bottom = [0.0] * len(rs)
        for part in ("generation_s", "env_s", "prompts_s", "parsing_s", "scoring_s"):
            vals = [r[part] for r in rs]
            ax.bar([r["backend"] for r in rs], vals, bottom=bottom, label=part[:-2])
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_ylabel("seconds per rollout batch (+ scoring)")
        ax.legend(fontsize=7)

    title = "End-to-end multi-turn rollout: HF vs vLLM backend" + (" (real model, CUDA)" if real else " (tiny model)")
    return emit("rollout", title, rows, cols, Path(args.out), args, notes, plot)


NAME = "rollout"
HELP = "end-to-end multi-turn rollout on the tiny model (hf, vllm)"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(
    games=(4, 2, 1), group_size=(4, 2, 2), max_steps=(8, 4, 2), max_tokens=(48, 24, 6), repeats=(3, 2, 1)
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--games", type=pos_int)
    p.add_argument("--group-size", type=pos_int)
    p.add_argument("--max-steps", type=pos_int)
    p.add_argument("--max-tokens", type=pos_int)
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM backend")
    p.add_argument(
        "--model-path",
        help="a HF checkpoint to run instead of the tiny model (needs a CUDA GPU and "
        "vLLM): its vLLM generation tokens/s and the rollout split on real hardware",
    )


run = cmd_rollout
