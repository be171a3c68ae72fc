"""Mixed precision (pcsd.train.precision): with the paper presets' settings (fp32 master weights and
AdamW state, bf16 compute, bf16 frozen copy) one AdamW step at lr 1e-6 moves the weights; the same
step with bf16 weights is rounded away. The mixed step matches an all-fp32 step within what bf16
compute allows; the same under FSDP2 over 2 gloo processes.

The bound. AdamW's first step moves every element by ``lr * g / (|g| + eps)`` (bias-corrected
moments), i.e. by ``lr`` in the direction of the gradient's sign whatever the gradient's size. bf16
compute changes gradients by a relative ~1e-2, so it can only flip the sign, and so the step, of the
elements whose gradient is near 0. Hence: every element differs from the fp32 step by at most
``2 lr`` (+ fp32 rounding of the weight), at least 95 % of them by less than ``1e-3 lr``, and the
mixed gradient's relative L2 error against the fp32 gradient is below 5e-2 (measured: 5e-3; 98.8 %
of the elements equal the fp32 step, the rest differ by one flipped step of 2 lr).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from pcsd.train.config import ConfigError, load_config

LR = 1e-6
PAPER = "preset=alfworld-qwen2.5-3b"
# the paper preset on the fixed synthetic batch: one update, the hf backend, no files
_OV = ["rollout.backend=hf", "env.source=procedural"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, seed=3)


def _cfg(tiny_dir, *extra: str):
    return load_config([PAPER, f"model.path={tiny_dir}", *_OV, *extra])


def _models(cfg, ctx=None):
    """Student and frozen copy exactly as pcsd.train.job.build_models makes them."""
    from pcsd.models import load_model
    from pcsd.train import distributed as du
    from pcsd.train.precision import frozen_copy, fsdp_policy, precision_of, prepare_student

    prec = precision_of(cfg)
    student = load_model(cfg.model.path, torch.device("cpu"), cfg.model.param_dtype)
    frozen = frozen_copy(student, prec.teacher)
    with torch.no_grad():  # reference != student, so the KL term has a gradient too
        g = torch.Generator().manual_seed(1)
        for p in frozen.parameters():
            p.add_((0.02 * torch.randn(p.shape, generator=g)).to(p.dtype))
    distributed = ctx is not None and ctx.distributed
    prepare_student(student, prec, distributed)
    if distributed:
        du.shard_model(student, ctx, mp_policy=fsdp_policy(prec))
        du.shard_model(frozen, ctx)
    return student, frozen


def _step(cfg, ctx=None, rb=None):
    """One update of the paper preset's precision on the synthetic batch; the full weights and
    gradients (fp32) before and after, and the optimizer."""
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    student, frozen = _models(cfg, ctx)
    ctx = ctx or du.single_process()
    before = {k: v.float().clone() for k, v in du.full_model_state(student, ctx, all_ranks=True).items()}
    opt = torch.optim.AdamW(
        [p for p in student.parameters() if p.requires_grad], lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
    )
    rb = rb or synthetic_rollout_batch(num_groups=3, group_size=2, seed=2)
    update_step(student, frozen, opt, rb, cfg, step=0, ctx=ctx)
    grads = {
        n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float().clone()
        for n, p in student.named_parameters()
    }
    after = {k: v.float().clone() for k, v in du.full_model_state(student, ctx, all_ranks=True).items()}
    return before, after, grads, student, frozen, opt


def _moved_share(before, after, grads) -> float:
    moved = total = 0
    for n, g in grads.items():
        nz = g != 0
        moved += int(((after[n] != before[n]) & nz).sum())
        total += int(nz.sum())
    assert total > 0
    return moved / total


def _check_against_fp32(before, after, grads, ref_after, ref_grads) -> None:
    close = total = 0
    for n in grads:
        d = (after[n] - ref_after[n]).abs()
        assert float(d.max()) <= 2 * LR + 1e-7, (n, float(d.max()))  # a flipped step at most
        close += int((d < 1e-3 * LR + torch.finfo(torch.float32).eps * before[n].abs()).sum())
        total += d.numel()
    assert close / total >= 0.95, close / total
    num = sum(float((grads[n] - ref_grads[n]).pow(2).sum()) for n in grads)
    den = sum(float(ref_grads[n].pow(2).sum()) for n in grads)
    assert (num / den) ** 0.5 < 5e-2, (num / den) ** 0.5


def test_paper_precision_step_moves_the_weights_and_matches_fp32(tiny_dir):
    cfg = _cfg(tiny_dir)
    assert (cfg.optim.lr, cfg.model.param_dtype, cfg.model.compute_dtype, cfg.model.teacher_dtype) == (
        LR,
        "float32",
        "bfloat16",
        "bfloat16",
    )
    before, after, grads, student, frozen, opt = _step(cfg)
    assert all(p.dtype == torch.float32 for p in student.parameters())  # master weights
    assert all(p.dtype == torch.bfloat16 for p in frozen.parameters())  # half the memory of a copy
    assert all(v.dtype == torch.float32 for st in opt.state.values() for v in st.values() if v.dim())
    assert _moved_share(before, after, grads) >= 0.99

    ref_cfg = _cfg(tiny_dir, "model.compute_dtype=float32", "model.teacher_dtype=float32")
    _, ref_after, ref_grads, *_ = _step(ref_cfg)
    _check_against_fp32(before, after, grads, ref_after, ref_grads)


def test_bf16_weights_round_the_step_away(tiny_dir):
    """What the paper presets did before: bf16 parameters updated in place. Most of the step is lost,
    which is why the config refuses it."""
    cfg = _cfg(
        tiny_dir, "model.param_dtype=bfloat16", "model.compute_dtype=bfloat16", "optim.allow_low_precision_params=true"
    )
    before, after, grads, *_ = _step(cfg)
    assert _moved_share(before, after, grads) < 0.5


def test_bf16_params_with_an_optimizer_are_refused_with_the_reason(tiny_dir):
    with pytest.raises(ConfigError, match="rounds back.*optim.allow_low_precision_params=true"):
        _cfg(tiny_dir, "model.param_dtype=bfloat16")
    with pytest.raises(ConfigError, match="model.compute_dtype=float32 with model.param_dtype=bfloat16"):
        _cfg(
            tiny_dir,
            "model.param_dtype=bfloat16",
            "model.compute_dtype=float32",
            "optim.allow_low_precision_params=true",
        )
    # bf16 weights without any training is fine (evaluation-only, Vanilla)
    assert _cfg(tiny_dir, "model.param_dtype=bfloat16", "optim.steps=0").model.param_dtype == "bfloat16"


def test_the_old_dtype_key_says_what_replaced_it(tmp_path):
    with pytest.raises(ConfigError, match="model.dtype.*model.param_dtype.*model.compute_dtype"):
        load_config(["model.dtype=bfloat16"])
    from pcsd.train.config import resume_config

    (tmp_path / "config.yaml").write_text("preset: tiny-cpu\nmodel: {dtype: bfloat16}\n")
    with pytest.raises(ConfigError, match="saved config.*model.param_dtype"):
        resume_config(tmp_path)


def test_export_writes_the_requested_dtype(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from pcsd.models import load_model
    from pcsd.train.precision import export_model

    m = load_model(tiny_dir, torch.device("cpu"), "float32")
    out = export_model(m, tmp_path / "final", "bfloat16")
    w = load_file(str(out / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in w.values())
    assert '"torch_dtype": "bfloat16"' in (out / "config.json").read_text()
    assert all(p.dtype == torch.float32 for p in m.parameters())  # the trained model is untouched
    back = load_model(out, torch.device("cpu"), "bfloat16")
    sd = m.state_dict()
    assert all(torch.equal(v, sd[k].to(torch.bfloat16)) for k, v in back.state_dict().items())


# ----------------------------------------------------------------------------- FSDP2
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = _cfg(Path(model_dir))
        rb = du.select_groups(synthetic_rollout_batch(num_groups=4, group_size=2, seed=2), du.split_groups(4, ctx))
        before, after, grads, student, frozen, opt = _step(cfg, ctx, rb)
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731 (the root stays unsharded)
        dtypes = {
            "student": {local(p).dtype for p in student.parameters()},
            "frozen": {local(p).dtype for p in frozen.parameters()},
            "adam": {local(v).dtype for st in opt.state.values() for v in st.values() if v.dim()},
        }
        if ctx.is_main:
            torch.save({"before": before, "after": after, "grads": grads, "dtypes": dtypes}, out)
    finally:
        du.shutdown(ctx)


@pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="torch.distributed with gloo is needed"
)
def test_fsdp2_two_gloo_ranks_mixed_precision(tiny_dir, tmp_path):
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the shards and AdamW
    state stay fp32, >= 99 % of the elements move, and the step matches one all-fp32 process."""
    import torch.multiprocessing as mp

    from pcsd.tiny_model import synthetic_rollout_batch

    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(tiny_dir), str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    assert got["dtypes"] == {"student": {torch.float32}, "frozen": {torch.bfloat16}, "adam": {torch.float32}}
    grads = {k: v for k, v in got["grads"].items()}
    # tied embeddings: the state dict may list lm_head.weight; compare what both name
    keys = [k for k in grads if k in got["after"]]
    grads = {k: grads[k] for k in keys}
    assert _moved_share(got["before"], got["after"], grads) >= 0.99

    ref_cfg = _cfg(tiny_dir, "model.compute_dtype=float32", "model.teacher_dtype=float32")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, ref_after, ref_grads, *_ = _step(ref_cfg, rb=synthetic_rollout_batch(num_groups=4, group_size=2, seed=2))
    finally:
        torch.set_num_threads(threads)
    _check_against_fp32(got["before"], got["after"], grads, ref_after, {k: ref_grads[k] for k in keys})


# ----------------------------------------------------------------------------- a whole run
def test_paper_preset_cpu_run_validates_and_resumes_bit_exact(tmp_path, tiny_dir, child_env, alfworld_data):
    """``preset=alfworld-qwen2.5-3b`` with a small Qwen2 model on CPU, 2 steps: the whole
    mixed-precision path (fp32 master + bf16 autocast, bf16 frozen copy, gradient checkpointing),
    periodic validation with the paper protocol, final-model/ in bf16; a run stopped after step 1
    and resumed ends bit for bit where the uninterrupted one does."""
    import json
    import subprocess

    from safetensors.torch import load_file

    def train(*args: str) -> None:
        r = subprocess.run(
            [sys.executable, "-m", "pcsd.train", *args],
            cwd=tmp_path,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    common = [
        PAPER,
        f"model.path={tiny_dir}",
        "rollout.backend=hf",
        "run.device=cpu",
        "optim.steps=2",
        "run.save_every=1",
        "env.max_steps=1",
        "rollout.tasks_per_step=1",
        "rollout.group_size=2",
        "rollout.max_response_tokens=4",
        "eval.episodes=2",
        "eval.every=1",
        "run.tensorboard=false",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    train(*common, f"run.dir={full}")
    train(*common, f"run.dir={part}", "run.stop_after=1")
    train("--resume", str(part))

    cfg = (full / "config.yaml").read_text()
    for line in ("param_dtype: float32", "compute_dtype: bfloat16", "teacher_dtype: bfloat16", "protocol: paper"):
        assert line in cfg, line
    recs = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert "val_success" in recs[0] and "val_success" not in recs[1]  # step 1 validates; step 2 is "after"
    evals = [json.loads(x) for x in (full / "evals.jsonl").read_text().splitlines()]
    assert [e["name"] for e in evals] == ["before", "step 1", "after"]
    result = json.loads((full / "eval.json").read_text())["after"]
    assert result["episodes"] == 2 and result["settings"]["protocol"] == "paper"
    assert result["settings"]["validation_index"] == 2 and len(result["overall_ci95"]) == 2
    assert (full / "plots" / "success.png").is_file()

    a = load_file(str(full / "checkpoints" / "step-00000002" / "model" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "step-00000002" / "model" / "model.safetensors"))
    w0 = load_file(str(Path(tiny_dir) / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in a.values())  # the checkpoint keeps the master weights
    assert all(torch.equal(a[k], b[k]) for k in a)  # resume is bit-exact
    moved = sum(int((a[k] != w0[k]).sum()) for k in a) / sum(v.numel() for v in a.values())
    assert moved > 0.9, moved  # lr 1e-6 still moves the fp32 weights
    ra = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ra] == [1, 2] and ra[1]["loss"] == recs[1]["loss"]
    final = load_file(str(full / "final-model" / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in final.values())  # model.export_dtype


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir):
    """optim.gradient_checkpointing (the paper presets) recomputes each decoder layer in the
    backward: the gradients are those of the plain backward (fp32, to rounding)."""
    cfg = load_config([f"model.path={tiny_dir}", "rollout.backend=hf", "optim.lr=1e-3"])
    grads = []
    for ckpt in (False, True):
        from pcsd.models import load_model
        from pcsd.tiny_model import synthetic_rollout_batch
        from pcsd.train.precision import frozen_copy
        from pcsd.train.update import update_step

        student = load_model(tiny_dir, torch.device("cpu"), "float32")
        frozen = frozen_copy(student, "float32")
        if ckpt:
            student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.SGD(student.parameters(), lr=0.0)
        update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=2, group_size=2, seed=4), cfg, step=0)
        grads.append({n: p.grad.clone() for n, p in student.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)
