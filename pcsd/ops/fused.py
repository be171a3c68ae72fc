"""The lm-head and a per-token loss of the sampled tokens' log-probs in one pass, without recomputation.

The training loss of a micro-batch is a sum of per-token functions of the student's log-prob of
the sampled token, ``L = sum_i f_i(logp_i)`` (GRPO's clipped ratio term, the k3 KL to the
reference, the distillation term with detached weights, RLSD's transformed advantages: each
``f_i`` depends on token ``i``'s own log-prob only). So, token chunk by token chunk, the forward
pass can compute

1. the chunk's logits ``h W^T / temperature``, vocabulary slice by vocabulary slice, into one
   ``[token_chunk, V]`` float32 tile, and from the tile the log-softmax of the sampled tokens;
2. ``g_i = f_i'(logp_i)`` by autograd on the chunk's ``[token_chunk]`` log-probs alone;
3. in place in the tile, ``d L / d logits = g (onehot - softmax) / temperature``, and from it the
   gradients of the hidden states (``dlogits @ W``) and of the lm-head weight
   (``dlogits^T @ h``, accumulated over chunks),

and keep only those gradients. The backward pass multiplies them by the incoming scalar gradient:
no logits tile is ever recomputed (the chunked path of :func:`pcsd.ops.scoring.selective_logprobs`
computes each tile twice) and none outlives its chunk (peak extra memory: one tile, plus the
gradients themselves). This is the pattern of Liger-Kernel's fused linear cross-entropy, with the
loss as an argument. The plain references are :func:`fused_logprob_loss_reference` (full logits,
autograd) and the recomputing chunked path; ``tests/test_fused.py`` compares all three.

Precision: the three matmuls (logits, hidden and weight gradients) run in :func:`matmul_dtype`,
bf16 under autocast or FSDP2's bf16 policy as every other layer of the model does; the tile, the
softmax, the log-probs and the accumulated gradients are float32. The operands are cast once per
call (one micro-batch), never per token chunk.

The softmax normaliser needs the whole vocabulary row, so a tile spans the vocabulary; the token
chunk is chosen so that a tile holds at most ``tile_elems`` floats (``token_chunk`` overrides it).

Speed (issue 40, part 3). At 4,096 x 151,936 x 2,048 in bf16 the time goes to (a) the three GEMMs,
which want a few hundred rows each (a 110-token chunk reads the whole ``[V, H]`` weight twice per
chunk at a fraction of the tensor cores' rate), (b) the passes over the ``[chunk, V]`` tile and (c)
the float32 weight gradient, read and written once per update of it (1.2 GiB each way at that
shape). So: chunks of 441 tokens (a 256 MiB float32 tile, allocated once per call); under bf16
the softmax gradient of consecutive chunks is written, cast, into one group buffer (256 MiB:
883 tokens) and the gradient GEMMs run once per group; on CUDA the GEMMs write float32 from bf16
operands themselves (``out_dtype``: the logits straight into the tile, the hidden gradient into
its rows, the weight gradient accumulated in place), with no matmul-dtype copy and no separate
add; the softmax gradient is one scaling pass (the target's entry set to ``e - s`` first); no
host synchronisation inside the loop. Peak extra memory: the float32 weight gradient, the tile
and the group buffer (:func:`fused_buffer_bytes`), below the backward's cast of that gradient
(float32 plus the weight's dtype) at the bench's shape.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "TokenLoss",
    "fused_logprob_loss",
    "fused_logprob_loss_reference",
    "auto_token_chunk",
    "chunk_bounds",
    "fused_buffer_bytes",
    "token_groups",
    "fused_score_loss",
    "matmul_dtype",
]

#: ``f(logp, lo, hi) -> [hi - lo]``: the per-token losses of tokens ``lo:hi`` given their
#: log-probs ``logp`` ``[hi - lo]`` (differentiable; token ``i``'s loss may depend on ``logp[i]``
#: only). Everything else the loss needs (old log-probs, advantages, weights, masks, coefficients)
#: is detached data the function closes over and slices with ``lo:hi``.
TokenLoss = Callable[[Tensor, int, int], Tensor]

DEFAULT_TILE_ELEMS = 1 << 26  # 64 Mi floats = 256 MiB: 441 tokens x 151,936 vocabulary
#: elements of the group buffer (the softmax gradient of a group of chunks in the matmul dtype,
#: 256 MiB in bf16: 883 tokens x 151,936) that the gradient GEMMs read
DEFAULT_GROUP_ELEMS = 1 << 27


def auto_token_chunk(vocab: int, tile_elems: int = DEFAULT_TILE_ELEMS) -> int:
    """Tokens per chunk so that a ``[chunk, vocab]`` float32 tile holds at most ``tile_elems``
    floats (at least 1)."""
    if vocab <= 0 or tile_elems <= 0:
        raise ValueError(f"vocab and tile_elems must be > 0, got {vocab} and {tile_elems}")
    return max(1, tile_elems // vocab)


def fused_buffer_bytes(
    vocab: int,
    longest_segment: int = 0,
    matmul_bytes: int = 2,
    tile_elems: int = DEFAULT_TILE_ELEMS,
    group_elems: int = DEFAULT_GROUP_ELEMS,
    tokens: Optional[int] = None,
) -> int:
    """Bytes of the fused path's temporaries over the vocabulary with the default chunking (the
    memory plan's line): the float32 tile of one chunk (a segment longer than the chunk is a
    chunk of its own) and, where the matmul dtype is not float32 (``matmul_bytes`` < 4), the group
    buffer of the softmax gradients in that dtype. ``tokens``: the call's tokens, when known (no
    buffer has more rows than the call has tokens)."""
    chunk = max(auto_token_chunk(vocab, tile_elems), longest_segment)
    group = max(chunk, group_elems // vocab)
    if tokens is not None:
        chunk, group = min(chunk, max(tokens, longest_segment)), min(group, max(tokens, longest_segment))
    tile = chunk * vocab * 4
    if matmul_bytes >= 4:
        return tile
    return tile + group * vocab * matmul_bytes


def chunk_bounds(n: int, token_chunk: int, segments: Optional[Sequence[int]] = None) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` covering ``range(n)``: runs of at most ``token_chunk`` tokens, or, with
    ``segments`` (offsets ``[0, ..., n]``), runs of whole segments of at most ``token_chunk``
    tokens together (a longer segment is a run of its own)."""
    if segments is None:
        return [(t0, min(n, t0 + token_chunk)) for t0 in range(0, n, token_chunk)]
    cu = [int(x) for x in segments]
    if not cu or cu[0] != 0 or cu[-1] != n or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"segments must be non-decreasing offsets from 0 to N={n}, got {cu[:8]}...")
    out, lo = [], 0
    for a, b in zip(cu, cu[1:]):
        if b > lo and b - lo > token_chunk and a > lo:
            out.append((lo, a))
            lo = a
    if n > lo:
        out.append((lo, n))
    return out


def _acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _token_grads(loss_fn: TokenLoss, lp: Tensor, lo: int, hi: int) -> tuple[Tensor, Tensor]:
    """The chunk's per-token losses ``[c]`` (detached) and ``d sum(loss) / d lp`` ``[c]``."""
    leaf = lp.detach().requires_grad_(True)
    with torch.enable_grad():
        per_tok = loss_fn(leaf, lo, hi)
        if not isinstance(per_tok, Tensor) or per_tok.shape != leaf.shape:
            raise ValueError(
                f"loss_fn must return the per-token losses, a tensor of shape "
                f"{tuple(leaf.shape)}; got {getattr(per_tok, 'shape', type(per_tok).__name__)}"
            )
        if not per_tok.requires_grad:  # a loss that does not depend on the log-probs
            return per_tok.detach(), torch.zeros_like(leaf)
        (g,) = torch.autograd.grad(per_tok.sum(), leaf, allow_unused=True)
    return per_tok.detach(), (torch.zeros_like(leaf) if g is None else g)


def matmul_dtype(weight: Tensor) -> torch.dtype:
    """The dtype of the fused lm-head's matmuls: autocast's where autocast is on for the weight's
    device and would cast it (a float32 weight), else the weight's own (e.g. bfloat16 under FSDP2's
    mixed-precision policy). Softmax, log-probs and gradient sums stay in float32 either way."""
    dev = weight.device.type
    if weight.dtype == torch.float32 and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


#: (device, matmul dtype, accumulation dtype) -> whether torch's ``out_dtype`` GEMMs run there
_OUT_DTYPE_GEMMS: dict[tuple[str, torch.dtype, torch.dtype], bool] = {}


def out_dtype_gemms(device: torch.device, mm: torch.dtype, acc: torch.dtype) -> bool:
    """Whether ``torch.mm``/``torch.addmm`` with ``out_dtype=acc`` run for ``mm`` operands on
    ``device`` (CUDA with bf16/fp16 operands and float32 output, torch >= 2.8): then the logits
    tile, the hidden gradient and the lm-head weight gradient are written by the GEMMs in float32
    directly, with no ``[chunk, V]`` or ``[V, H]`` temporary in the matmul dtype and no separate
    add. Probed once per device with a tiny GEMM (dispatch errors are raised synchronously)."""
    if device.type != "cuda" or mm == acc or mm not in (torch.bfloat16, torch.float16) or acc != torch.float32:
        return False
    key = (str(device), mm, acc)
    if key not in _OUT_DTYPE_GEMMS:
        try:
            a = torch.ones(2, 2, device=device, dtype=mm)
            c = torch.zeros(2, 2, device=device, dtype=acc)
            _mm_to(c, a, a)
            _addmm_to(c, a.T, a)
            _OUT_DTYPE_GEMMS[key] = bool((c == 4).all())
        except (RuntimeError, TypeError, NotImplementedError):
            _OUT_DTYPE_GEMMS[key] = False
    return _OUT_DTYPE_GEMMS[key]


def _mm_to(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out = a @ b`` written by the GEMM in ``out``'s dtype (the fast path of
    :func:`out_dtype_gemms`)."""
    torch.mm(a, b, out_dtype=out.dtype, out=out)


def _addmm_to(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out += a @ b``, the GEMM accumulating into ``out`` in its dtype (the fast path)."""
    torch.addmm(out, a, b, out_dtype=out.dtype, out=out)


def token_groups(bounds: Sequence[tuple[int, int]], group_rows: int) -> list[list[tuple[int, int]]]:
    """Consecutive chunks gathered into groups of at most ``group_rows`` tokens (a longer chunk is
    a group of its own): the gradient GEMMs run once per group, on the group's rows of the
    softmax gradient, so the ``[V, H]`` weight gradient is read and written once per group."""
    out: list[list[tuple[int, int]]] = []
    for lo, hi in bounds:
        if out and hi - out[-1][0][0] <= group_rows:
            out[-1].append((lo, hi))
        else:
            out.append([(lo, hi)])
    return out


class _FusedLogProbLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        targets: Tensor,
        loss_fn: TokenLoss,
        bounds: list,
        vocab_chunk: int,
        inv_temp: float,
        group_rows: int,
    ):
        mm = matmul_dtype(weight)
        with torch.autocast(hidden.device.type, enabled=False):  # explicit dtypes below
            return _FusedLogProbLoss._forward(
                ctx, hidden, weight, bias, targets, loss_fn, bounds, vocab_chunk, inv_temp, mm, group_rows
            )

    @staticmethod
    def _forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        targets: Tensor,
        loss_fn: TokenLoss,
        bounds: list,
        vocab_chunk: int,
        inv_temp: float,
        mm: torch.dtype,
        group_rows: int,
    ):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        grads = need_h or need_w or need_b
        n, vocab = hidden.shape[0], weight.shape[0]
        acc = _acc_dtype(hidden)
        dev = hidden.device
        logp = torch.empty(n, device=dev, dtype=acc)
        total = torch.zeros((), device=dev, dtype=acc)
        none = hidden.new_empty(0)  # stands for a gradient that is not needed (never read)
        gh = torch.empty(hidden.shape, device=dev, dtype=acc) if need_h else none
        gw = torch.zeros(weight.shape, device=dev, dtype=acc) if need_w else none
        gb = torch.zeros(vocab, device=dev, dtype=acc) if need_b else none
        # the matmul operands, cast once per call (a micro-batch), never per token chunk: no copy
        # at all when they are already in the matmul dtype (fp32 alone, or the bf16 weight FSDP2
        # gathered), one [V, H] copy for autocast over fp32 master weights (what autocast makes)
        w = weight.detach().to(mm)
        hm = hidden.detach().to(mm)
        bm = None if bias is None else bias.detach().to(acc)
        fast = out_dtype_gemms(dev, mm, acc)
        # mm == acc: the softmax gradient overwrites the tile and each chunk is its own group;
        # else it is written, cast, into the rows of a group buffer that the gradient GEMMs read
        in_place = mm == acc
        groups = token_groups(bounds, 0 if in_place else group_rows)
        max_c = max([hi - lo for lo, hi in bounds], default=0)
        tile_buf = torch.empty(max_c * vocab, device=dev, dtype=acc)  # one tile, reused by every chunk
        dl_buf = None
        if grads and not in_place:
            dl_buf = torch.empty(max(g[-1][1] - g[0][0] for g in groups) * vocab, device=dev, dtype=mm)
        for group in groups:
            g0, g1 = group[0][0], group[-1][1]
            # the group's softmax gradient: its rows of the group buffer, or the tile itself
            # (in place: one chunk per group); unused without gradients
            dl = tile_buf if dl_buf is None else dl_buf
            if grads:
                dl = dl[: (g1 - g0) * vocab].view(g1 - g0, vocab)
            for t0, t1 in group:
                c = t1 - t0
                tile = tile_buf[: c * vocab].view(c, vocab)
                # 1. the chunk's logits, float32, written by the GEMM (no [c, V] copy in the matmul
                # dtype where out_dtype GEMMs run)
                h = hm[t0:t1]
                if in_place:
                    torch.mm(h, w.T, out=tile)
                elif fast:
                    _mm_to(tile, h, w.T)
                else:  # bounded temporaries: one [c, vocab_chunk] slice in the matmul dtype at a time
                    for v0 in range(0, vocab, vocab_chunk):
                        v1 = min(vocab, v0 + vocab_chunk)
                        tile[:, v0:v1].copy_(h @ w[v0:v1].T)
                if bm is not None:
                    tile.add_(bm)
                if inv_temp != 1.0:
                    tile.mul_(inv_temp)
                tg = targets[t0:t1, None]
                tgt_logit = tile.gather(1, tg).squeeze(1)
                m = tile.amax(dim=1)
                tile.sub_(m[:, None]).exp_()  # e = exp(logit - max), kept for the softmax below
                s = tile.sum(dim=1)
                lp = tgt_logit - m - torch.log(s)
                logp[t0:t1] = lp
                # 2. the loss and its derivative with respect to each token's log-prob
                per_tok, g = _token_grads(loss_fn, lp, t0, t1)
                total += per_tok.to(acc).sum()
                if not grads:
                    continue
                # 3. dL/dlogits = inv_temp g (onehot - e / s) = coef (e - s onehot), coef = -inv_temp g / s:
                # the target's entry becomes e - s, then one pass scales (and casts) every entry
                coef = g.to(acc).mul(-inv_temp).div_(s)
                tile.scatter_(1, tg, tile.gather(1, tg).sub_(s[:, None]))
                if need_b:
                    gb.addmv_(tile.T, coef)
                torch.mul(tile, coef[:, None], out=dl[t0 - g0 : t1 - g0])
            if not grads:
                continue
            # 4. the group's gradient GEMMs: hidden rows, and the weight gradient accumulated once
            # per group in float32
            h = hm[g0:g1]
            if need_h:
                if in_place:
                    torch.mm(dl, w, out=gh[g0:g1])
                elif fast:
                    _mm_to(gh[g0:g1], dl, w)
                else:
                    gh[g0:g1] = dl @ w
            if need_w:
                if in_place:
                    gw.addmm_(dl.T, h)
                elif fast:
                    _addmm_to(gw, dl.T, h)
                else:  # bounded temporaries: a vocabulary slice at a time
                    for v0 in range(0, vocab, vocab_chunk):
                        v1 = min(vocab, v0 + vocab_chunk)
                        gw[v0:v1] += dl[:, v0:v1].T @ h
        del tile_buf, dl_buf
        ctx.save_for_backward(gh if need_h else None, gw if need_w else None, gb if need_b else None)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(logp)
        return total, logp

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_logp: Optional[Tensor]):
        if getattr(ctx, "spent", False):
            raise RuntimeError(
                "fused_logprob_loss: its stored gradients are scaled in place, so the "
                "backward pass can run once (retain_graph is not supported)"
            )
        ctx.spent = True
        gh, gw, gb = ctx.saved_tensors
        hd, wd, bd = ctx.dtypes

        def scaled(g: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
            if g is None:
                return None
            g.mul_(grad_total.to(g.dtype))  # in place: no second [V, H] buffer for the weight's
            return g.to(dtype)

        return scaled(gh, hd), scaled(gw, wd), scaled(gb, bd), None, None, None, None, None, None


def _check(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor], temperature: float) -> None:
    if not isinstance(hidden, Tensor) or not isinstance(weight, Tensor) or not isinstance(targets, Tensor):
        raise ValueError("hidden, weight and targets must be torch.Tensors")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if not hidden.dtype.is_floating_point or hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight must share one floating dtype, got {hidden.dtype} and {weight.dtype}")
    if bias is not None and (bias.shape != weight.shape[:1]):
        raise ValueError(f"bias must be [V={weight.shape[0]}], got {tuple(bias.shape)}")
    if targets.shape != hidden.shape[:1] or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int [N={hidden.shape[0]}], got {targets.dtype} {tuple(targets.shape)}")
    if targets.numel():
        lo, hi = torch.stack(torch.aminmax(targets)).tolist()  # one host read
        if lo < 0 or hi >= weight.shape[0]:
            raise ValueError(f"targets must be token ids in [0, {weight.shape[0]})")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def fused_logprob_loss(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    loss_fn: TokenLoss,
    bias: Optional[Tensor] = None,
    *,
    segments: Optional[Sequence[int]] = None,
    token_chunk: Optional[int] = None,
    vocab_chunk: int = 32768,
    tile_elems: int = DEFAULT_TILE_ELEMS,
    group_elems: int = DEFAULT_GROUP_ELEMS,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """``(sum_i loss_fn(logp)_i, logp)`` with ``logp = log softmax(hidden @ weight.T / temperature)
    [i, targets[i]]``, the gradients computed in the forward pass (see the module docstring).

    Args:
        hidden: ``[N, H]`` final hidden states; ``weight`` ``[V, H]`` lm-head (same dtype);
            ``bias`` optional ``[V]``.
        targets: ``[N]`` int token ids in ``[0, V)``.
        loss_fn: :data:`TokenLoss`, ``f(logp_chunk, lo, hi) -> [hi - lo]`` per-token losses.
        segments: optional offsets ``[0, ..., N]`` of segments (e.g. response turns) that a chunk
            never splits: then a token's loss may depend on the log-probs of its whole segment
            (PCSD's windowed weights computed from this very pass's log-probs). A segment longer
            than ``token_chunk`` is a chunk of its own (its tile is ``[len, V]``).
        token_chunk: tokens per tile (default :func:`auto_token_chunk` of ``tile_elems``).
        vocab_chunk: vocabulary slice of one logits or weight-gradient matmul where the GEMMs
            cannot write float32 from bf16 operands themselves (CPU; the tile still spans the
            vocabulary).
        group_elems: where the matmul dtype is not float32 (bf16 under autocast), consecutive
            chunks of at most ``group_elems // V`` tokens together (at least one chunk) share
            the gradient GEMMs: their softmax gradients are written, cast, into one group
            buffer, and the float32 weight gradient is updated once per group.

    Returns:
        the loss, a 0-dim float32 tensor (float64 for float64 inputs) differentiable with respect
        to ``hidden``, ``weight`` and ``bias``; and ``logp`` ``[N]`` (not differentiable: use the
        loss, or :func:`pcsd.ops.scoring.selective_logprobs`, for gradients through log-probs).
    """
    _check(hidden, weight, targets, bias, temperature)
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable (logp, lo, hi) -> per-token losses, got {type(loss_fn).__name__}")
    tc = auto_token_chunk(weight.shape[0], tile_elems) if token_chunk is None else token_chunk
    if tc <= 0 or vocab_chunk <= 0:
        raise ValueError(f"token_chunk and vocab_chunk must be > 0, got {tc} and {vocab_chunk}")
    if group_elems <= 0:
        raise ValueError(f"group_elems must be > 0, got {group_elems}")
    bounds = chunk_bounds(hidden.shape[0], tc, segments)
    group_rows = max(tc, group_elems // max(1, weight.shape[0]))
    return _FusedLogProbLoss.apply(
        hidden, weight, bias, targets.long(), loss_fn, bounds, vocab_chunk, 1.0 / temperature, group_rows
    )


def fused_logprob_loss_reference(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    loss_fn: TokenLoss,
    bias: Optional[Tensor] = None,
    *,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """The plain reference: full ``[N, V]`` logits, ``log_softmax``, gather, the loss on all tokens
    at once, autograd for the gradients."""
    _check(hidden, weight, targets, bias, temperature)
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    acc = _acc_dtype(hidden)
    lp = torch.log_softmax(logits.to(acc) / temperature, dim=-1).gather(1, targets.long()[:, None]).squeeze(1)
    return loss_fn(lp, 0, lp.shape[0]).sum(), lp.detach()


def fused_score_loss(
    model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], loss_fn: TokenLoss, **kw
) -> tuple[Tensor, Tensor]:
    """One forward pass of ``model`` over the ``prompt + response`` sequences (as
    :func:`pcsd.ops.scoring.response_hidden`) and :func:`fused_logprob_loss` of the response
    tokens, concatenated in order, with each response a segment that chunks never split.
    Returns ``(loss, logp [R])``; ``kw`` goes to :func:`fused_logprob_loss`."""
    from pcsd.ops.scoring import lm_head, response_hidden

    hidden, targets, spans = response_hidden(model, prompts, responses)
    weight, bias = lm_head(model)  # after the forward: unsharded there under FSDP
    cu = [0]
    for n in spans:
        cu.append(cu[-1] + n)
    return fused_logprob_loss(hidden, weight, targets, loss_fn, bias, segments=cu, **kw)
