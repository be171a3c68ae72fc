"""``python -m pcsd.bench logprobs``: the fused lm-head + loss (:mod:`pcsd.ops.fused`) and the
chunked selective log-probs vs the naive full-logits reference (time and peak memory), full
vocabulary."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from pcsd.bench.common import FULL_VOCAB, emit, measure, pos_int, rel_spread


def _logprob_inputs(tokens: int, hidden: int, vocab: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(device)
    w = (torch.randn(vocab, hidden, generator=g) * hidden**-0.5).to(device)
    t = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    return h, w, t


SIDES = ("fused", "chunked", "naive")


def _logprob_fn(side: str, h, w, t, backward: bool):
    """One call of ``side``; with ``backward``, the gradients of the hidden states and of the lm-head
    weight (training) of the loss ``-sum(logp)``."""
    from pcsd.ops.fused import fused_logprob_loss
    from pcsd.ops.scoring import selective_logprobs, selective_logprobs_naive

    def fn():
        hh = h.detach().requires_grad_(backward)
        ww = w.detach().requires_grad_(backward)
        if side == "fused":
            loss, out = fused_logprob_loss(hh, ww, t, lambda lp, lo, hi: -lp)
        else:
            out = selective_logprobs(hh, ww, t) if side == "chunked" else selective_logprobs_naive(hh, ww, t)
            loss = -out.sum()
        if backward:
            loss.backward()
        return out

    return fn


def logprobs_peak_worker(side: str, tokens: int, hidden: int, vocab: int, backward: bool) -> dict:
    """Run in a fresh process: peak RSS growth of one call over the inputs already allocated."""
    import resource
    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    h, w, t = _logprob_inputs(tokens, hidden, vocab, "cpu")
    fn = _logprob_fn(side, h, w, t, backward)
    base_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base = rss()
    peak = [base]
    stop = threading.Event()

    def sample():  # ru_maxrss misses peaks below the import-time high-water mark: also poll RSS
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            stop.wait(0.0005)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    fn()
    stop.set()
    th.join()
    peak_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(side=side, extra_bytes=max(peak[0] - base, peak_max - base_max))


def _peak_subprocess(side, tokens, hidden, vocab, backward) -> float:
    code = (
        "import json,sys; from pcsd.bench.logprobs import logprobs_peak_worker as f; "
        f"print(json.dumps(f({side!r}, {tokens}, {hidden}, {vocab}, {backward})))"
    )
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess for {side} failed: {res.stderr[-500:]}")
    return float(json.loads(res.stdout.strip().splitlines()[-1])["extra_bytes"])


def cmd_logprobs(args) -> dict:
    from pcsd.ops.scoring import selective_logprobs, selective_logprobs_naive

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else None
    rows, notes = [], []
    for n in args.tokens:
        h, w, t = _logprob_inputs(n, args.hidden, args.vocab, device)
        with torch.no_grad():
            err = float((selective_logprobs(h, w, t) - selective_logprobs_naive(h, w, t)).abs().max())
        for backward in (False, True):
            res = {}
            for side in SIDES:
                fn = _logprob_fn(side, h, w, t, backward)
                m = measure(fn, args.repeats, sync=sync)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    extra = torch.cuda.max_memory_allocated() - base
                else:
                    extra = _peak_subprocess(side, n, args.hidden, args.vocab, backward)
                res[side] = (m, extra)
            (mc, xc), (mn, xn), (mf, xf) = res["chunked"], res["naive"], res["fused"]
            full = n * args.vocab * 4  # bytes of the float32 [N, V] logits
            rows.append(
                dict(
                    tokens=n,
                    hidden=args.hidden,
                    vocab=args.vocab,
                    pass_="fwd+bwd" if backward else "fwd",
                    fused_ms=mf["median_s"] * 1e3,
                    fused_spread_rel=rel_spread(mf),
                    time_fused_vs_naive=mf["median_s"] / mn["median_s"],
                    time_fused_vs_chunked=mf["median_s"] / mc["median_s"],
                    fused_peak_KB_per_token=xf / n / 1024,
                    fused_peak_vs_full_logits=xf / full,
                    chunked_peak_vs_full_logits=xc / full,
                    chunked_ms=mc["median_s"] * 1e3,
                    chunked_spread_rel=rel_spread(mc),
                    naive_ms=mn["median_s"] * 1e3,
                    naive_spread_rel=rel_spread(mn),
                    time_chunked_vs_naive=mc["median_s"] / mn["median_s"],
                    chunked_us_per_token=mc["median_s"] / n * 1e6,
                    naive_us_per_token=mn["median_s"] / n * 1e6,
                    chunked_peak_KB_per_token=xc / n / 1024,
                    naive_peak_KB_per_token=xn / n / 1024,
                    memory_naive_vs_chunked=xn / xc if xc > 0 else float("nan"),
                    max_abs_err=err,
                )
            )
    for n in args.memory_tokens or []:  # peak memory only, at sizes where full logits would not fit
        for side in ("fused", "chunked"):
            x = _peak_subprocess(side, n, args.hidden, args.vocab, True)
            rows.append(
                dict(
                    tokens=n,
                    hidden=args.hidden,
                    vocab=args.vocab,
                    pass_=f"fwd+bwd {side} memory only",
                    **{
                        f"{side}_peak_KB_per_token": x / n / 1024,
                        f"{side}_peak_vs_full_logits": x / (n * args.vocab * 4),
                    },
                )
            )
    notes.append(
        "peak = "
        + (
            "torch.cuda.max_memory_allocated over the inputs"
            if device == "cuda"
            else "RSS growth over the allocated inputs (polled /proc/self/statm and ru_maxrss), in a fresh subprocess per side"
        )
        + f"; device {device}; chunk defaults token_chunk=1024, vocab_chunk=16384 (chunked), "
        "tiles of 2^24 floats (fused); fwd+bwd: gradients of the hidden states and the lm-head weight; "
        "*_peak_vs_full_logits: peak over the float32 [N, V] logits' size"
    )
    cols = [
        "tokens",
        "hidden",
        "vocab",
        "pass_",
        "fused_ms",
        "fused_spread_rel",
        "time_fused_vs_naive",
        "time_fused_vs_chunked",
        "fused_peak_KB_per_token",
        "fused_peak_vs_full_logits",
        "chunked_peak_vs_full_logits",
        "chunked_ms",
        "chunked_spread_rel",
        "naive_ms",
        "naive_spread_rel",
        "time_chunked_vs_naive",
        "chunked_us_per_token",
        "naive_us_per_token",
        "chunked_peak_KB_per_token",
        "naive_peak_KB_per_token",
        "memory_naive_vs_chunked",
        "max_abs_err",
    ]

    def plot(ax, rows):
        labels = [f"{r['tokens']} {r['pass_']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.27 for i in x], [r.get("fused_peak_KB_per_token", 0) for r in rows], 0.27, label="fused")
        ax.bar([i for i in x], [r.get("chunked_peak_KB_per_token", 0) for r in rows], 0.27, label="chunked")
        ax.bar([i + 0.27 for i in x], [r.get("naive_peak_KB_per_token", 0) for r in rows], 0.27, label="naive")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("peak KB / token")
        ax.legend()

    return emit(
        "logprobs",
        "Selective log-probs: chunked vs naive (full vocabulary)",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
        plot,
    )


NAME = "logprobs"
HELP = "fused lm-head + loss, chunked and naive selective log-probs, full vocabulary"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(
    tokens=([512, 2048], [256, 1024], [16]),
    hidden=(64, 64, 32),
    repeats=(5, 3, 2),
    memory_tokens=([8192], [8192], [32]),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=pos_int, nargs="+")
    p.add_argument("--hidden", type=pos_int)
    p.add_argument("--vocab", type=pos_int, default=FULL_VOCAB)
    p.add_argument(
        "--memory-tokens",
        type=pos_int,
        nargs="*",
        help="token counts with only the fused and chunked peak memory measured (fwd+bwd)",
    )


run = cmd_logprobs
