"""``python -m pcsd.bench prompts``: prompt build + chat template + tokenise on a live rollout
stream, Rust ``encode_batch`` vs Python ``str.format`` + transformers ``apply_chat_template``."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pcsd.bench.common import emit, pos_int
from pcsd.bench.env import make_games

_INSTR = (
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags.\nOnce you've finished your reasoning, you should choose an "
    "admissible action for current step and present it within <action> </action> tags."
)
PY_ALFWORLD_TEMPLATE = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observations and the corresponding actions you took: {action_history}\n\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n{instructions}"
)
PY_ALFWORLD_TEMPLATE_NO_HIS = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n\n"
    "Your current observation is: {current_observation}\n\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n{instructions}"
)


def python_prompt(req: dict, history_length: int) -> str:
    """The ALFWorld student prompt with ``str.format`` (same text as the Rust templates)."""
    adm = "\n ".join(f"'{a}'" for a in req["admissible"] if a.strip() != "help")
    step = req["step"]
    if step == 0 or history_length == 0:
        return PY_ALFWORLD_TEMPLATE_NO_HIS.format(
            task_description=req["task"].strip(),
            current_observation=req["observation"].strip(),
            admissible_actions=adm,
            instructions=_INSTR,
        )
    recent = req["history"][max(0, len(req["history"]) - history_length) :]
    first = max(step + 1 - len(recent), 1)
    hist = "\n".join(f"[Observation {first + j}: '{o}', Action {first + j}: '{a}']" for j, (o, a) in enumerate(recent))
    return PY_ALFWORLD_TEMPLATE.format(
        task_description=req["task"].strip(),
        step_count=step,
        history_length=len(recent),
        action_history=hist,
        current_step=step + 1,
        current_observation=req["observation"].strip(),
        admissible_actions=adm,
        instructions=_INSTR,
    )


def prompt_stream(games: Sequence[str], group_size: int, turns: int, seed: int = 0) -> list[list[dict]]:
    """The prompt requests of a live rollout, turn by turn: ``len(games) * group_size`` envs
    (GRPO groups: the envs of a group play the same game) take seeded random admissible actions
    (``help`` aside); turn ``k`` holds one request per env (task, observation, admissible,
    history, step), so observations, admissible lists and histories are new every turn. An env
    whose episode ends is reset and starts a new one (empty history)."""
    import random

    from pcsd.envs.pool import EnvPool

    rng = random.Random(seed)
    n = len(games) * group_size
    stream = []
    with EnvPool("alfworld", n, group_size=group_size, games=list(games), max_steps=None, num_threads=1) as pool:
        b = pool.reset()
        tasks = [pool.task_of(e)[1] for e in range(n)]
        obs, adm = list(b.obs), [list(a) for a in b.admissible]
        hist: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        for _ in range(turns):
            stream.append(
                [
                    dict(task=tasks[e], observation=obs[e], admissible=adm[e], history=list(hist[e]), step=len(hist[e]))
                    for e in range(n)
                ]
            )
            acts = [rng.choice([a for a in adm[e] if a != "help"]) for e in range(n)]
            b = pool.step(acts)
            for e in range(n):
                hist[e].append((obs[e], acts[e]))
            obs, adm = list(b.obs), [list(a) for a in b.admissible]
            ended = [e for e in range(n) if b.done[e]]
            if ended:
                r = pool.reset(ended)
                for k, e in enumerate(ended):
                    obs[e], adm[e], hist[e] = r.obs[k], list(r.admissible[k]), []
    return stream


_PY_TOKENIZER: Any = None


def _py_prompt_init(model_dir: str) -> None:
    global _PY_TOKENIZER
    from transformers import AutoTokenizer

    _PY_TOKENIZER = AutoTokenizer.from_pretrained(model_dir)


def python_prompt_ids(reqs: Sequence[dict]) -> list[list[int]]:
    """The Python side: ``str.format`` of the template + ``apply_chat_template(...,
    add_generation_prompt=True, tokenize=True)``, one prompt after another (tokenizer set by
    :func:`_py_prompt_init`)."""
    out = []
    for r in reqs:
        ids = _PY_TOKENIZER.apply_chat_template(
            [{"role": "user", "content": python_prompt(r, 2)}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))  # transformers 5: BatchEncoding
    return out


def _stream_times(
    run_turn: Callable[[list[dict]], Any],
    stream: list[list[dict]],
    repeats: int,
    fresh: Callable[[], Any] = lambda: None,
) -> dict:
    """Per repeat (``fresh()`` first): the first turn's time (cold) and the later turns' total
    (steady state), wall and process CPU; medians over the repeats."""
    cold, steady, cold_cpu, steady_cpu = [], [], [], []
    for _ in range(repeats):
        fresh()
        turns = []  # (wall, CPU) seconds per turn
        for reqs in stream:
            w0, c0 = time.perf_counter(), time.process_time()
            run_turn(reqs)
            turns.append((time.perf_counter() - w0, time.process_time() - c0))
        cold.append(turns[0][0])
        cold_cpu.append(turns[0][1])
        if len(turns) > 1:
            steady.append(sum(w for w, _ in turns[1:]))
            steady_cpu.append(sum(c for _, c in turns[1:]))
    med = statistics.median
    return dict(
        cold_s=med(cold),
        steady_s=med(steady) if steady else float("nan"),
        cold_cpu_s=med(cold_cpu),
        steady_cpu_s=med(steady_cpu) if steady_cpu else float("nan"),
        cold_spread_rel=(max(cold) - min(cold)) / med(cold),
    )


def cmd_prompts(args) -> dict:
    import multiprocessing as mp

    from pcsd.text.prompts import PromptBuilder
    from pcsd.tiny_model import make_tiny_model

    notes = []
    rows = []
    ncpu = os.cpu_count() or 1
    threads = args.threads or sorted({1, ncpu})
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-prompts-") as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "model"))
        group = min(args.group_size, args.envs)
        if args.envs % group:
            raise SystemExit(f"error: --envs: {args.envs} is not a multiple of --group-size {group}")
        games = make_games(Path(tmp) / "games", args.envs // group)
        stream = prompt_stream(games, group, args.turns)
        n = len(stream[0])
        _py_prompt_init(model_dir)

        def builder(t: int) -> PromptBuilder:
            return PromptBuilder(
                "alfworld", history_length=2, max_prompt_tokens=None, tokenizer_dir=model_dir, num_threads=t
            )

        # same texts and ids on the first and the last turn (a fresh builder, then the one that saw the stream)
        check = [stream[0], stream[-1]]
        b = builder(1)
        for reqs in stream:
            out = b.build_batch(reqs)
            if reqs is stream[0]:
                first = out
        rust_out = first + out
        texts_equal = all(python_prompt(r, 2) == t for r, (t, _) in zip(check[0] + check[1], rust_out))
        ids_equal = python_prompt_ids(check[0] + check[1]) == [list(i) for _, i in rust_out]
        ntok = sum(len(i) for _, i in out) / n
        for t in threads:
            state: dict = {}
            rust = _stream_times(
                lambda reqs: state["b"].encode_batch(reqs),
                stream,
                args.repeats,
                fresh=lambda: state.update(b=builder(t)),
            )
            if t == 1:
                py = _stream_times(python_prompt_ids, stream, args.repeats)
            else:  # the same cores for Python: t worker processes, each a contiguous share of the batch
                with mp.get_context("spawn").Pool(t, initializer=_py_prompt_init, initargs=(model_dir,)) as procs:
                    procs.map(python_prompt_ids, [stream[0][:1]] * t)  # start-up and imports, untimed

                    def py_turn(reqs: list[dict]) -> list:
                        k = -(-len(reqs) // t)
                        return procs.map(python_prompt_ids, [reqs[i : i + k] for i in range(0, len(reqs), k)])

                    py = _stream_times(py_turn, stream, args.repeats)
            for phase, key, count in (
                ("cold: turn 1", "cold", n),
                (f"steady: turns 2-{len(stream)}", "steady", n * (len(stream) - 1)),
            ):
                r, p = rust[f"{key}_s"], py[f"{key}_s"]
                row = dict(
                    threads=t, phase=phase, rust_prompts_per_s=count / r, python_prompts_per_s=count / p, speedup=p / r
                )
                if t == 1:  # CPU time: the like-for-like figure on a loaded machine
                    rc, pc = rust[f"{key}_cpu_s"], py[f"{key}_cpu_s"]
                    row.update(
                        rust_cpu_us_per_prompt=1e6 * rc / count,
                        python_cpu_us_per_prompt=1e6 * pc / count,
                        cpu_speedup=pc / rc,
                    )
                row.update(
                    mean_prompt_tokens=ntok, texts_equal=texts_equal, ids_equal=ids_equal, load=os.getloadavg()[0]
                )
                rows.append(row)
    notes.append(
        f"a live stream: {n} envs ({len(games)} procedural games x groups of {group}) playing random "
        f"admissible actions for {len(stream)} turns, one prompt per env per turn (H = 2 history); "
        f"observations and histories are new every turn. Rust: one PromptBuilder for the whole stream "
        f"(as the trainer uses it), encode_batch (ids, as the rollout takes them) per turn on `threads` threads; cold = its first turn "
        f"(every piece new to its token-id cache), steady = the later turns. Python: str.format + "
        f"apply_chat_template(add_generation_prompt=True, tokenize=True), one prompt after another, in "
        f"`threads` processes (each a share of the turn's batch). Medians of {args.repeats} passes over "
        f"the stream (a new builder each pass)"
    )
    notes.append(
        "cpu_*: process CPU time per prompt (1 thread, both sides in this process): comparable on a loaded "
        "machine; texts/ids compared on the first and the last turn"
    )
    cols = [
        "threads",
        "phase",
        "rust_prompts_per_s",
        "python_prompts_per_s",
        "speedup",
        "rust_cpu_us_per_prompt",
        "python_cpu_us_per_prompt",
        "cpu_speedup",
        "mean_prompt_tokens",
        "texts_equal",
        "ids_equal",
        "load",
    ]

    def plot(ax, rows):
        labels = [f"{r['threads']}t {r['phase'].split(':')[0]}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["rust_prompts_per_s"] for r in rows], width=0.4, label="Rust encode_batch")
        ax.bar(
            [i + 0.2 for i in x],
            [r["python_prompts_per_s"] for r in rows],
            width=0.4,
            label="Python format + apply_chat_template",
        )
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("prompts/s")
        ax.legend(fontsize=7)

    return emit(
        "prompts",
        "Prompt build + chat template + tokenise on a live rollout stream: Rust vs Python",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
        plot,
    )


NAME = "prompts"
HELP = "prompt build + chat template + tokenise on a live rollout stream: Rust vs Python"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(envs=(256, 128, 8), turns=(8, 6, 3), repeats=(3, 2, 1))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--envs", type=pos_int, help="envs in the stream (one prompt per env per turn)")
    p.add_argument("--group-size", type=pos_int, default=8, help="envs per procedural game (GRPO group)")
    p.add_argument("--turns", type=pos_int, help="turns of the stream (the first is the cold one)")
    p.add_argument(
        "--threads",
        type=pos_int,
        nargs="+",
        help="Rust encode_batch threads and Python processes (default 1 and all cores)",
    )


run = cmd_prompts
