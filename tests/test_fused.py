"""The fused lm-head + per-token loss (pcsd.ops.fused) against its two references: plain autograd on
full logits and the recomputing chunked path (pcsd.ops.scoring.selective_logprobs), for every
method's loss; then update_step with optim.fused_lm_head / optim.joint_frozen_pass on and off."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import pcsd.ops.fused as fused_mod
from pcsd.ops.fused import (
    auto_token_chunk,
    chunk_bounds,
    fused_logprob_loss,
    fused_logprob_loss_reference,
    fused_score_loss,
    token_groups,
)
from pcsd.ops.grpo import token_coefficients
from pcsd.ops.losses import LossSpec, TokenTerms, update_token_loss
from pcsd.ops.policy_losses import get_policy_loss
from pcsd.ops.scoring import score_packed, selective_logprobs, selective_logprobs_naive
from pcsd.ops.weighting import NO_RULE, active_rule
from pcsd.train.fused_update import joint_scores, pair_microbatches

METHOD_LOSSES = ["grpo", "pcsd", "sdar", "uniform", "rlsd", "opsd", "skill-sd", "sdar-norm", "pcsd-fixed-n4"]


def _algo(method: str):
    return OmegaConf.create(dict(grpo=method != "opsd", clip_eps=0.2, kl_beta=0.05, lambda_distill=0.5))


def method_loss(method: str, n: int, cu: list[int], gen: torch.Generator, dtype, masked: bool, scored: torch.Tensor):
    """A per-token loss of ``method`` over ``n`` tokens in segments ``cu``: the update's one per-token
    loss (pcsd.ops.losses.update_token_loss) with old log-probs taken from the pass itself (one PPO
    epoch, as update_step does), random advantages, coefficients, reference and teacher, and a mask.

    The rule's terms are made once for all ``n`` tokens from the gaps ``teacher - scored``
    (``scored``: the tokens' log-probs), as the update makes them for a micro-batch before its
    passes, and each chunk reads its slice. Made per chunk, the float32 gates could differ by one
    ulp between two chunkings of the same tokens (a vectorised body against a scalar tail: a 1e-7
    relative difference in the float64 gradients, seed 206 of the sdar case)."""
    algo = _algo(method)
    ref = torch.randn(n, generator=gen, dtype=dtype) - 4
    teacher = torch.randn(n, generator=gen, dtype=dtype) - 4
    traj = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.tensor(cu).diff())
    adv = torch.randn(len(cu) - 1, generator=gen, dtype=dtype)[traj]
    mask = torch.rand(n, generator=gen) > 0.25 if masked else torch.ones(n, dtype=torch.bool)
    coef = token_coefficients(mask, traj, len(cu) - 1, "seq-mean-token-mean").to(dtype)
    rule = active_rule({"opsd": "sdar"}.get(method, method), True) if method != "grpo" else NO_RULE
    policy = get_policy_loss("ppo") if algo.grpo else None
    spec = LossSpec(policy, algo, algo.kl_beta, algo.lambda_distill, max(float(mask.sum()), 1.0))
    whole = TokenTerms(
        old_logp=scored,
        advantages=adv,
        coef=coef,
        mask=mask,
        traj_ids=traj,
        segments=tuple(cu),
        gap=(teacher - scored).float(),  # the native weights take float32 gaps
        ref_logp=ref,
        teacher_logp=teacher,
    )
    r = rule.terms(whole, 7)
    terms = replace(
        whole,
        advantages=r.advantages.to(dtype),
        weights=None if r.weights is None else r.weights.to(dtype),
        rule_loss=r.loss,
    )

    def loss(lp, lo, hi):
        return update_token_loss(lp, replace(terms.slice(lo, hi), old_logp=lp.detach()), spec).total

    return loss


def _segments(gen, n_seg, max_len):
    lens = torch.randint(1, max_len + 1, (n_seg,), generator=gen).tolist()
    cu = [0]
    for x in lens:
        cu.append(cu[-1] + x)
    return cu


def _grads(fn, h, w, b):
    for t in (h, w, b):
        if t is not None:
            t.grad = None
    loss, lp = fn()
    (loss * 1.7).backward()  # the backward scales the stored gradients by the incoming one
    return loss.detach(), lp.detach(), h.grad.clone(), w.grad.clone(), None if b is None else b.grad.clone()


def _check_all(method, seed, n_seg, max_len, vocab, hid, tc, vc, dtype, bias, temperature, masked):
    gen = torch.Generator().manual_seed(seed)
    cu = _segments(gen, n_seg, max_len)
    n = cu[-1]
    h = torch.randn(n, hid, generator=gen, dtype=dtype, requires_grad=True)
    w = (torch.randn(vocab, hid, generator=gen, dtype=dtype) * hid**-0.5).requires_grad_(True)
    b = torch.randn(vocab, generator=gen, dtype=dtype, requires_grad=True) if bias else None
    t = torch.randint(0, vocab, (n,), generator=gen)
    with torch.no_grad():
        scored = selective_logprobs_naive(h, w, t, b, temperature=temperature)
    loss_fn = method_loss(method, n, cu, gen, dtype, masked, scored)

    fused = _grads(
        lambda: fused_logprob_loss(
            h, w, t, loss_fn, b, segments=cu, token_chunk=tc, vocab_chunk=vc, temperature=temperature
        ),
        h,
        w,
        b,
    )
    full = _grads(lambda: fused_logprob_loss_reference(h, w, t, loss_fn, b, temperature=temperature), h, w, b)

    def chunked():  # the recomputing path: log-probs with autograd, then the loss on all tokens
        lp = selective_logprobs(h, w, t, b, token_chunk=tc, vocab_chunk=vc, temperature=temperature)
        return loss_fn(lp, 0, n).sum(), lp

    recomp = _grads(chunked, h, w, b)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-6)
    for other in (full, recomp):
        for a, c in zip(fused, other):
            if a is not None:
                torch.testing.assert_close(a, c.to(a.dtype), **tol)
    # the weight gradient is not trivially zero wherever the loss depends on the log-probs (it does
    # not when every token is masked, e.g. one token drawn as masked)
    lp0 = full[1].clone().requires_grad_(True)
    (d,) = torch.autograd.grad(loss_fn(lp0, 0, n).sum(), lp0, allow_unused=True)
    if d is not None and float(d.abs().max()) > 0:
        assert float(fused[3].abs().max()) > 0


@settings(max_examples=12, deadline=None)
@given(
    method=st.sampled_from(METHOD_LOSSES),
    seed=st.integers(0, 10_000),
    n_seg=st.integers(1, 6),
    max_len=st.integers(1, 9),
    vocab=st.integers(2, 300),
    hid=st.integers(1, 12),
    tc=st.integers(1, 20),
    vc=st.integers(1, 128),
    bias=st.booleans(),
    temperature=st.sampled_from([1.0, 0.6]),
    masked=st.booleans(),
)
def test_fused_matches_references_float64(method, seed, n_seg, max_len, vocab, hid, tc, vc, bias, temperature, masked):
    _check_all(method, seed, n_seg, max_len, vocab, hid, tc, vc, torch.float64, bias, temperature, masked)


@pytest.mark.parametrize("method", METHOD_LOSSES)
def test_fused_matches_references_float32(method):
    _check_all(
        method,
        3,
        n_seg=12,
        max_len=20,
        vocab=3000,
        hid=32,
        tc=40,
        vc=700,
        dtype=torch.float32,
        bias=False,
        temperature=1.0,
        masked=True,
    )


def test_edge_cases():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 4, generator=g, requires_grad=True)
    # no tokens: zero loss, zero gradients
    h = torch.zeros(0, 4, requires_grad=True)
    loss, lp = fused_logprob_loss(h, w, torch.zeros(0, dtype=torch.long), lambda x, lo, hi: -x)
    loss.backward()
    assert float(loss.detach()) == 0 and lp.shape == (0,) and float(w.grad.abs().sum()) == 0
    # a loss that does not depend on the log-probs: no gradient; a vocabulary of one: logp = 0
    h = torch.randn(5, 4, generator=g, requires_grad=True)
    loss, _ = fused_logprob_loss(h, w, torch.zeros(5, dtype=torch.long), lambda x, lo, hi: torch.ones_like(x))
    loss.backward()
    assert float(loss.detach()) == 5 and float(h.grad.abs().sum()) == 0
    w1 = torch.randn(1, 4, requires_grad=True)
    loss, lp = fused_logprob_loss(h.detach(), w1, torch.zeros(5, dtype=torch.long), lambda x, lo, hi: -x)
    assert float(lp.abs().max()) == 0
    # extreme logits stay finite
    hb = torch.full((3, 4), 1e3, requires_grad=True)
    loss, lp = fused_logprob_loss(hb, w.detach(), torch.tensor([0, 1, 2]), lambda x, lo, hi: -x)
    loss.backward()
    assert bool(torch.isfinite(lp).all()) and bool(torch.isfinite(hb.grad).all())
    # frozen weight: only the hidden gradient is built
    h2 = torch.randn(6, 4, generator=g, requires_grad=True)
    loss, _ = fused_logprob_loss(h2, w.detach(), torch.arange(6), lambda x, lo, hi: -x)
    loss.backward()
    assert h2.grad is not None


def test_backward_runs_once():
    h = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(9, 3, requires_grad=True)
    loss, _ = fused_logprob_loss(h, w, torch.arange(4), lambda x, lo, hi: -x)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once"):
        loss.backward()


def test_chunk_bounds_keep_segments_whole():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(10, 4, [0, 3, 5, 9, 10]) == [(0, 3), (3, 5), (5, 9), (9, 10)]
    assert chunk_bounds(10, 6, [0, 3, 5, 9, 10]) == [(0, 5), (5, 10)]
    assert chunk_bounds(10, 2, [0, 10]) == [(0, 10)]  # a longer segment is a chunk of its own
    assert chunk_bounds(0, 2, [0]) == []
    assert auto_token_chunk(151_936) == (1 << 26) // 151_936 == 441 and auto_token_chunk(10**9) == 1


def test_token_groups_gather_consecutive_chunks():
    assert token_groups([(0, 3), (3, 5), (5, 9), (9, 10)], 5) == [[(0, 3), (3, 5)], [(5, 9), (9, 10)]]
    assert token_groups([(0, 3), (3, 5)], 0) == [[(0, 3)], [(3, 5)]]  # each chunk its own group
    assert token_groups([(0, 8), (8, 9)], 4) == [[(0, 8)], [(8, 9)]]  # a longer chunk alone
    assert token_groups([], 4) == []


def _fast_gemms_emulated(monkeypatch, calls: list):
    """The CUDA fast path (GEMMs writing float32 from bf16 operands) emulated on the CPU: the
    products of the bf16 operands summed in float32, into ``out``."""

    def mm_to(out, a, b):
        calls.append("mm")
        out.copy_(a.float() @ b.float())

    def addmm_to(out, a, b):
        calls.append("addmm")
        out.add_(a.float() @ b.float())

    monkeypatch.setattr(fused_mod, "_mm_to", mm_to)
    monkeypatch.setattr(fused_mod, "_addmm_to", addmm_to)
    monkeypatch.setattr(fused_mod, "out_dtype_gemms", lambda dev, mm, acc: mm != acc)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    vocab=st.integers(2, 200),
    tc=st.integers(1, 16),
    group=st.integers(1, 64),
    fast=st.booleans(),
    bias=st.booleans(),
    temperature=st.sampled_from([1.0, 0.6]),
)
def test_bf16_groups_match_float64(seed, n, vocab, tc, group, fast, bias, temperature):
    """Under bf16 autocast (matmul dtype bf16, float32 tile): any chunking and grouping, with the
    GEMMs' float32-output fast path (emulated) or the sliced fallback, gives the float64
    reference's loss, log-probs and gradients within bf16's rounding of the softmax gradient."""
    with pytest.MonkeyPatch.context() as mp:
        calls: list = []
        if fast:
            _fast_gemms_emulated(mp, calls)
        g = torch.Generator().manual_seed(seed)
        hid = 8
        h = torch.randn(n, hid, generator=g).bfloat16().float().requires_grad_(True)
        w = (torch.randn(vocab, hid, generator=g) * hid**-0.5).bfloat16().float().requires_grad_(True)
        b = torch.randn(vocab, generator=g).bfloat16().float().requires_grad_(True) if bias else None
        t = torch.randint(0, vocab, (n,), generator=g)
        coef = torch.randn(n, generator=g, dtype=torch.float64)

        def loss_fn(lp, lo, hi):
            return coef[lo:hi].to(lp.dtype) * lp - 0.05 * lp**2

        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = _grads(
                lambda: fused_logprob_loss(
                    h,
                    w,
                    t,
                    loss_fn,
                    b,
                    token_chunk=tc,
                    group_elems=group * vocab,
                    vocab_chunk=7,
                    temperature=temperature,
                ),
                h,
                w,
                b,
            )
        h64, w64 = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
        b64 = None if b is None else b.detach().double().requires_grad_(True)
        ref = _grads(
            lambda: fused_logprob_loss_reference(h64, w64, t, loss_fn, b64, temperature=temperature), h64, w64, b64
        )
        for a, r in zip(got, ref):
            if a is not None:
                err = float((a.double() - r).norm() / r.norm().clamp_min(1e-30))
                assert err < 2e-2 or float((a.double() - r).abs().max()) < 1e-3, err
        if fast:  # one weight-gradient GEMM per group of chunks, not one per chunk
            n_groups = len(token_groups(chunk_bounds(n, tc), max(tc, group)))
            assert calls.count("addmm") == n_groups


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(hidden=torch.randn(3)), "hidden must be"),
        (dict(weight=torch.randn(5, 3)), "hidden must be"),
        (dict(weight=torch.randn(9, 4, dtype=torch.float64)), "dtype"),
        (dict(targets=torch.tensor([0, 1, 9, 2])), "token ids"),
        (dict(targets=torch.zeros(4)), "targets must be int"),
        (dict(bias=torch.randn(3)), "bias must be"),
        (dict(loss_fn=3), "loss_fn must be callable"),
        (dict(loss_fn=lambda x, lo, hi: x.sum()), "loss_fn must return the per-token losses"),
        (dict(temperature=0.0), "temperature"),
        (dict(token_chunk=0), "token_chunk"),
        (dict(segments=[0, 2]), "segments"),
    ],
)
def test_bad_input_names_the_argument(bad, match):
    args = dict(
        hidden=torch.randn(4, 4),
        weight=torch.randn(9, 4),
        targets=torch.arange(4),
        loss_fn=lambda x, lo, hi: -x,
        bias=None,
        temperature=1.0,
        token_chunk=None,
        segments=None,
    )
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        fused_logprob_loss(args.pop("hidden"), args.pop("weight"), args.pop("targets"), args.pop("loss_fn"), **args)


# ----------------------------------------------------------------------------- with a model
def tiny_qwen2(vocab=300, seed=0, tie=False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("tie", [False, True])
def test_fused_score_loss_matches_score_packed(tie):
    model = tiny_qwen2(tie=tie)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (4, 1, 7)]
    coef = torch.rand(12, generator=gen)
    loss, lp = fused_score_loss(model, prompts, responses, lambda x, lo, hi: -coef[lo:hi] * x, token_chunk=3)
    loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ref_lp = torch.cat(score_packed(model, prompts, responses))
    (-(coef * ref_lp).sum()).backward()
    torch.testing.assert_close(lp, ref_lp.detach(), rtol=1e-5, atol=1e-6)
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad, rtol=1e-4, atol=1e-6, msg=k)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from pcsd.models import load_model
    from pcsd.tiny_model import make_tiny_model

    d = make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, seed=3)
    base = load_model(d, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(base).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():  # reference != student: the KL term and its gradient are not 0
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return base, frozen


def _update(base, frozen, rb, method, extra):
    from pcsd.train.config import load_config
    from pcsd.train.update import update_step

    cfg = load_config(
        [
            f"method={method}",
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=96",
            "rollout.max_prompt_tokens=64",
            "rollout.max_response_tokens=32",
            "optim.grad_clip=1e9",
        ]
        + extra
    )
    m = copy.deepcopy(base)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)  # updated weights = w - lr g: compares gradients
    stats = update_step(m, frozen, opt, rb, cfg, step=3)
    return stats, m.state_dict()


@pytest.mark.parametrize(
    "method", ["pcsd", "sdar", "sdar-norm", "grpo+opsd", "rlsd", "grpo", "opsd", "pcsd-no-decay", "skill-sd"]
)
@pytest.mark.parametrize("epochs", [1, 2])
def test_update_step_fused_equals_recomputing(tiny_pair, method, epochs):
    from pcsd.tiny_model import synthetic_rollout_batch

    base, frozen = tiny_pair
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    extra = [f"optim.ppo_epochs={epochs}", "optim.joint_frozen_pass=never"]
    ref, sd_ref = _update(base, frozen, rb, method, extra + ["optim.fused_lm_head=false"])
    got, sd = _update(base, frozen, rb, method, extra + ["optim.fused_lm_head=true"])
    for key in ("loss", "pg", "kl", "pcsd", "clip_frac", "gap_mean", "weight_mean", "gate_activation", "entropy_proxy"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    before = base.state_dict()
    moved = 0
    for k, v in sd_ref.items():
        torch.testing.assert_close(sd[k], v, rtol=1e-5, atol=2e-7, msg=k)
        moved += int(not torch.equal(v, before[k]))
    assert moved == len(sd_ref)  # every parameter was trained, lm-head included


def test_joint_frozen_pass_equals_two_passes(tiny_pair):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import microbatches, scores

    _, frozen = tiny_pair
    rb = synthetic_rollout_batch(num_groups=4, group_size=3, seed=11, skill_len=9)
    T = rb.num_tokens()
    mbs = microbatches(rb, 120)
    ref = scores(frozen, rb.prompt_ids, rb.response_ids, mbs, len(mbs), T)
    teacher = scores(frozen, rb.teacher_prompt_ids, rb.response_ids, mbs, len(mbs), T)
    pairs = pair_microbatches(rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, 120)
    assert len(pairs) > 1 and sorted(i for p in pairs for i in p) == [i for i, r in enumerate(rb.response_ids) if r]
    j_ref, j_teacher = joint_scores(
        frozen, rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, pairs, len(pairs) + 1, T
    )  # one padding pass too
    torch.testing.assert_close(j_ref, ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(j_teacher, teacher, rtol=0, atol=2e-6)
    assert not torch.equal(ref, teacher)
    with pytest.raises(ValueError, match="budget"):
        pair_microbatches(rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, 0)


@pytest.mark.parametrize("method", ["pcsd", "rlsd"])
def test_update_step_joint_pass_equals_two_passes(tiny_pair, method):
    from pcsd.tiny_model import synthetic_rollout_batch

    base, frozen = tiny_pair
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    ref, sd_ref = _update(base, frozen, rb, method, ["optim.joint_frozen_pass=never"])
    got, sd = _update(base, frozen, rb, method, ["optim.joint_frozen_pass=always"])
    for key in ("loss", "pg", "kl", "pcsd", "gap_mean", "weight_mean"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    for k, v in sd_ref.items():
        torch.testing.assert_close(sd[k], v, rtol=1e-5, atol=2e-7, msg=k)


def test_fused_buffer_bytes():
    v = 151_936
    assert fused_mod.fused_buffer_bytes(v, matmul_bytes=4) == 441 * v * 4
    assert fused_mod.fused_buffer_bytes(v) == 441 * v * 4 + 883 * v * 2
    assert fused_mod.fused_buffer_bytes(v, longest_segment=2000) == 2000 * v * 4 + 2000 * v * 2
