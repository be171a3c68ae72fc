"""Log-probs of sampled tokens without materialising full logits.

Materialising logits for a batch of 128 x 2,560 tokens at Qwen's vocabulary of 151,936 costs
99.6 GB in bf16. Here the lm-head projection and the log-softmax are fused and computed in chunks
over tokens *and* vocabulary with an online logsumexp: peak extra memory is one
``[token_chunk, vocab_chunk]`` tile. The backward pass recomputes the tiles (as Liger-Kernel's
fused linear cross-entropy does), so training through it is as memory-light as scoring.

Packed layout: sequences are concatenated into one row with ``position_ids`` restarting at 0 for
each sequence, so no compute is spent on padding: flash-attention varlen reads the sequences'
boundaries from the restarting position ids; FlexAttention (when flash-attention is absent) gets a
document mask, causal and within one sequence (:func:`document_mask`). Other attention
implementations get right-padded batches (``model.attn_impl``, :func:`pcsd.models.attention_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "greedy_microbatches",
    "selective_logprobs",
    "selective_logprobs_naive",
    "PackedBatch",
    "document_mask",
    "pack_sequences",
    "pad_sequences",
    "lm_head",
    "response_hidden",
    "score_packed",
    "uses_varlen_attention",
]


def _acc_dtype(t: Tensor) -> torch.dtype:
    """Accumulation dtype: float32, or float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _target_slots(targets: Tensor, vocab_chunk: int) -> tuple[Tensor, Tensor]:
    """Which vocabulary slice holds each target (``[C]`` int64) and its column inside that slice
    (``[C, 1]`` int64), computed once per token chunk: the tile loops below pick the target's logit
    with ``gather``/``scatter`` and ``torch.where`` on these, never asking the host which rows a
    slice holds (``nonzero``, ``bool(tensor)``: a device synchronisation per tile on CUDA)."""
    slot = torch.div(targets, vocab_chunk, rounding_mode="floor")
    col = (targets - slot * vocab_chunk)[:, None]
    return slot, col


def _lse_and_target(
    h: Tensor, weight: Tensor, bias: Optional[Tensor], targets: Tensor, vocab_chunk: int, inv_temp: float
) -> tuple[Tensor, Tensor]:
    """Online logsumexp over vocabulary chunks and the target logit, both ``[C]`` float32. No host
    synchronisation: every step is a device op on device tensors."""
    c = h.shape[0]
    acc = _acc_dtype(h)
    m = torch.full((c,), float("-inf"), device=h.device, dtype=acc)
    s = torch.zeros(c, device=h.device, dtype=acc)
    tgt = torch.zeros(c, device=h.device, dtype=acc)
    vocab = weight.shape[0]
    slot, col = _target_slots(targets, vocab_chunk)
    for k, v0 in enumerate(range(0, vocab, vocab_chunk)):
        v1 = min(vocab, v0 + vocab_chunk)
        logits = h @ weight[v0:v1].T
        if bias is not None:
            logits = logits + bias[v0:v1]
        logits = logits.to(acc) * inv_temp
        cmax = logits.max(dim=1).values
        new_m = torch.maximum(m, cmax)
        s = s * torch.exp(m - new_m) + torch.exp(logits - new_m[:, None]).sum(1)
        m = new_m
        # a row whose target lies in another slice reads a column of this one and keeps its tgt
        picked = logits.gather(1, col.clamp(max=v1 - v0 - 1)).squeeze(1)
        tgt = torch.where(slot == k, picked, tgt)
    return m + torch.log(s), tgt


class _ChunkedSelectiveLogProb(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        targets: Tensor,
        token_chunk: int,
        vocab_chunk: int,
        inv_temp: float,
    ) -> Tensor:
        n = hidden.shape[0]
        acc = _acc_dtype(hidden)
        out = torch.empty(n, device=hidden.device, dtype=acc)
        lse_all = torch.empty(n, device=hidden.device, dtype=acc)
        for t0 in range(0, n, token_chunk):
            t1 = min(n, t0 + token_chunk)
            lse, tgt = _lse_and_target(hidden[t0:t1], weight, bias, targets[t0:t1], vocab_chunk, inv_temp)
            out[t0:t1] = tgt - lse
            lse_all[t0:t1] = lse
        ctx.save_for_backward(hidden, weight, bias, targets, lse_all)
        ctx.chunks = (token_chunk, vocab_chunk, inv_temp)
        # the backward recomputes the logits as the forward did: under the same autocast state
        dev = hidden.device.type
        ctx.autocast = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        with torch.autocast(
            grad_out.device.type, dtype=ctx.autocast or torch.float32, enabled=ctx.autocast is not None
        ):
            return _ChunkedSelectiveLogProb._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor):
        hidden, weight, bias, targets, lse_all = ctx.saved_tensors
        token_chunk, vocab_chunk, inv_temp = ctx.chunks
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        acc = lse_all.dtype
        none = hidden.new_empty(0)  # stands for a gradient that is not needed (never read)
        gh = torch.zeros_like(hidden, dtype=acc) if need_h else none
        gw = torch.zeros_like(weight, dtype=acc) if need_w else none
        gb = torch.zeros(weight.shape[0], device=weight.device, dtype=acc) if need_b else none
        n, vocab = hidden.shape[0], weight.shape[0]
        for t0 in range(0, n, token_chunk):
            t1 = min(n, t0 + token_chunk)
            h = hidden[t0:t1]
            g = grad_out[t0:t1].to(acc)
            tg = targets[t0:t1]
            lse = lse_all[t0:t1]
            slot, col = _target_slots(tg, vocab_chunk)
            for k, v0 in enumerate(range(0, vocab, vocab_chunk)):
                v1 = min(vocab, v0 + vocab_chunk)
                logits = h @ weight[v0:v1].T
                if bias is not None:
                    logits = logits + bias[v0:v1]
                p = torch.exp(logits.to(acc) * inv_temp - lse[:, None])
                # d logp[target] / d logits = inv_temp * (onehot - softmax)
                dlog = -p * g[:, None]
                # + g at each row's target column when it lies in this slice; other rows get their
                # own value written back (no host sync to find the rows, bit-equal to indexing them)
                at = col.clamp(max=v1 - v0 - 1)
                cur = dlog.gather(1, at)
                dlog.scatter_(1, at, torch.where((slot == k)[:, None], cur + g[:, None], cur))
                dlog = dlog * inv_temp
                if need_h:
                    gh[t0:t1] += dlog @ weight[v0:v1].to(acc)
                if need_w:
                    gw[v0:v1] += dlog.T @ h.to(acc)
                if need_b:
                    gb[v0:v1] += dlog.sum(0)
        return (
            gh.to(hidden.dtype) if need_h else None,
            gw.to(weight.dtype) if need_w else None,
            gb.to(bias.dtype) if need_b and bias is not None else None,
            None,
            None,
            None,
            None,
        )


def selective_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Optional[Tensor] = None,
    *,
    token_chunk: int = 1024,
    vocab_chunk: int = 16384,
    temperature: float = 1.0,
) -> Tensor:
    """``log softmax(hidden @ weight.T / temperature)[i, targets[i]]`` for every row, ``[N]``
    float32 (float64 for float64 inputs).

    Args:
        hidden: ``[N, H]`` final hidden states (after the model's last norm).
        weight: ``[V, H]`` lm-head weight; ``bias`` optional ``[V]``.
        targets: ``[N]`` int64 token ids in ``[0, V)``.
        token_chunk, vocab_chunk: tile sizes; peak extra memory is one ``[token_chunk, vocab_chunk]``
            float32 tile (plus its backward twin).
    Differentiable with respect to ``hidden``, ``weight`` and ``bias``.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1] or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int [N={hidden.shape[0]}], got {targets.dtype} {tuple(targets.shape)}")
    if targets.numel():  # the one host synchronisation of a call: both bounds in one read
        lo, hi = torch.stack(torch.aminmax(targets)).tolist()
        if lo < 0 or hi >= weight.shape[0]:
            raise ValueError(f"targets must be token ids in [0, {weight.shape[0]}), got ids from {lo} to {hi}")
    if token_chunk <= 0 or vocab_chunk <= 0:
        raise ValueError("token_chunk and vocab_chunk must be > 0")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _ChunkedSelectiveLogProb.apply(
        hidden, weight, bias, targets.long(), token_chunk, vocab_chunk, 1.0 / temperature
    )


def selective_logprobs_naive(
    hidden: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor] = None, temperature: float = 1.0
) -> Tensor:
    """The plain reference: full logits, ``log_softmax``, gather. Memory ``[N, V]``."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    logp = torch.log_softmax(logits.to(_acc_dtype(hidden)) / temperature, dim=-1)
    return logp.gather(1, targets.long()[:, None]).squeeze(1)


@dataclass
class PackedBatch:
    """Sequences concatenated into one row. ``cu_seqlens`` ``[S+1]`` int64 sequence offsets."""

    input_ids: Tensor  # (1, N) int64
    position_ids: Tensor  # (1, N) int64, restarting at 0 for every sequence
    cu_seqlens: Tensor  # (S+1,) int64


def greedy_microbatches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices grouped greedily in order into micro-batches whose ``sizes`` (tokens) sum to at
    most ``budget``; a row over the budget alone is a micro-batch of its own, rows of size 0 are
    left out."""
    mbs: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if n == 0:
            continue
        if cur and total + n > budget:
            mbs.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        mbs.append(cur)
    return mbs


def pack_sequences(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> PackedBatch:
    if not seqs:
        raise ValueError("seqs must hold at least one sequence")
    lengths = [len(s) for s in seqs]
    if min(lengths) == 0:
        raise ValueError("seqs must not contain empty sequences")
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64, device=device)
    pos = torch.cat([torch.arange(n, device=device) for n in lengths])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int64, device=device)
    cu[1:] = torch.tensor(lengths, device=device).cumsum(0)
    return PackedBatch(ids[None], pos[None], cu)


def pad_sequences(seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Right-padded ``[B, L]`` ids (pad id 0, never attended to) and the ``[B, L]`` attention mask."""
    if not seqs:
        raise ValueError("seqs must hold at least one sequence")
    width = max(len(s) for s in seqs)
    if min(len(s) for s in seqs) == 0:
        raise ValueError("seqs must not contain empty sequences")
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    attn = torch.zeros(len(seqs), width, dtype=torch.int64)
    for k, s in enumerate(seqs):
        ids[k, : len(s)] = torch.as_tensor(list(s), dtype=torch.int64)
        attn[k, : len(s)] = 1
    return ids.to(device), attn.to(device)


def _attn_impl(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) or ""


def uses_varlen_attention(model: nn.Module) -> bool:
    """Whether the model's passes take packed rows: its attention is flash-attention (which attends
    within each sequence of a packed row, position ids restarting) or FlexAttention (given a
    :func:`document_mask`). Other implementations (sdpa, eager) would attend over the whole packed
    row under a dense mask, quadratic in the row's length: they get padded batches."""
    impl = _attn_impl(model)
    return impl.startswith("flash_attention") or impl == "flex_attention"


def document_mask(cu_seqlens: Tensor, total: int, device: torch.device) -> Any:
    """FlexAttention's ``BlockMask`` for one packed row of ``total`` tokens whose sequences start
    at ``cu_seqlens`` ``[S + 1]``: token ``q`` attends to ``kv`` when ``kv <= q`` and both are in the
    same sequence (causal AND same document). Blocks of 128 x 128 tokens outside every sequence's
    causal triangle are skipped by the kernel, so the row costs ``sum(L^2)``, not ``total^2``. On
    CUDA the mask is built by a compiled function (no ``[total, total]`` tensor is ever made)."""
    from torch.nn.attention.flex_attention import create_block_mask

    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(device=device, dtype=torch.int64)
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)

    def causal_same_document(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (kv <= q) & (doc[q] == doc[kv])

    return create_block_mask(
        causal_same_document, None, None, total, total, device=str(device), _compile=device.type == "cuda"
    )


def lm_head(model: nn.Module) -> tuple[Tensor, Optional[Tensor]]:
    """The output projection's weight ``[V, H]`` and bias (None when it has none)."""
    head = getattr(model, "get_output_embeddings")()  # transformers' API (nn.Module does not declare it)
    return head.weight, getattr(head, "bias", None)


_lm_head = lm_head


def response_hidden(
    model: nn.Module, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
) -> tuple[Tensor, Tensor, list[int]]:
    """One forward pass of ``model`` over the sequences ``prompt + response`` (a packed row with
    flash-attention or FlexAttention, a right-padded batch otherwise: see :func:`uses_varlen_attention`).

    Returns the final hidden states ``[R, H]`` at the positions whose *next* token is a response
    token (R = total response tokens, sequences in order), those tokens ``[R]`` int64, and each
    sequence's response length. Every prompt and response must be non-empty. Read the lm-head
    weight after this call (under FSDP it is unsharded by the forward).
    """
    device = next(model.parameters()).device
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    fwd = getattr(model, "pcsd_packed_hidden", None)  # FSDP2-sharded models (pcsd.train.distributed)
    decoder: Any = getattr(model, "model", None)  # the causal LM's decoder stack (transformers' layout)
    if uses_varlen_attention(model):  # one row, position ids restarting per sequence (varlen attention)
        pb = pack_sequences(seqs, device)
        mask = None  # flash-attention: the sequences' boundaries from the restarting position ids
        if _attn_impl(model) == "flex_attention":
            mask = document_mask(pb.cu_seqlens, pb.input_ids.shape[1], pb.input_ids.device)
        if fwd is not None:
            hidden = fwd(pb.input_ids, pb.position_ids, mask)[0]
        else:
            hidden = decoder(
                input_ids=pb.input_ids, position_ids=pb.position_ids, attention_mask=mask, use_cache=False
            ).last_hidden_state[0]
        starts = pb.cu_seqlens[:-1].tolist()
    else:  # right-padded [B, L] batch: attention costs sum(B L^2), not (sum L)^2 of a packed row
        ids, attn = pad_sequences(seqs, device)
        if fwd is not None:
            hidden = fwd(ids, None, attn)
        else:
            hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        width = ids.shape[1]
        hidden = hidden.reshape(-1, hidden.shape[-1])
        starts = [k * width for k in range(len(seqs))]
    rows, tgts, spans = [], [], []
    for k, (p, r) in enumerate(zip(prompts, responses)):
        start = int(starts[k]) + len(p)
        rows.append(torch.arange(start - 1, start - 1 + len(r), device=device))
        tgts.append(torch.as_tensor(list(r), dtype=torch.int64, device=device))
        spans.append(len(r))
    return hidden[torch.cat(rows)], torch.cat(tgts), spans


def score_packed(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    max_tokens_per_pass: int = 8192,
    token_chunk: int = 1024,
    vocab_chunk: int = 16384,
    temperature: float = 1.0,
) -> list[Tensor]:
    """Log-probs of each response's tokens given its prompt (teacher forcing), one ``[len]`` float32
    tensor per response. Sequences are grouped greedily into passes of at most
    ``max_tokens_per_pass`` tokens (padding not counted); gradients flow when the model requires
    them. A pass is one packed row with flash-attention (varlen) or FlexAttention (a document mask)
    and a right-padded batch otherwise (see :func:`uses_varlen_attention`); all give the same log-probs.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"prompts and responses differ in length ({len(prompts)} vs {len(responses)})")
    device = next(model.parameters()).device
    out: list[Optional[Tensor]] = [None] * len(prompts)
    order = list(range(len(prompts)))
    batch: list[int] = []
    size = 0

    def flush(idx: list[int]) -> None:
        hidden, tgts, spans = response_hidden(model, [prompts[i] for i in idx], [responses[i] for i in idx])
        weight, bias = _lm_head(model)  # after the forward: unsharded there under FSDP
        lp = selective_logprobs(
            hidden, weight, tgts, bias, token_chunk=token_chunk, vocab_chunk=vocab_chunk, temperature=temperature
        )
        for i, piece in zip(idx, torch.split(lp, spans)):
            out[i] = piece

    for i in order:
        if len(responses[i]) == 0:
            out[i] = torch.zeros(0, device=device)
            continue
        if len(prompts[i]) == 0:
            raise ValueError(f"prompt {i} is empty; a response needs a context to be scored")
        n = len(prompts[i]) + len(responses[i])
        if batch and size + n > max_tokens_per_pass:
            flush(batch)
            batch, size = [], 0
        batch.append(i)
        size += n
    if batch:
        flush(batch)
    return [t for t in out]  # type: ignore[misc]
