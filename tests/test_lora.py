"""LoRA (issue 28 part 1, :mod:`pcsd.lora`): the teacher and the reference are the base with its
adapters off, exactly a separately loaded frozen copy; a LoRA update equals a hand-computed step;
every method and estimator trains the adapters alone; the merged weights; config errors; the plan's
LoRA lines. The end-to-end runs (checkpoints, kill -9 and resume, final-model/final-adapter,
pcsd.eval), vLLM and FSDP2 are in tests/test_lora_runs.py."""

from __future__ import annotations

import copy

import pytest
import torch

from pcsd.lora import AdaptersOff, LoraSpec, adapter_names, add_adapters, weight_sources
from pcsd.train.config import ConfigError, load_config

CPU = torch.device("cpu")


def lora_student(model_dir, rank: int = 4, alpha: float = 8.0, targets=None, seed: int = 1):
    """The model of ``model_dir`` (float32) with rank-``rank`` adapters, ``A`` and ``B`` drawn with
    ``seed`` (``B`` not 0, as after some updates: the adapters change the model); returns (model,
    peft model)."""
    from pcsd.models import load_model

    student = load_model(model_dir, CPU, "float32")
    spec = LoraSpec(rank=rank, alpha=alpha, targets=targets)
    peft = add_adapters(student, spec, base_dtype=torch.float32, adapter_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in student.named_parameters():
            if ".lora_A." in n or ".lora_B." in n:
                p.copy_((0.05 if ".lora_B." in n else 0.3) * torch.randn(p.shape, generator=g))
    return student, peft


def frozen_copy_of(model_dir):
    from pcsd.models import load_model

    m = load_model(model_dir, CPU, "float32").eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _cfg(*extra: str):
    return load_config(
        [
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=64",
            "rollout.max_prompt_tokens=40",
            "rollout.max_response_tokens=20",
            "optim.grad_clip=1e9",
            "algo.kl_beta=0.1",
            "model.lora_rank=4",
            "model.teacher_dtype=float32",
            *extra,
        ]
    )


def _batch():
    from pcsd.tiny_model import synthetic_rollout_batch

    return synthetic_rollout_batch(num_groups=3, group_size=3, seed=5, turns=(1, 3), prompt_len=(6, 18))


# ----------------------------------------------------------------------------- the adapters
def test_adapters_train_alone_and_start_as_the_base(tiny_dir):
    """Every linear layer of attention and MLP gets ``A`` and ``B`` (float32, trained), nothing
    else trains; with ``B = 0`` (peft's start) the model is the base model exactly."""
    from pcsd.models import load_model

    base = frozen_copy_of(tiny_dir)
    m = load_model(tiny_dir, CPU, "float32")
    add_adapters(m, LoraSpec(rank=2), base_dtype=torch.bfloat16, adapter_dtype=torch.float32)
    trained = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trained == adapter_names(m) and trained
    layers = len(m.model.layers)
    assert len(trained) == 2 * 7 * layers  # q k v o gate up down, A and B each
    assert {p.dtype for n, p in m.named_parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for n, p in m.named_parameters() if not p.requires_grad} == {torch.bfloat16}

    m2 = load_model(tiny_dir, CPU, "float32")
    add_adapters(m2, LoraSpec(rank=2), base_dtype=torch.float32, adapter_dtype=torch.float32)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(m2(input_ids=ids).logits, base(input_ids=ids).logits)


def test_the_teacher_is_the_base_with_adapters_off_equal_to_a_frozen_copy(tiny_dir):
    """Log-probs of the base with its adapters off (:class:`AdaptersOff`) == a separately loaded
    frozen copy's, bit for bit (float32), through packed scoring; with the adapters on they differ,
    and leaving the context turns them back on."""
    from pcsd.ops.scoring import score_packed

    student, peft = lora_student(tiny_dir)
    frozen = frozen_copy_of(tiny_dir)
    rb = _batch()
    with torch.no_grad():
        want = torch.cat(score_packed(frozen, rb.teacher_prompt_ids, rb.response_ids))
        on = torch.cat(score_packed(student, rb.teacher_prompt_ids, rb.response_ids))
        with AdaptersOff(peft) as base:
            assert base is student
            got = torch.cat(score_packed(base, rb.teacher_prompt_ids, rb.response_ids))
        again = torch.cat(score_packed(student, rb.teacher_prompt_ids, rb.response_ids))
    assert torch.equal(got, want)
    assert not torch.allclose(on, want, atol=1e-3)
    assert torch.equal(again, on)


def _grads_with(frozen_kind: str, tiny_dir, extra: list[str]):
    """One update_step (SGD, lr 0: the gradients stay in .grad) of a LoRA student whose frozen base
    is its adapters off (``adapters-off``) or a separately loaded copy (``copy``)."""
    from pcsd.train.update import update_step

    student, peft = lora_student(tiny_dir)
    frozen = AdaptersOff(peft) if frozen_kind == "adapters-off" else frozen_copy_of(tiny_dir)
    cfg = _cfg(*extra)
    opt = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.0)
    stats = update_step(student, frozen, opt, _batch(), cfg, step=3)
    grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in student.named_parameters()}
    return stats, grads


#: every method of the paper's table, each estimator and policy loss, the recomputing lm head and
#: the joint frozen pass
_CASES = [
    ["method=grpo"],
    ["method=opsd"],
    ["method=grpo+opsd"],
    ["method=rlsd"],
    ["method=skill-sd"],
    ["method=sdar"],
    ["method=sdar-norm"],
    ["method=pcsd"],
    ["method=pcsd", "optim.fused_lm_head=false"],
    ["method=pcsd", "optim.joint_frozen_pass=always"],
    ["method=pcsd", "algo.teacher=current", "optim.ppo_epochs=2"],
    ["method=pcsd", "algo.estimator=gigpo"],
    ["method=sdar", "algo.estimator=rloo"],
    ["method=pcsd", "algo.policy_loss=gspo"],
    ["method=pcsd", "algo.clip_eps_high=0.28"],
]


#: in the default run; the others with -m slow
_FAST = ("pcsd", "sdar+rloo", "pcsd+gspo")


def _case_id(c: list[str]) -> str:
    return "+".join(x.split("=")[1] for x in c)


@pytest.mark.parametrize(
    "extra",
    [c if _case_id(c) in _FAST else pytest.param(c, marks=pytest.mark.slow) for c in _CASES],
    ids=[_case_id(c) for c in _CASES],
)
def test_every_method_and_estimator_with_adapters_off_equals_a_frozen_copy(tiny_dir, extra):
    """The update with the teacher/reference = adapters off gives the same statistics and adapter
    gradients as with a separately loaded frozen copy, bit for bit; the base gets no gradient."""
    s_off, g_off = _grads_with("adapters-off", tiny_dir, extra)
    s_copy, g_copy = _grads_with("copy", tiny_dir, extra)
    for k in ("loss", "pg", "kl", "pcsd", "gap_mean", "tokens"):
        assert s_off[k] == s_copy[k], (k, s_off[k], s_copy[k])
    assert g_off.keys() == g_copy.keys()
    for n, g in g_off.items():
        if ".lora_" in n:
            assert g is not None and torch.equal(g, g_copy[n]), n
        else:
            assert g is None and g_copy[n] is None, n
    assert any(float(g.abs().max()) > 0 for n, g in g_off.items() if g is not None)


def test_a_lora_update_equals_a_hand_computed_step(tiny_dir):
    """update_step + AdamW on a LoRA student == the loss written out by hand on the plain base model
    whose targeted weights are ``W + (alpha / r) B A`` (``torch.func.functional_call``), its
    gradients by autograd, and AdamW's first step written out: ``p (1 - lr wd) - lr m / (sqrt(v) +
    eps)`` with ``m = g``, ``v = g^2`` after bias correction."""
    from plain_update import plain_update_loss

    from pcsd.tiny_model import plain_logprobs
    from pcsd.train.update import update_step

    cfg = _cfg("method=pcsd", "optim.lr=1e-3", "optim.weight_decay=0.1")
    student, peft = lora_student(tiny_dir, rank=4, alpha=8.0)
    start = {n: p.detach().clone() for n, p in student.named_parameters() if p.requires_grad}
    lr, wd = cfg.optim.lr, cfg.optim.weight_decay
    trained = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=wd, betas=(0.9, 0.999), eps=1e-8)
    rb = _batch()
    update_step(student, AdaptersOff(peft), opt, rb, cfg, step=3)

    # the hand computation: the plain base model, merged weights as a function of leaf A, B
    base = frozen_copy_of(tiny_dir)
    leaves = {n: start[n].clone().requires_grad_(True) for n in start}
    scale = 8.0 / 4

    def merged() -> dict[str, torch.Tensor]:
        out = {}
        for name, w in base.named_parameters():
            owner = name.rsplit(".", 1)[0]
            a = leaves.get(f"{owner}.lora_A.default.weight")
            if a is not None and name.endswith(".weight"):
                out[name] = w + scale * leaves[f"{owner}.lora_B.default.weight"] @ a
        return out

    class Merged(torch.nn.Module):
        def forward(self, **kw):
            return torch.func.functional_call(base, merged(), args=(), kwargs=kw, strict=False)

    plain = Merged()
    with torch.no_grad():
        old = plain_logprobs(plain, rb.prompt_ids, rb.response_ids)
        ref = plain_logprobs(base, rb.prompt_ids, rb.response_ids)
        teacher = plain_logprobs(base, rb.teacher_prompt_ids, rb.response_ids)
    lp = plain_logprobs(plain, rb.prompt_ids, rb.response_ids)
    plain_update_loss(cfg, rb, lp, old, ref, teacher, step=3).backward()
    for n, p in student.named_parameters():
        if n not in start:
            continue
        g = leaves[n].grad
        want = start[n] * (1 - lr * wd) - lr * g / (g.abs() + 1e-8)
        # Adam's first step is ~lr * sign(g): compare where the gradient is clearly not 0
        big = g.abs() > 1e-5
        assert big.float().mean() > 0.5, n
        torch.testing.assert_close(p.detach()[big], want[big], rtol=0, atol=lr * 1e-3, msg=n)
    moved = [n for n in start if not torch.equal(dict(student.named_parameters())[n].detach(), start[n])]
    assert len(moved) == len(start)


# ----------------------------------------------------------------------------- merged weights
def test_merged_weights_equal_peft_merge_and_the_model_with_adapters(tiny_dir):
    """:func:`weight_sources` gives every weight of the base model's state dict under its name,
    targeted ones merged (``W + B A alpha / r``): equal to peft's ``merge_and_unload`` (rounding
    apart) and, loaded into a plain model, the same logits as the model with its adapters on."""
    student, peft = lora_student(tiny_dir, targets=("q_proj", "v_proj", "down_proj"))
    made = {n: src.make(torch.float32) for src in weight_sources(student) for n in src.names}
    plain = frozen_copy_of(tiny_dir)
    assert set(made) == set(dict(plain.named_parameters(remove_duplicate=False)))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        on = student(input_ids=ids).logits
        plain.load_state_dict(made, strict=False)
        torch.testing.assert_close(plain(input_ids=ids).logits, on, rtol=1e-5, atol=1e-5)
        ref = copy.deepcopy(peft).merge_and_unload()
        for n, t in ref.state_dict().items():
            torch.testing.assert_close(made[n], t, rtol=1e-6, atol=1e-6, msg=n)
        untouched = "model.layers.0.self_attn.k_proj.weight"
        assert torch.equal(made[untouched], plain.state_dict()[untouched])


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model.lora_rank=-1"], "model.lora_rank must be >= 0"),
        (["model.lora_rank=8", "model.lora_alpha=0"], "model.lora_alpha must be > 0"),
        (["model.lora_rank=8", "model.lora_dropout=1.0"], "model.lora_dropout must be in [0, 1)"),
        (["model.lora_rank=8", "model.lora_targets=[q_proj,lm_head]"], "model.lora_targets has 'lm_head'"),
        (["model.lora_rank=8", "model.lora_targets=[]"], "model.lora_targets is empty"),
        (["model.lora_rank=8", "model.lora_targets=[q_proj,q_proj]"], "names a module twice"),
        (["model.lora_alpha=16"], "model.lora_alpha=16.0 has no effect with model.lora_rank=0"),
        (["model.lora_rank=8", "model.teacher_dtype=bfloat16"], "model.teacher_dtype=bfloat16 with LoRA"),
        (["model.lora_rank=many"], "model.lora_rank"),
    ],
    ids=["rank", "alpha", "dropout", "target", "empty", "twice", "no-rank", "teacher-dtype", "type"],
)
def test_bad_lora_settings_are_one_line_at_config_read(overrides, needle):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg, msg


def test_targets_the_model_lacks_are_one_line(tiny_dir):
    from pcsd.models import load_model

    m = load_model(tiny_dir, CPU, "float32")
    with pytest.raises(ValueError, match="model.lora_targets: w1 is not a linear layer of this model's"):
        add_adapters(
            m, LoraSpec(rank=2, targets=("q_proj", "w1")), base_dtype=torch.float32, adapter_dtype=torch.float32
        )


# ----------------------------------------------------------------------------- the plan
def test_the_plan_counts_the_adapters_exactly(tiny_dir):
    """The plan's adapter count for a model's shape == the parameters peft adds to that model, for
    every target and for a subset."""
    import json

    from pcsd.models import load_model
    from pcsd.train.plan import Shape

    shape = Shape.from_config(json.loads((tiny_dir / "config.json").read_text()), "tiny")
    for targets in (None, ("q_proj", "v_proj", "down_proj")):
        m = load_model(tiny_dir, CPU, "float32")
        add_adapters(m, LoraSpec(rank=3, targets=targets), base_dtype=torch.float32, adapter_dtype=torch.float32)
        n = sum(p.numel() for p in m.parameters() if p.requires_grad)
        assert shape.lora_params(3, targets) == n
        assert sum(p.numel() for p in m.parameters() if not p.requires_grad) == shape.params()


def _hub_unreachable(monkeypatch, tmp_path) -> None:
    """No Hugging Face Hub and an empty cache: a model id that names a built-in shape plans with it."""
    import socket

    import huggingface_hub.constants as hc

    def unreachable(*a, **k):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setattr(socket, "create_connection", unreachable)


def test_plan_lines_for_lora(monkeypatch, tmp_path):
    """``model.lora_rank=64``: the base in bf16 (no master copy), the adapters with their gradients
    and AdamW state in float32, no frozen copy, no lm-head weight gradient; the 3B preset fits one
    40 GB GPU (it does not without LoRA), Qwen2.5-7B one 80 GB GPU."""
    import dataclasses

    from pcsd.train.plan import BUILTIN_SHAPES, GiB, Shape, memory_plan

    _hub_unreachable(monkeypatch, tmp_path)

    full = memory_plan(load_config(["preset=alfworld-qwen2.5-3b"]), 1, 40 * GiB, varlen=False, adamw="fused")
    cfg = load_config(["preset=alfworld-qwen2.5-3b", "model.lora_rank=64"])
    plan = memory_plan(cfg, 1, 40 * GiB, varlen=False, adamw="fused")
    s = plan.shape
    A = s.lora_params(64)
    assert A == 36 * 64 * (2 * (2048 + 2048) + 2 * (2048 + 256) + 3 * (2048 + 11008))
    rows = {r.item: r for r in plan.rows}
    assert rows["base weights (frozen)"].size == s.params() * 2
    assert rows["LoRA adapters"].size == rows["adapter gradients"].size == A * 4
    assert rows["AdamW state (2 moments)"].size == 2 * A * 4
    assert rows["frozen teacher/reference"].size == 0
    assert "master weights" not in rows
    assert rows["compute-dtype weights (update)"].size == A * 2
    tokens = rows["activations (16384 tokens)"]
    assert rows["lm-head gradient buffers"].size < {r.item: r for r in full.rows}["lm-head gradient buffers"].size
    assert tokens.size < {r.item: r for r in full.rows}["activations (16384 tokens)"].size  # bf16 residual stream
    assert plan.fits and not full.fits
    assert plan.static_bytes == s.params() * 2 + 4 * A * 4 + 2 * GiB

    two = memory_plan(cfg, 2, 40 * GiB, varlen=False, adamw="foreach")
    rows2 = {r.item: r for r in two.rows}
    assert rows2["LoRA adapters"].size == A * 4 // 2 and rows2["AdamW step temporaries (foreach)"].size == A * 4 // 2

    seven = load_config(["preset=alfworld-qwen2.5-3b", "model.path=Qwen/Qwen2.5-7B-Instruct", "model.lora_rank=64"])
    p7 = memory_plan(seven, 1, 80 * GiB, varlen=False, adamw="fused")
    assert dataclasses.replace(p7.shape, name="") == Shape.from_config(BUILTIN_SHAPES["qwen2.5-7b"], "")
    assert 7.6e9 < p7.shape.params() < 7.7e9 and p7.fits
    p7_full = memory_plan(
        load_config(["preset=alfworld-qwen2.5-3b", "model.path=Qwen/Qwen2.5-7B-Instruct"]),
        1,
        80 * GiB,
        varlen=False,
        adamw="fused",
    )
    assert not p7_full.fits


@pytest.mark.parametrize(
    "args, gpu_gb, fits",
    [
        (["model.lora_rank=64"], "40", True),
        (["model.path=Qwen/Qwen2.5-7B-Instruct", "model.lora_rank=64"], "80", True),
        ([], "40", False),
    ],
    ids=["3b-lora-40", "7b-lora-80", "3b-full-40"],
)
def test_plan_command_lines(args, gpu_gb, fits, capsys, monkeypatch, tmp_path):
    """The issue's goal lines: ``python -m pcsd.train preset=alfworld-qwen2.5-3b model.lora_rank=64
    --plan --gpus 1 --gpu-memory-gb 40`` says it fits, and so does Qwen2.5-7B rank 64 on 80 GB."""
    from pcsd.train.cli import main

    _hub_unreachable(monkeypatch, tmp_path)  # a model id that names a built-in shape: nothing is fetched
    rc = main(["preset=alfworld-qwen2.5-3b", *args, "--plan", "--gpus", "1", "--gpu-memory-gb", gpu_gb])
    out = capsys.readouterr().out
    assert rc == (0 if fits else 1), out
    assert ("verdict: fits" in out) == fits
    if args:
        assert "LoRA adapters" in out and "base weights (frozen)" in out


# ----------------------------------------------------------------------------- adapter folders (issue 42)
def test_to_peft_names_are_the_names_peft_saves_and_from_peft_names_inverts_them(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from pcsd.lora import from_peft_names, save_adapter, to_peft_names

    student, peft = lora_student(tiny_dir)
    out = save_adapter(peft, tmp_path / "adapter", tiny_dir)
    state = {n: p.detach() for n, p in student.named_parameters()}
    named = to_peft_names(state)
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert set(named) == set(saved) and len(named) == 2 * 7 * 2  # A and B, 7 targets, 2 layers
    for k, v in named.items():
        assert torch.equal(v, saved[k]), k
    adapters = {n: v for n, v in state.items() if ".lora_" in n}
    assert from_peft_names(named).keys() == adapters.keys()  # every other parameter left out, then back


def _adapter_eval(adapter, tmp_path) -> list[str]:
    return [
        "--model",
        str(adapter),
        "--backend",
        "hf",
        "--device",
        "cpu",
        "--split",
        "procedural",
        "--procedural-games",
        "2",
        "--max-steps",
        "1",
        "--max-response-tokens",
        "4",
        "--quiet",
        "--out",
        str(tmp_path / "out" / "eval"),
    ]


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("weights", "adapter_model.safetensors is damaged"),
        ("no weights", "no adapter_model.safetensors (the adapter's weights) beside its adapter_config.json"),
        ("config", "adapter_config.json is damaged: not valid JSON"),
    ],
)
def test_a_damaged_adapter_is_one_line_and_leaves_no_output_folder(tiny_dir, tmp_path, capsys, damage, needle):
    """A SafetensorError was a traceback; a corrupt adapter_config.json read as "names no base
    model", a missing adapter_model.safetensors as "does not fit its base model"; the refused
    evaluation left its output folder behind (empty, or with the procedural games it wrote)."""
    from pcsd.eval.cli import main
    from pcsd.lora import save_adapter

    _, peft = lora_student(tiny_dir)
    adapter = save_adapter(peft, tmp_path / "adapter", tiny_dir)
    weights, config = adapter / "adapter_model.safetensors", adapter / "adapter_config.json"
    if damage == "weights":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + b"\0" * 64)
    elif damage == "no weights":
        weights.unlink()
    else:
        config.write_text('{"base_model_name_or_path": "' + str(tiny_dir) + '", ')
    capsys.readouterr()
    assert main(_adapter_eval(adapter, tmp_path)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("pcsd.eval:")]  # (beside the base's progress bar)
    assert "Traceback" not in err and len(lines) == 1 and needle in lines[0], err
    assert "names no base model" not in err and "does not fit" not in err
    assert not (tmp_path / "out").exists()  # the folder and the parent made for it are gone again
