"""Packed rows under FlexAttention (``model.attn_impl=flex``: a document mask, position ids restarting
per sequence, no padding) against the padded path (sdpa, right-padded micro-batches): log-probs and
gradients on random ragged batches in float32 and bf16, and a whole ``update_step``.

torch runs FlexAttention's backward on CUDA only, and transformers compiles the kernel (about 20 s a
shape on this CPU). Here the :func:`eager_flex` fixture calls torch's eager FlexAttention (the same
``flex_attention`` and ``BlockMask``, computed densely) with the CPU gradient check lifted, so what is
compared is pcsd's layout: the packing, the document mask, the restarting position ids and the
un-packing of the hidden states. The compiled kernel's numerics are torch's, measured on a GPU by
``python -m pcsd.bench gpu`` (part ``flex``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcsd.ops.scoring import document_mask, pack_sequences, score_packed, uses_varlen_attention

#: bf16: the packed path's error to float32 is at most K_BF16 x the padded path's (Liger-Kernel's
#: way of bounding a low-precision fast path by the low-precision reference), plus ATOL_BF16 for
#: entries the padded path happens to get exactly right
K_BF16 = 2.0
ATOL_BF16 = 2e-2


@pytest.fixture(scope="module")
def eager_flex():
    """transformers' FlexAttention path with torch's eager ``flex_attention`` in place of the
    compiled one, and gradients allowed on CPU (see the module docstring)."""
    import torch.nn.attention.flex_attention as fa
    import transformers.integrations.flex_attention as tfa

    def eager(query, key, value, training=False, **kwargs):
        return fa.flex_attention(query, key, value, **kwargs)

    def validate(query, key, value):
        if query.device.type not in ("cpu", "cuda"):
            raise ValueError(f"FlexAttention on {query.device.type}")

    mp = pytest.MonkeyPatch()
    mp.setattr(tfa, "compile_friendly_flex_attention", eager)
    mp.setattr(fa, "_validate_device", validate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield
    mp.undo()


def tiny_qwen2(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return Qwen2ForCausalLM(cfg).eval()


def with_attention(model, impl: str):
    m = copy.deepcopy(model)
    m.set_attn_implementation(impl)
    return m


@pytest.fixture(scope="module")
def models(eager_flex):
    base = tiny_qwen2()
    return {impl: with_attention(base, impl) for impl in ("sdpa", "flex_attention")}


def logprobs_and_grads(model, prompts, responses, weights, dtype):
    m = copy.deepcopy(model).to(dtype)
    m.zero_grad()
    lp = torch.cat(score_packed(m, prompts, responses, max_tokens_per_pass=10_000))
    (lp * weights).sum().backward()
    return lp.detach().double(), {n: p.grad.double() for n, p in m.named_parameters()}


ragged = st.lists(
    st.tuples(st.integers(1, 24), st.integers(1, 10)), min_size=1, max_size=6
)  # (prompt length, response length) per sequence


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=ragged, seed=st.integers(0, 2**16))
def test_packed_flex_equals_padded(models, shape, seed):
    """float32: log-probs and every parameter's gradient of ``sum(w * logp)`` within float32 noise;
    bf16: the packed path's error to the float32 padded result at most K_BF16 x the padded bf16 one's."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 300, (p,), generator=g).tolist() for p, _ in shape]
    responses = [torch.randint(1, 300, (r,), generator=g).tolist() for _, r in shape]
    w = torch.randn(sum(r for _, r in shape), generator=g)
    padded, flex = models["sdpa"], models["flex_attention"]
    assert uses_varlen_attention(flex) and not uses_varlen_attention(padded)
    lp_ref, g_ref = logprobs_and_grads(padded, prompts, responses, w, torch.float32)
    lp, grads = logprobs_and_grads(flex, prompts, responses, w, torch.float32)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=2e-5)
    for name, gr in g_ref.items():
        torch.testing.assert_close(grads[name], gr, rtol=1e-4, atol=1e-5, msg=name)
    lp_pad16, g_pad16 = logprobs_and_grads(padded, prompts, responses, w, torch.bfloat16)
    lp16, g16 = logprobs_and_grads(flex, prompts, responses, w, torch.bfloat16)
    assert (lp16 - lp_ref).abs().max() <= K_BF16 * (lp_pad16 - lp_ref).abs().max() + ATOL_BF16
    for name, gr in g_ref.items():
        # + 1e-6: a gradient that is 0 exactly (one-token sequences: softmax over one key), 2e-10 in bf16
        bound = K_BF16 * (g_pad16[name] - gr).abs().max() + ATOL_BF16 * gr.abs().max() + 1e-6
        assert (g16[name] - gr).abs().max() <= bound, name


def test_document_mask_is_causal_within_each_sequence():
    pb = pack_sequences([[1, 2, 3], [4], [5, 6]])
    dense = document_mask(pb.cu_seqlens, 6, torch.device("cpu")).to_dense()  # [1, 1, blocks, blocks]
    assert dense.shape[-1] == 1  # one 128-token block: partial, masked by the mask_mod below
    from torch.nn.attention.flex_attention import create_mask

    mask = document_mask(pb.cu_seqlens, 6, torch.device("cpu"))
    full = create_mask(mask.mask_mod, 1, 1, 6, 6, device="cpu")[0, 0].int().tolist()
    assert full == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]


@pytest.mark.parametrize("method", ["pcsd", "grpo"])
def test_update_step_flex_equals_padded(models, method):
    """One whole update (scoring of reference and teacher, two PPO epochs of packed micro-batches):
    the same statistics and the same updated weights on both paths."""
    from test_fused import _update

    from pcsd.tiny_model import synthetic_rollout_batch

    rb = synthetic_rollout_batch(num_groups=3, group_size=2, vocab_size=300, seed=5)
    out = {}
    for impl, base in models.items():
        frozen = copy.deepcopy(base).eval().requires_grad_(False)
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for p in frozen.parameters():  # reference != student: KL and gaps are not 0
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        out[impl] = _update(base, frozen, rb, method, ["optim.ppo_epochs=2", "optim.joint_frozen_pass=never"])
    (ref, sd_ref), (got, sd) = out["sdpa"], out["flex_attention"]
    for key in ("loss", "pg", "kl", "gap_mean", "clip_frac"):
        if key in ref:
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    for k, v in sd_ref.items():
        torch.testing.assert_close(sd[k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.attn_impl=flex", "model.attn_impl=flex: torch "),  # no FlexAttention backward on CPU
        ("model.attn_impl=flash", "model.attn_impl=flash: flash-attention runs on CUDA only"),
    ],
)
def test_attention_that_cannot_run_here_is_one_line(override, message, tmp_path, capsys):
    """A forced attention the CPU cannot run: exit 2, one line, no run folder; ``--plan`` (a GPU run
    planned from anywhere) takes the key."""
    from pcsd.train.cli import main

    assert main([override, "run.device=cpu", f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "run").exists()
    assert main([override, "preset=alfworld-qwen2.5-3b", "--plan", "--gpus", "1", "--gpu-memory-gb", "80"]) == 0
    assert "packed rows" in capsys.readouterr().out


def test_attention_choice():
    from pcsd.models import attention_choice

    cpu = torch.device("cpu")
    impl, line = attention_choice("auto", cpu)
    assert impl == "sdpa" and line.startswith("attention: padded micro-batches (sdpa): flash-attention runs on CUDA")
    assert attention_choice("sdpa-padded", cpu)[0] == "sdpa"
    with pytest.raises(ValueError, match="model.attn_impl='fast' is not valid; choose one of auto, flash"):
        attention_choice("fast", cpu)


@pytest.mark.parametrize(
    "requested, installed, sliding, want",
    [
        ("auto", {"flash_attn", "triton"}, False, "flash_attention_2"),
        ("auto", {"triton"}, False, "flex_attention"),
        ("flex", {"flash_attn", "triton"}, False, "flex_attention"),
        ("auto", set(), False, "sdpa"),  # no torch.compile GPU backend: padded
        ("auto", {"triton"}, True, "sdpa"),  # sliding-window layers: padded
        ("flex", set(), False, "triton is not installed"),
        ("flash", {"triton"}, False, "flash-attn is not installed"),
    ],
)
def test_attention_choice_on_cuda(monkeypatch, requested, installed, sliding, want):
    """What a CUDA run resolves (no GPU needed: only which libraries are installed is read)."""
    import importlib.util

    from transformers import Qwen2Config

    from pcsd.models import attention_choice

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (real("json") if name in installed else None) if name in ("flash_attn", "triton") else real(name, *a)
        ),
    )
    config = Qwen2Config(use_sliding_window=sliding, sliding_window=64, max_window_layers=0)
    if want in ("flash_attention_2", "flex_attention", "sdpa"):
        impl, line = attention_choice(requested, torch.device("cuda"), config)
        assert impl == want and line.startswith("attention: ")
        assert line.startswith("attention: packed rows") == (want != "sdpa")
    else:
        with pytest.raises(ValueError, match=f"model.attn_impl={requested}: {want}"):
            attention_choice(requested, torch.device("cuda"), config)


def test_bench_flex_part_on_cpu(eager_flex, tmp_path, monkeypatch):
    """``python -m pcsd.bench gpu --parts flex`` in-process, FlexAttention eager (see the module
    docstring) and a shorter batch: both paths timed, the log-probs compared (a check)."""
    from pcsd.bench import gpu

    real = gpu.flex_batch
    monkeypatch.setattr(gpu, "flex_batch", lambda ctx, vocab: tuple(x[:6] for x in real(ctx, vocab)))
    part = gpu.run_part("flex", gpu.Ctx(torch.device("cpu"), True, tmp_path, None))
    assert part.status == "pass", part.reason + part.figures.get("traceback", "")
    f = part.figures
    assert f["mode"] == "forward" and f["sequences"] == 6 and f["padded_positions"] > f["tokens"]
    assert f["packed_flex"]["tokens_per_s"] > 0 and f["padded"]["tokens_per_s"] > 0
    assert f["logp_max_abs_diff"] <= gpu.FLEX_CPU_TOL and "(CPU figure: forward only)" in part.summary
    assert [c["ok"] for c in part.checks] == [True] and len(part.goals) == 1


@pytest.mark.slow
def test_bench_flex_part_compiled_on_cpu(tmp_path, child_env):
    """The part as a user runs it: FlexAttention compiled by torch.compile for the CPU (forward)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pcsd.bench", "gpu", "--device", "cpu", "--small", "--parts", "flex"]
    res = subprocess.run(
        cmd + ["--out", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=child_env
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (part,) = json.loads((tmp_path / "gpu.json").read_text())["parts"]
    assert part["status"] == "pass" and part["figures"]["logp_max_abs_diff"] <= 1e-4, part
