"""``python -m pcsd.bench lora``: what LoRA costs and saves on one model, both sides in the same run
(docs/lora.md):

* the weight sync to the generation engine: :func:`pcsd.train.distributed.iter_weights` of the
  full model (each weight cast and sent) vs a LoRA model's merged weights (each targeted weight
  made as ``W + (B @ A) alpha / r`` in float32, then cast): seconds per sync, the largest bucket
  (what the stream makes at once, from its own plan) and the measured growth of the process's
  resident memory during a sync, into a sink; with vLLM installed also the seconds of a vLLM
  engine's ``load_weights`` from each stream;
* one training step (:func:`pcsd.train.update.update_step`, AdamW, the default PCSD config) of
  full fine-tuning vs LoRA on the same batch: seconds, the trained parameters and AdamW's state.

Ratios are LoRA / full, measured in the same process one after the other.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any, Iterator

import torch

from pcsd.bench.common import bar, emit, measure, pos_int
from pcsd.bench.step import MODELS, make_batch, make_models

NAME = "lora"
HELP = "LoRA vs full fine-tuning: the weight sync (merged weights) and one training step"
#: sizes: (full, --quick, --tiny)
DEFAULTS: dict[str, tuple] = dict(
    model=("real-vocab", "tiny", "tiny"),
    rank=(16, 16, 4),
    tasks=(8, 4, 2),
    group_size=(4, 4, 2),
    repeats=(5, 3, 1),
    bucket_mb=(64, 64, 1),
    vllm=(True, True, False),
)


def _lora(student, rank: int):
    from pcsd.lora import AdaptersOff, LoraSpec, add_adapters

    peft = add_adapters(student, LoraSpec(rank=rank), base_dtype=torch.float32, adapter_dtype=torch.float32)
    with torch.no_grad():  # as after some updates: B is not 0, so the merge does real work
        for n, p in student.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.02)
    return AdaptersOff(peft)


class _Sink:
    """Consumes a weight stream: the bytes of the distinct tensors it carried (a tied weight comes
    once under each of its names, the same tensor)."""

    def __init__(self) -> None:
        self.total = 0

    def __call__(self, stream: Iterator[tuple[str, torch.Tensor]]) -> None:
        seen: set[int] = set()
        for _name, t in stream:
            if id(t) not in seen:
                seen.add(id(t))
                self.total += t.numel() * t.element_size()


def _rss_growth(fn) -> int:
    """The peak growth of this process's resident memory while ``fn`` runs (polled every ms)."""
    import threading

    from pcsd.bench.step import _rss

    start, peak, done = _rss(), [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss() - start)
            done.wait(0.001)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    try:
        fn()
    finally:
        done.set()
        th.join()
    return max(peak[0], _rss() - start)


def _bucket_peak(model, bucket: int) -> int:
    """The bytes of the largest bucket :func:`iter_weights` makes (float32), from its own plan."""
    from pcsd.lora import weight_sources

    peak = size = 0
    for src in weight_sources(model):
        n = src.numel * 4
        if size and size + n > bucket:
            size = 0
        size += n
        peak = max(peak, size)
    return peak


def _sync_rows(full, lora, bucket: int, repeats: int, use_vllm: bool, tmp: Path) -> list[dict]:
    from pcsd.train.distributed import iter_weights, single_process

    ctx = single_process()
    rows = []
    engine = None
    if use_vllm:
        from pcsd.rollout.backends import make_backend

        full.save_pretrained(tmp / "model")
        engine = make_backend("vllm", model_path=tmp / "model", dtype="float32", max_model_len=256)
    for side, model in (("full", full), ("lora", lora)):
        sink = _Sink()
        m = measure(lambda: sink(iter_weights(model, ctx, torch.float32, bucket)), repeats)
        grown = _rss_growth(lambda: _Sink()(iter_weights(model, ctx, torch.float32, bucket)))
        row: dict[str, Any] = dict(
            part="sync (sink)",
            side=side,
            median_s=m["median_s"],
            spread_s=m["spread_s"],
            bytes_streamed=sink.total // (repeats + 1),
            bucket_peak_bytes=_bucket_peak(model, bucket),
            rss_growth_bytes=grown,
        )
        rows.append(row)
        if engine is not None:
            e = measure(lambda: engine.load_weights(iter_weights(model, ctx, torch.float32, bucket)), repeats)
            rows.append(
                dict(part="sync (vLLM load_weights)", side=side, median_s=e["median_s"], spread_s=e["spread_s"])
            )
    return rows


def _step_rows(name: str, rank: int, tasks: int, group: int, repeats: int) -> list[dict]:
    from pcsd.train.config import load_config
    from pcsd.train.optim import make_adamw
    from pcsd.train.update import update_step

    spec = dict(tasks=tasks, group_size=group, max_turns=2, prompt_len=[48, 128], response_len=[4, 24], skill_len=24)
    rb = make_batch(spec, MODELS[name][0])
    rows = []
    for side in ("full", "lora"):
        student, frozen = make_models(name)
        extra = []
        if side == "lora":
            frozen = _lora(student, rank)
            extra = [f"model.lora_rank={rank}"]
        cfg = load_config(
            ["method=pcsd", "rollout.backend=hf", "optim.tokens_per_microbatch=8192", "optim.lr=1e-4", *extra]
        )
        trained = [p for p in student.parameters() if p.requires_grad]
        opt = make_adamw(trained, lr=1e-4, device=trained[0].device)
        m = measure(lambda: update_step(student, frozen, opt, rb, cfg, step=0), repeats)
        adam = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
        rows.append(
            dict(
                part="training step",
                side=side,
                median_s=m["median_s"],
                spread_s=m["spread_s"],
                trained_params=sum(p.numel() for p in trained),
                adamw_state_bytes=adam,
            )
        )
    return rows


def _ratios(rows: list[dict]) -> list[dict]:
    out = []
    for part in dict.fromkeys(r["part"] for r in rows):
        by = {r["side"]: r for r in rows if r["part"] == part}
        if {"full", "lora"} <= by.keys():
            ratio = dict(part=part, side="lora / full", median_s=by["lora"]["median_s"] / by["full"]["median_s"])
            for k in ("bucket_peak_bytes", "rss_growth_bytes", "bytes_streamed", "trained_params", "adamw_state_bytes"):
                if k in by["full"] and by["full"][k]:
                    ratio[k] = by["lora"][k] / by["full"][k]
            out.append(ratio)
    return out


def run(args) -> dict:
    import importlib.util
    import tempfile

    use_vllm = bool(args.vllm) and not args.no_vllm and importlib.util.find_spec("vllm") is not None
    full, _ = make_models(args.model)
    lora_model = copy.deepcopy(full)
    _lora(lora_model, args.rank)
    with tempfile.TemporaryDirectory() as tmp:
        rows = _sync_rows(full, lora_model, int(args.bucket_mb * 2**20), args.repeats, use_vllm, Path(tmp))
    del full, lora_model
    rows += _step_rows(args.model, args.rank, args.tasks, args.group_size, args.repeats)
    rows += _ratios(rows)
    notes = [
        f"model {args.model} {MODELS[args.model]} (vocab, hidden, layers, heads, kv heads, intermediate), "
        f"LoRA rank {args.rank} on every linear layer, float32 on {'vLLM and ' if use_vllm else ''}the CPU",
        "sync: the merged weights are made a bucket at a time (rollout.sync_bucket_mb); the peak is one bucket",
    ]
    cols = (
        "part",
        "side",
        "median_s",
        "spread_s",
        "bytes_streamed",
        "bucket_peak_bytes",
        "rss_growth_bytes",
        "trained_params",
        "adamw_state_bytes",
    )

    def plot(ax, rs: list[dict]) -> None:
        ratios = [r for r in rs if r["side"] == "lora / full"]
        bar(ax, [r["part"] for r in ratios], [r["median_s"] for r in ratios], "seconds, LoRA / full")

    return emit(NAME, "LoRA vs full fine-tuning", rows, cols, Path(args.out), args, notes, plot=plot)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(MODELS), help="the model (default real-vocab; --quick, --tiny: tiny)")
    p.add_argument("--rank", type=pos_int, help="LoRA rank")
    p.add_argument("--tasks", type=pos_int, help="tasks (GRPO groups) in the step's batch")
    p.add_argument("--group-size", type=pos_int, help="rollouts per task")
    p.add_argument("--bucket-mb", type=pos_int, help="rollout.sync_bucket_mb of the sync")
    p.add_argument("--no-vllm", action="store_true", help="time the sync into a sink only")
    p.set_defaults(vllm=None)
