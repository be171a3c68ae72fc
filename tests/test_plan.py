"""``python -m pcsd.train ... --plan``: the memory plan per GPU from the config and the model's
shape, without loading the model; a run whose plan does not fit stops before loading anything."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from pcsd.train.config import load_config
from pcsd.train.plan import BUILTIN_SHAPES, GiB, PlanError, Shape, memory_plan, model_shape

PRESETS = ["alfworld-qwen2.5-3b", "alfworld-qwen3-1.7b"]


def test_builtin_shapes_have_the_published_parameter_counts():
    # Qwen2.5-3B: 3.09 B (2.77 B without embeddings); Qwen3-1.7B: 1.7 B (1.4 B without embeddings)
    q25 = Shape.from_config(BUILTIN_SHAPES["qwen2.5-3b"], "q")
    q3 = Shape.from_config(BUILTIN_SHAPES["qwen3-1.7b"], "q")
    assert q25.params() == pytest.approx(3.086e9, rel=2e-3)
    assert q25.params() - q25.vocab * q25.hidden == pytest.approx(2.77e9, rel=5e-3)
    assert q3.params() == pytest.approx(1.72e9, rel=1e-2)
    assert q3.params() - q3.vocab * q3.hidden == pytest.approx(1.4e9, rel=2e-2)


def test_shape_comes_from_the_model_dirs_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BUILTIN_SHAPES["qwen3-1.7b"]))
    a = memory_plan(load_config(["preset=alfworld-qwen3-1.7b"]), 1, 80 * GiB)
    cfg = load_config(["preset=alfworld-qwen3-1.7b", f"model.path={tmp_path}"])
    b = memory_plan(cfg, 1, 80 * GiB)
    assert model_shape(cfg).name == str(tmp_path) and a.peak == b.peak
    with pytest.raises(PlanError, match="no built-in model shape.*model.path"):
        model_shape(load_config(["preset=tiny-cpu"]))


@pytest.mark.parametrize("preset", PRESETS)
def test_fsdp_divides_weights_gradients_and_adam(preset):
    cfg = load_config([f"preset={preset}"])
    one, four = memory_plan(cfg, 1, 80 * GiB), memory_plan(cfg, 4, 80 * GiB)
    rows1, rows4 = {r[0]: r[1] for r in one.rows}, {r[0]: r[1] for r in four.rows}
    P = model_shape(cfg).params()
    assert rows1["master weights"] == 4 * P and rows1["gradients"] == 4 * P
    assert rows1["AdamW state (2 moments)"] == 8 * P and rows1["frozen teacher/reference"] == 2 * P
    for k in ("master weights", "gradients", "AdamW state (2 moments)", "frozen teacher/reference"):
        assert rows4[k] == rows1[k] // 4, k


def test_each_mesh_keeps_its_share_per_gpu_on_several_nodes():
    """2 nodes x 4 GPUs: HSDP divides the training state by a node's 4 GPUs, the flat mesh by all 8;
    what a rank plays (the rollout lines) and the FSDP update lines are the world's either way, and
    each plan notes the other mesh. One node: both meshes are the 1-D plan of today."""
    cfg = load_config(["preset=alfworld-qwen2.5-3b"])
    hsdp = memory_plan(cfg, 8, 80 * GiB, nodes=2)  # dist.mesh defaults to hsdp
    flat = memory_plan(load_config(["preset=alfworld-qwen2.5-3b", "dist.mesh=flat"]), 8, 80 * GiB, nodes=2)
    four, eight = memory_plan(cfg, 4, 80 * GiB), memory_plan(cfg, 8, 80 * GiB)
    assert (hsdp.mesh, hsdp.shard_size, flat.mesh, flat.shard_size) == ("hsdp", 4, "flat", 8)
    rows = lambda plan: {r.item: r.size for r in plan.rows}  # noqa: E731
    state = ("master weights", "gradients", "AdamW state (2 moments)", "frozen teacher/reference")
    for k in state:
        assert rows(hsdp)[k] == rows(four)[k] and rows(flat)[k] == rows(eight)[k], k
    assert hsdp.static_bytes == four.static_bytes > flat.static_bytes == eight.static_bytes
    for k in ("vLLM (rollout)", "activations (16384 tokens)", "FSDP lm-head weight (fused pass)"):
        assert rows(hsdp)[k] == rows(flat)[k] == rows(eight)[k], k
    assert "this rank plays 16" in hsdp.render()  # 16 x 8 rollouts over 8 ranks, whatever the mesh
    text = hsdp.render()
    assert "2 nodes x 4 GPU(s) of 80 GiB (dist.mesh=hsdp: FSDP shards over the 4 GPUs of a node" in text
    assert f"note: dist.mesh=flat would keep {flat.static_bytes / GiB:.2f} GiB static per GPU" in text
    assert f"note: dist.mesh=hsdp would keep {hsdp.static_bytes / GiB:.2f} GiB static per GPU" in flat.render()
    one = memory_plan(cfg, 8, 80 * GiB, nodes=1)
    assert one.shard_size == 8 and one.render() == eight.render() and "dist.mesh" not in one.render()
    with pytest.raises(ValueError, match="nodes must be >= 1 and divide world_size=8, got 3"):
        memory_plan(cfg, 8, 80 * GiB, nodes=3)


def test_a_mesh_that_does_not_fit_names_the_one_that_does():
    cfg = load_config(["preset=alfworld-qwen2.5-3b"])
    plan = memory_plan(cfg, 16, 26 * GiB, nodes=16)  # HSDP of 1 GPU per node: the whole state per GPU
    assert not plan.fits and "dist.mesh=flat fits" in plan.render(), plan.render()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("gpus,mem", [(1, 80), (4, 80), (8, 40)])
def test_paper_presets_fit_the_documented_machines(preset, gpus, mem):
    plan = memory_plan(load_config([f"preset={preset}"]), gpus, mem * GiB)
    assert plan.fits, plan.render()
    assert "verdict: fits" in plan.render()


def test_a_plan_that_does_not_fit_names_the_setting():
    cfg = load_config(["preset=alfworld-qwen2.5-3b", "optim.gradient_checkpointing=false"])
    plan = memory_plan(cfg, 1, 80 * GiB, varlen=True)
    assert not plan.fits
    text = plan.render()
    assert "does NOT fit" in text and "optim.tokens_per_microbatch to <=" in text
    assert "optim.gradient_checkpointing=true" in text
    fit = int(text.split("optim.tokens_per_microbatch to <= ")[1].split(";")[0])
    at = load_config(
        ["preset=alfworld-qwen2.5-3b", "optim.gradient_checkpointing=false", f"optim.tokens_per_microbatch={fit}"]
    )
    over = load_config(
        ["preset=alfworld-qwen2.5-3b", "optim.gradient_checkpointing=false", f"optim.tokens_per_microbatch={fit + 1}"]
    )
    assert memory_plan(at, 1, 80 * GiB, varlen=True).fits  # the advice is the largest budget that fits
    assert not memory_plan(over, 1, 80 * GiB, varlen=True).fits
    # padded to twice the budget, not even one row's micro-batch fits without checkpointing
    padded = memory_plan(with_keys(cfg, "model.attn_impl=sdpa-padded"), 1, 80 * GiB, varlen=False).render()
    assert "tokens_per_microbatch" not in padded and "more GPUs" in padded
    small = memory_plan(load_config(["preset=alfworld-qwen2.5-3b"]), 1, 40 * GiB)
    assert not small.fits and "more GPUs" in small.render()
    hf = memory_plan(load_config(["preset=alfworld-qwen2.5-3b", "rollout.backend=hf"]), 1, 70 * GiB, varlen=True)
    assert not hf.fits and "the hf backend's generation does not fit" in hf.render()


# ----------------------------------------------------------------------------- the arithmetic, by hand
# Qwen2.5-3B: V = 151,936, H = 2,048, I = 11,008, 36 layers, 16 heads, 2 KV heads of 128, tied, q/k/v bias.
# A layer: q 2048*2048 + k, v 2*2048*256 + o 2048*2048 + MLP 3*2048*11008 + 2 norms 2*2048 + bias 2048+2*256
#        = 4,194,304 + 1,048,576 + 4,194,304 + 67,633,152 + 4,096 + 2,560 = 77,076,992
# P = embeddings 151,936*2,048 (311,164,928) + 36 layers (2,774,771,712) + final norm 2,048 = 3,085,938,688
Q25_P = 3_085_938_688
# Qwen3-1.7B: I = 6,144, 28 layers, 16 heads, 8 KV heads of 128, tied, q/k norms (2*128), no bias.
# A layer: 4,194,304 + 2*2048*1024 (4,194,304) + 4,194,304 + 3*2048*6144 (37,748,736) + 4,096 + 256 = 50,336,000
# P = 311,164,928 + 28 * 50,336,000 (1,409,408,000) + 2,048 = 1,720,574,976
Q3_P = 1_720_574_976
V, H = 151_936, 2_048
HEAD_W = V * H * 4  # 1,244,659,712: the float32 [V, H] lm-head gradient (and the FSDP fused copy)
# fused buffers (bf16 matmuls): the tile, max(2**26 // V = 441, the longest response 512) rows of V float32
# = 311,164,928, and the group buffer, max(2**27 // V = 883, 512) rows of V bf16 = 268,318,976
TILE = 512 * V * 4 + 883 * V * 2


def rows_of(plan):
    return {r.item: r.size for r in plan.rows}


def test_parameter_counts_by_hand():
    assert Shape.from_config(BUILTIN_SHAPES["qwen2.5-3b"], "q").params() == Q25_P
    assert Shape.from_config(BUILTIN_SHAPES["qwen3-1.7b"], "q").params() == Q3_P


def test_qwen25_3b_on_one_80gb_gpu_by_hand():
    cfg = load_config(["preset=alfworld-qwen2.5-3b"])  # checkpointing, 16384 tokens, fused, vLLM 0.25
    # activations per token, checkpointed, fp32 residual (autocast), bf16 compute:
    #   each layer's fp32 input 36*4*2048 = 294,912
    #   one layer recomputed: norms 2*(4*2048 + 2*2048) = 24,576; q,k,v 2*(2048 + 2*256) = 5,120;
    #   attention out 2*2048 + lse 4*16 = 4,160; MLP 2*4*11008 = 88,064; pre-rotary q,k 2*(2048+256) = 4,608
    #   -> 126,528; the final hidden states 4*2048 = 8,192
    per_tok = 294_912 + 126_528 + 8_192  # 429,632 B = 420 KiB
    static = 4 * Q25_P + 4 * Q25_P + 8 * Q25_P + 2 * Q25_P + 2 * GiB  # 57,694,380,032
    lm = HEAD_W + 16_384 * H * 4 + TILE  # [V,H] + [16384,H] + the tile and group buffer = 1,958,361,344
    padded_cfg = with_keys(cfg, "model.attn_impl=sdpa-padded")
    # sdpa: padded to <= 2 x 16384 positions; flash-attention (varlen) and FlexAttention: packed, no padding
    for c, varlen, beyond in ((padded_cfg, False, 16_384 * per_tok), (cfg, True, 0), (cfg, False, 0)):
        plan = memory_plan(c, 1, 80 * GiB, varlen=varlen)
        r = rows_of(plan)
        assert r["AdamW step (fused)"] == 0  # fused=True on CUDA: in place (pcsd.train.optim)
        assert "AdamW step temporaries (foreach)" not in r
        assert r["lm-head gradient buffers"] == lm == 1_958_361_344
        assert r["micro-batch beyond the budget"] == beyond
        assert r["activations (16384 tokens)"] == 16_384 * per_tok == 7_039_090_688
        assert r["vLLM CUDA graphs (asleep)"] == GiB
        assert "FSDP lm-head weight (fused pass)" not in r
        assert plan.static_bytes == static
        micro = 2 * Q25_P + 16_384 * per_tok + beyond + lm + GiB  # autocast's bf16 weights ... graphs
        assert plan.microbatch_bytes == micro and plan.step_bytes == GiB  # the step: vLLM's graphs alone
        assert plan.rollout_bytes == 20 * GiB
        assert plan.peak == static + max(20 * GiB, micro)
        # torch's default foreach AdamW: sqrt of the fp32 second moments, a parameter-sized temporary
        foreach = memory_plan(c, 1, 80 * GiB, varlen=varlen, adamw="foreach")
        assert rows_of(foreach)["AdamW step temporaries (foreach)"] == 4 * Q25_P == 12_343_754_752
        assert foreach.step_bytes == 4 * Q25_P + GiB and foreach.peak == plan.peak  # the micro-batch is larger
    assert memory_plan(padded_cfg, 1, 80 * GiB, varlen=False).peak == 80_976_541_952  # 75.42 GiB: fits, 94 %
    # packed without flash-attention (FlexAttention): the 6.56 GiB of padding are gone, the
    # micro-batch (16.6 GiB above the static lines) falls below vLLM's 20 GiB share, which is the peak
    flex = memory_plan(cfg, 1, 80 * GiB, varlen=False)
    assert flex.microbatch_bytes == 2 * Q25_P + 16_384 * per_tok + lm + GiB < 20 * GiB
    assert flex.peak == static + 20 * GiB == 79_169_216_512
    with pytest.raises(ValueError, match="adamw must be fused or foreach"):
        memory_plan(cfg, 1, 80 * GiB, adamw="sgd")
    # vLLM's KV cache: 20 GiB - bf16 weights 2P - 1 GiB activations - 1 GiB graphs = 13,155,475,456 B;
    # a 2560-token sequence needs 2560 * 2 * 36 * 2 * 128 * 2 = 94,371,840 B -> 139 at once
    kv_row = [r for r in memory_plan(cfg, 1, 80 * GiB).rows if r.item == "  of which KV cache"][0]
    assert kv_row.size == 20 * GiB - 2 * Q25_P - 2 * GiB == 13_155_475_456 and "~139 sequences" in kv_row.how


def test_qwen3_17b_on_8_40gb_gpus_by_hand():
    cfg = load_config(["preset=alfworld-qwen3-1.7b", "model.attn_impl=sdpa-padded"])
    plan = memory_plan(cfg, 8, 40 * GiB, varlen=False)
    r = rows_of(plan)
    assert r["AdamW step (fused)"] == 0
    assert (
        rows_of(memory_plan(cfg, 8, 40 * GiB, varlen=False, adamw="foreach"))["AdamW step temporaries (foreach)"]
        == 4 * Q3_P // 8
        == 860_287_488
    )
    assert r["FSDP lm-head weight (fused pass)"] == HEAD_W  # gathered once per micro-batch, float32
    assert r["lm-head gradient buffers"] == HEAD_W + 16_384 * H * 4 + TILE
    # FSDP2: the unsharded root (embeddings + final norm: 311,164,928 + 2,048) + 2 layers, in bf16
    assert r["compute-dtype weights (update)"] == (311_166_976 + 2 * 50_336_000) * 2 == 823_677_952
    # activations per token under FSDP (bf16 residual): inputs 28*2*2048 = 114,688; one layer: norms
    # 2*(2*2048 + 2*2048) = 16,384, q,k,v 2*(2048 + 2*1024) = 8,192, attention out 2*2048 + 64 = 4,160,
    # MLP 2*4*6144 = 49,152, pre-rotary q,k 2*(2048 + 1024) = 6,144 -> 84,032; final hidden 8,192
    per_tok = 114_688 + 84_032 + 8_192  # 206,912
    assert r["activations (16384 tokens)"] == 16_384 * per_tok
    assert r["micro-batch beyond the budget"] == 16_384 * per_tok
    assert plan.static_bytes == (4 + 4 + 8 + 2) * Q3_P // 8 + 2 * GiB  # P is a multiple of 8
    micro = 823_677_952 + 2 * 16_384 * per_tok + (HEAD_W + 16_384 * H * 4 + TILE) + HEAD_W + GiB
    assert plan.microbatch_bytes == micro
    assert plan.step_bytes == GiB
    assert plan.peak == plan.static_bytes + max(int(0.25 * 40 * GiB), micro)
    assert plan.fits


def test_hf_backend_generation_is_counted_by_hand():
    cfg = load_config(["preset=alfworld-qwen2.5-3b", "rollout.backend=hf"])
    r = rows_of(memory_plan(cfg, 1, 80 * GiB, varlen=True))
    # 64 sequences at once (HFBackend.max_batch; the rank plays 128) of 2048 + 512 tokens, the KV
    # cache in float32 (K after the fp32 rotary, V promoted to K's dtype): 73,728 B per token
    kv_tok = 2 * 36 * 2 * 128 * 4
    # the prefill at one layer's MLP: four fp32 residual-stream tensors, fp32 cos + sin, gate/up/product
    prefill = 64 * 2_048 * (4 * 4 * 2_048 + 2 * 4 * 128 + 3 * 2 * 11_008)  # 99,840 B per token
    at_prefill = 64 * 2_048 * kv_tok + prefill  # with the prompts' KV: 22,749,904,896
    at_decode = 64 * 2_560 * kv_tok * 37 // 36 + 64 * V * (4 * 4 + 8)  # the whole KV (+ a layer's grown copy) + logits
    assert r["hf generation (KV, prefill, logits)"] == max(at_prefill, at_decode) == 22_749_904_896
    # without flash-attention sdpa's [B, 1, L, L] bool mask is held through the prefill
    padded = rows_of(memory_plan(cfg, 1, 80 * GiB, varlen=False))
    assert padded["hf generation (KV, prefill, logits)"] == at_prefill + 64 * 2_048 * 2_048
    assert r["hf generation: cast weights"] == 2 * Q25_P
    assert "vLLM (rollout)" not in r and "vLLM CUDA graphs (asleep)" not in r
    # sharded: every rank keeps a full bf16 copy to generate with (static), 32 sequences per rank
    four = memory_plan(cfg, 4, 80 * GiB, varlen=True)
    r4 = rows_of(four)
    assert r4["hf generation copy (full)"] == 2 * Q25_P
    # a bf16 model (no autocast): the stream and the KV cache in bf16
    assert r4["hf generation (KV, prefill, logits)"] == 32 * 2_048 * 36_864 + 32 * 2_048 * (
        4 * 2 * 2_048 + 2 * 2 * 128 + 3 * 2 * 11_008
    )
    assert four.static_bytes == (4 * Q25_P // 4) * 2 + 8 * Q25_P // 4 + 2 * Q25_P // 4 + 2 * GiB + 2 * Q25_P


def test_hf_batch_is_the_backends():
    import inspect

    from pcsd.rollout.backends import HFBackend
    from pcsd.train.plan import HF_MAX_BATCH

    assert inspect.signature(HFBackend.__init__).parameters["max_batch"].default == HF_MAX_BATCH


def with_keys(cfg, *keys):
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(keys)))


@pytest.mark.parametrize(
    "attn, varlen, flex, packer",
    [
        ("auto", True, True, "flash-attention"),
        ("auto", False, True, "FlexAttention"),
        ("flex", False, True, "FlexAttention"),
        ("flash", False, True, "flash-attention"),
        ("sdpa-padded", True, True, None),
        ("auto", False, False, None),  # a torch without FlexAttention pads
    ],
)
def test_packed_update_counts_no_padding(monkeypatch, attn, varlen, flex, packer):
    """The "beyond the budget" line: 0 for packed rows (flash-attention, or FlexAttention where
    flash-attention is absent), the padding up to 2 x the budget for padded rows."""
    import sys

    from pcsd.train.plan import config_microbatch

    if not flex:
        monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)  # its import fails
    cfg = load_config(["preset=alfworld-qwen2.5-3b", f"model.attn_impl={attn}"])
    mb = config_microbatch(cfg, varlen)
    beyond = rows_of(memory_plan(cfg, 1, 80 * GiB, varlen=varlen))["micro-batch beyond the budget"]
    if packer is None:
        assert mb.tokens == 2 * 16_384 and mb.how.startswith("padded rows")
        assert beyond == 16_384 * 429_632  # 6.56 GiB
    else:
        assert mb.tokens == 16_384 and mb.how == f"{packer}: packed rows" and beyond == 0


def test_predict_update_for_a_batch_by_hand():
    from pcsd.train.plan import batch_microbatch, predict_update

    cfg = load_config(
        [
            "preset=alfworld-qwen2.5-3b",
            "optim.tokens_per_microbatch=100",
            "rollout.max_prompt_tokens=80",
            "rollout.max_response_tokens=20",
        ]
    )
    prompts, responses = [10, 80, 60, 5], [5, 5, 10, 0]  # sizes 15, 85 | 70 | (no response: left out)
    padded = batch_microbatch(cfg, prompts, responses, varlen=False)
    assert (padded.tokens, padded.base, padded.response_tokens, padded.longest_response) == (170, 100, 10, 10)
    packed = batch_microbatch(cfg, prompts, responses, varlen=True)
    assert (packed.tokens, packed.base, packed.response_tokens) == (100, 100, 10)
    plan = predict_update(cfg, prompts, responses, varlen=False)
    r = rows_of(plan)
    assert "CUDA context + slack" not in r and "vLLM (rollout)" not in r and "vLLM CUDA graphs (asleep)" not in r
    assert plan.static_bytes == 18 * Q25_P
    assert r["activations (100 tokens)"] == 100 * 429_632
    assert r["micro-batch beyond the budget"] == 70 * 429_632
    # the fused buffers have no more rows than the call's 10 tokens: a [10, V] float32 tile, a [10, V] bf16 group
    assert r["lm-head gradient buffers"] == HEAD_W + 10 * H * 4 + 10 * V * 4 + 10 * V * 2
    micro = 2 * Q25_P + 170 * 429_632 + r["lm-head gradient buffers"]
    assert plan.update_bytes == micro and r["AdamW step (fused)"] == 0  # fused AdamW: the micro-batch peaks
    foreach = predict_update(cfg, prompts, responses, varlen=False, adamw="foreach")
    assert foreach.update_bytes == max(micro, 4 * Q25_P) == 4 * Q25_P  # foreach's temporary would peak here


def test_cli_plan_prints_and_loads_nothing(capsys, monkeypatch):
    from pcsd.train import cli

    monkeypatch.setattr("pcsd.models.load_model", lambda *a, **k: pytest.fail("--plan loaded a model"))
    assert cli.main(["preset=alfworld-qwen3-1.7b", "--plan", "--gpus", "8", "--gpu-memory-gb=40"]) == 0
    out = capsys.readouterr().out
    assert "8 GPU(s) of 40 GiB" in out and "verdict: fits" in out
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--gpu-memory-gb", "24"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--nodes", "2", "--gpus=8", "dist.mesh=flat"]) == 0
    out = capsys.readouterr().out
    assert "2 nodes x 8 GPU(s) of 80 GiB (dist.mesh=flat: FSDP shards over all 16 GPUs)" in out
    assert "master weights" in out and "float32, / 16" in out and "note: dist.mesh=hsdp would keep" in out
    monkeypatch.setenv("WORLD_SIZE", "8")  # under torchrun: the launch's layout by default
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--gpu-memory-gb=80"]) == 0
    assert "2 nodes x 4 GPU(s) of 80 GiB (dist.mesh=hsdp" in capsys.readouterr().out
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--gpus", "0"]) == 2
    assert "--gpus must be > 0" in capsys.readouterr().err
    for args, message in (
        (["--gpu-memory-gb", "nan"], "--gpu-memory-gb must be a finite number, got 'nan'"),
        (["--gpu-memory-gb=inf"], "--gpu-memory-gb must be a finite number, got 'inf'"),
        (["--gpu-memory-gb", "1e9"], "--gpu-memory-gb must be at most 4096, got 1e+09"),
        (["--gpus", str(10**12)], "--gpus must be at most 65536, got 1e+12"),
        (["--gpus", "1.5"], "--gpus must be a whole number, got '1.5'"),
        (["--nodes", "0"], "--nodes must be > 0, got 0"),
        (["--nodes", "300", "--gpus", "300"], "--nodes x --gpus must be at most 65536, got 300 x 300"),
    ):
        assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", *args]) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"pcsd.train: {message}", err


def test_a_run_whose_plan_cannot_fit_stops_before_loading(capsys, monkeypatch):
    from pcsd.train import cli

    monkeypatch.setattr("pcsd.train.plan.device_memory_bytes", lambda: 16 * GiB)  # as if on a 16 GB GPU
    monkeypatch.setattr("pcsd.train.job.train", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.setattr("pcsd.train.distributed.init_distributed", lambda **k: pytest.fail("the run started"))
    assert cli.main(["preset=alfworld-qwen2.5-3b", "run.device=cuda"]) == 2
    err = capsys.readouterr().err
    assert "does NOT fit" in err and "does not fit this GPU" in err


def test_a_known_hub_id_offline_plans_with_its_built_in_shape(capsys, monkeypatch, tmp_path):
    """``model.path=Qwen/Qwen2.5-3B-Instruct --plan`` with the Hub unreachable and nothing cached:
    the built-in shape of that model, one line saying so (before: six retries, then an error); an id
    of no built-in shape is looked up as before."""
    import socket

    import huggingface_hub.constants as hc

    from pcsd.train.cli import main

    def unreachable(*a, **k):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing cached
    monkeypatch.setattr(socket, "create_connection", unreachable)  # no network
    assert main(["preset=alfworld-qwen2.5-3b", "model.path=Qwen/Qwen2.5-3B-Instruct", "--plan"]) == 0
    out, err = capsys.readouterr()
    assert "memory plan per GPU: qwen2.5-3b (built-in), 3.09 B parameters" in out
    assert err.splitlines() == [
        "pcsd.train: model.path=Qwen/Qwen2.5-3B-Instruct: not cached and the Hugging Face Hub cannot be reached; "
        "the plan uses the built-in shape of qwen2.5-3b"
    ]
    from pcsd.train.plan import _builtin_for_unreachable_id

    assert _builtin_for_unreachable_id("acme/other-7b") is None  # no built-in shape: the Hub's or the error
