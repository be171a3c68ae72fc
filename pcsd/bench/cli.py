"""The ``python -m pcsd.bench`` / ``pcsd-bench`` command line: one subcommand per benchmark module
(each module owns its arguments, its sizes and its ``run``), and ``all`` runs the benchmarks in turn
(``gpu``, the proof of the GPU path, and ``lora`` run on their own)."""

from __future__ import annotations

import argparse
import time
from types import ModuleType
from typing import Sequence

from pcsd.bench import env, gpu, logprobs, lora, op, prompts, rollout, step
from pcsd.bench.common import add_common, fill_defaults

#: the benchmarks in the order ``all`` runs them
BENCHMARKS: tuple[ModuleType, ...] = (op, env, prompts, logprobs, step, rollout)
SUBCOMMANDS: tuple[str, ...] = tuple(m.NAME for m in BENCHMARKS)
#: every subcommand's module: the benchmarks, ``gpu`` and ``lora`` (LoRA's costs, docs/lora.md)
_BY_NAME = {m.NAME: m for m in BENCHMARKS + (gpu, lora)}


def build_parser() -> argparse.ArgumentParser:
    import pcsd.bench

    ap = argparse.ArgumentParser(
        prog="python -m pcsd.bench",
        description=pcsd.bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{" + ",".join(_BY_NAME) + ",all}")
    for mod in _BY_NAME.values():
        p = sub.add_parser(mod.NAME, help=mod.HELP)
        add_common(p)
        mod.add_arguments(p)
    p = sub.add_parser("all", help="every benchmark in turn")
    add_common(p)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-real", action="store_true")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--model-path", help="passed to rollout (CUDA GPU only)")
    return ap


def _run(name: str, args: argparse.Namespace) -> dict:
    mod = _BY_NAME[name]
    return mod.run(fill_defaults(mod.DEFAULTS, args))


def main(argv: Sequence[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd != "all":
        return {args.cmd: _run(args.cmd, args)}
    rollout.check_model_path(args)  # refuse before the first benchmark, not after the fourth
    results = {}
    t0 = time.perf_counter()
    for name in SUBCOMMANDS:
        sub_argv = [name, "--out", args.out] + (["--quick"] if args.quick else []) + (["--tiny"] if args.tiny else [])
        if args.repeats:
            sub_argv += ["--repeats", str(args.repeats)]
        if name == "op" and args.no_compile:
            sub_argv.append("--no-compile")
        if name == "env" and args.no_real:
            sub_argv.append("--no-real")
        if name == "rollout" and args.no_vllm:
            sub_argv.append("--no-vllm")
        if name == "rollout" and args.model_path:
            sub_argv += ["--model-path", args.model_path]
        t1 = time.perf_counter()
        results[name] = _run(name, ap.parse_args(sub_argv))
        print(f"[{name}: {time.perf_counter() - t1:.1f} s]", flush=True)
    print(f"[all: {time.perf_counter() - t0:.1f} s]")
    return results
