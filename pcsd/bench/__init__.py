"""The benchmarks: ``python -m pcsd.bench {op,env,prompts,logprobs,step,rollout,all}``, ``gpu``,
the proof of the GPU path (:mod:`pcsd.bench.gpu`), and ``lora``, LoRA against full fine-tuning
(:mod:`pcsd.bench.lora`, ``docs/lora.md``); neither is part of ``all``.

Every subcommand runs both sides of each comparison in the same invocation, after a warm-up,
``--repeats`` times, and reports the median and the spread (max - min). Each prints a rich table
headed by the machine line (CPU model, cores, GPU, torch version) and writes
``<out>/<name>.json`` (machine, arguments, rows) and ``<out>/<name>.png`` (matplotlib, Agg).

    python -m pcsd.bench all --quick            # everything at small sizes (< 10 min on 2 cores)
    python -m pcsd.bench env --sizes 128 1024 4096 --threads 1 2
    python -m pcsd.bench logprobs --tokens 2048 --hidden 64
    python -m pcsd.bench step --models real-vocab      # one GRPO + PCSD step vs the straightforward one
    python -m pcsd.bench rollout --model-path /models/Qwen2.5-3B-Instruct   # CUDA GPU only: real model
    python -m pcsd.bench gpu --out gpu-results      # the GPU path, part by part (<= 8 min on one H100)
    python -m pcsd.bench gpu --device cpu --small   # every part that runs on a CPU (< 2 min, CI)
    python -m pcsd.bench lora --quick               # LoRA vs full: the weight sync (merged) and one step

``env`` sets the native pool against the real alfworld engine stepped one env at a time and in a
Python multiprocessing pool (worker processes holding real envs); ``rollout`` sets the vLLM
backend against HF. With a CUDA GPU, ``op`` and ``logprobs`` add CUDA rows and ``rollout
--model-path`` measures the given model's generation tokens/s and rollout split on the GPU.

Layout: :mod:`pcsd.bench.common` holds what every benchmark shares (machine line, timing, tables);
each benchmark is one module (``op``, ``env``, ``prompts``, ``logprobs``, ``step``, ``rollout``,
``lora``, ``gpu`` with the self-test cases of the op in ``op_cases``) with its arguments, sizes and ``run``;
:mod:`pcsd.bench.cli` is the command line. The benchmarks import
from every layer below them (ops, envs, text, rollout); nothing imports ``pcsd.bench``.
"""

import importlib.util
import os

__all__ = ["amdahl", "console_main", "machine_line", "measure", "measure_pool", "pool_worker_cpu_ns"]

_COMMON = {"amdahl", "machine_line", "measure", "measure_pool", "pool_worker_cpu_ns"}


def __getattr__(name: str):
    # lazy: ``pcsd-bench`` must set the thread count before torch is imported
    if name in _COMMON:
        from pcsd.bench import common

        return getattr(common, name)
    raise AttributeError(f"module 'pcsd.bench' has no attribute {name!r}")


def use_one_openmp_thread_for_vllm() -> None:
    """vLLM's CPU build wants one OpenMP thread per process; this must run before torch loads."""
    if importlib.util.find_spec("vllm") is not None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def console_main() -> int:
    """Entry point of the ``pcsd-bench`` script (the same as ``python -m pcsd.bench``)."""
    use_one_openmp_thread_for_vllm()
    from pcsd.bench.cli import main

    main()
    return 0
