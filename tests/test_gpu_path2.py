"""The GPU path's second pass (issue 28, part 2), each caught on CPU.

* the chunked lm-head's tile loops (:func:`pcsd.ops.scoring.selective_logprobs`, forward and
  backward) never read a tensor on the host: they run on the meta device, where any such read
  (``.item()``, ``bool(tensor)``, ``nonzero``, boolean indexing, ``tolist``) raises, and a
  dispatch mode sees no ``_local_scalar_dense``/``nonzero`` in them; their results are bit-equal to
  indexing the target rows (the code before this pass);
* the PCSD op's value checks on the CUDA / reference path read the device once per call, and an
  eager call skips the custom-op dispatcher (same results, the op still traced under
  ``torch.compile``).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from pcsd.ops import kernels
from pcsd.ops.scoring import _ChunkedSelectiveLogProb, selective_logprobs

#: ATen ops that read a device tensor on the host (a CUDA synchronisation), or whose output shape
#: depends on the data (nonzero and what is built on it)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "item", "unique", "_unique2"}


class OpNames(TorchDispatchMode):
    """Counts the ATen ops that run while it is on, by name (``aten.nonzero.default`` ->
    ``nonzero``); boolean-mask indexing counts as ``nonzero``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        self.seen[name] += 1
        if name.startswith("index") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for a in args
            if isinstance(a, (list, tuple))
            for i in a
        ):
            self.seen["nonzero"] += 1
        return func(*args, **(kwargs or {}))

    def syncs(self) -> dict[str, int]:
        return {k: v for k, v in self.seen.items() if k in SYNC_OPS}


def _inputs(n: int, vocab: int, hidden: int, device: str, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g, dtype=dtype).to(device).requires_grad_(True)
    w = torch.randn(vocab, hidden, generator=g, dtype=dtype).to(device).requires_grad_(True)
    b = torch.randn(vocab, generator=g, dtype=dtype).to(device).requires_grad_(True)
    t = torch.randint(0, vocab, (n,), generator=g).to(device)
    return h, w, b, t


@pytest.mark.parametrize("bias", [False, True])
def test_tile_loops_never_read_the_device(bias, monkeypatch):
    # meta tensors have no data: any host read or data-dependent shape in the loops raises
    real = torch.is_autocast_enabled  # (autocast knows no meta device; the loops run without it)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: False if a == ("meta",) else real(*a))
    h, w, b, t = _inputs(37, 1000, 8, "meta")
    b = b if bias else None
    ctx = SimpleNamespace(needs_input_grad=(True, True, bias, False, False, False, False))
    ctx.save_for_backward = lambda *saved: setattr(ctx, "saved_tensors", saved)
    lp = _ChunkedSelectiveLogProb.forward(ctx, h, w, b, t, 8, 96, 1 / 0.7)  # 5 x 11 tiles
    assert lp.shape == (37,) and lp.device.type == "meta"
    gh, gw, gb, *_ = _ChunkedSelectiveLogProb._backward(ctx, torch.empty(37, device="meta"))
    assert gh.shape == h.shape and gw.shape == w.shape and gh.device.type == "meta"
    assert (gb is not None) == bias


def test_tile_loops_run_no_syncing_op():
    h, w, b, t = _inputs(37, 1000, 8, "cpu")
    with OpNames() as ops:
        lp = _ChunkedSelectiveLogProb.apply(h, w, b, t, 8, 96, 1.0)
        lp.sum().backward()
    assert ops.seen["mm"] > 0  # the mode saw the loops' ops
    assert ops.syncs() == {}
    # the public call's input checks read the device once, whatever the number of tiles
    for chunks in ((37, 1000), (4, 64)):
        with OpNames() as ops:
            selective_logprobs(h, w, t, b, token_chunk=chunks[0], vocab_chunk=chunks[1])
        assert sum(ops.syncs().values()) <= 1


def _indexed_reference(hidden, weight, bias, targets, grad_out, token_chunk, vocab_chunk, inv_temp):
    """The tile loops as they were before this pass, float32: the rows whose target lies in a
    vocabulary slice found with ``nonzero`` and updated by indexing (a host read per tile on CUDA).
    Returns the log-probs and the gradients of ``sum(grad_out * logp)``: the oracle, bit for bit."""
    n, vocab = hidden.shape[0], weight.shape[0]
    out, lse_all = torch.empty(n), torch.empty(n)
    gh, gw, gb = torch.zeros_like(hidden), torch.zeros_like(weight), torch.zeros(vocab)

    def tile(h, v0, v1):
        logits = h @ weight[v0:v1].T
        return logits + bias[v0:v1] if bias is not None else logits

    for t0 in range(0, n, token_chunk):
        h, tg = hidden[t0 : t0 + token_chunk], targets[t0 : t0 + token_chunk]
        m = torch.full((h.shape[0],), float("-inf"))
        s, tgt = torch.zeros(h.shape[0]), torch.zeros(h.shape[0])
        for v0 in range(0, vocab, vocab_chunk):
            v1 = min(vocab, v0 + vocab_chunk)
            logits = tile(h, v0, v1) * inv_temp
            new_m = torch.maximum(m, logits.max(dim=1).values)
            s = s * torch.exp(m - new_m) + torch.exp(logits - new_m[:, None]).sum(1)
            m = new_m
            rows = torch.nonzero((tg >= v0) & (tg < v1)).squeeze(1)
            tgt[rows] = logits[rows, tg[rows] - v0]
        lse = m + torch.log(s)
        out[t0 : t0 + token_chunk], lse_all[t0 : t0 + token_chunk] = tgt - lse, lse
        g = grad_out[t0 : t0 + token_chunk]
        for v0 in range(0, vocab, vocab_chunk):
            v1 = min(vocab, v0 + vocab_chunk)
            dlog = -torch.exp(tile(h, v0, v1) * inv_temp - lse[:, None]) * g[:, None]
            rows = torch.nonzero((tg >= v0) & (tg < v1)).squeeze(1)
            dlog[rows, tg[rows] - v0] += g[rows]
            dlog = dlog * inv_temp
            gh[t0 : t0 + token_chunk] += dlog @ weight[v0:v1]
            gw[v0:v1] += dlog.T @ h
            gb[v0:v1] += dlog.sum(0)
    return out, gh, gw, gb


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    vocab=st.integers(2, 200),
    hidden=st.integers(1, 8),
    token_chunk=st.integers(1, 12),
    vocab_chunk=st.integers(1, 70),
    bias=st.booleans(),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    seed=st.integers(0, 2**16),
)
def test_sync_free_loops_equal_row_indexing_bit_for_bit(
    n, vocab, hidden, token_chunk, vocab_chunk, bias, temperature, seed
):
    h, w, b, t = _inputs(n, vocab, hidden, "cpu", seed=seed)
    b = b if bias else None
    lp = selective_logprobs(h, w, t, b, token_chunk=token_chunk, vocab_chunk=vocab_chunk, temperature=temperature)
    c = torch.linspace(-1.0, 2.0, n)
    (lp * c).sum().backward()
    want = _indexed_reference(
        h.detach(), w.detach(), None if b is None else b.detach(), t, c, token_chunk, vocab_chunk, 1.0 / temperature
    )
    assert torch.equal(lp.detach(), want[0])
    assert torch.equal(h.grad, want[1]) and torch.equal(w.grad, want[2])
    assert b is None or torch.equal(b.grad, want[3])


# ----------------------------------------------------------------------------- the PCSD op's checks
def _batch(seed: int = 0, mask_dtype=torch.bool):
    g = torch.Generator().manual_seed(seed)
    gap = torch.randn(40, generator=g)
    cu = torch.tensor([0, 7, 7, 25, 40])
    mask = (torch.rand(40, generator=g) > 0.2).to(mask_dtype)
    return gap, cu, mask


class HostReads:
    """Counts host reads of tensors: ATen's ``_local_scalar_dense``/``nonzero`` (``item``,
    ``bool``, ``int``, indexing by a mask) and ``Tensor.tolist`` (which CPU tensors serve
    without ATen)."""

    def __init__(self, monkeypatch) -> None:
        self.tolist = 0
        original = torch.Tensor.tolist

        def counted(t, *a, **k):
            self.tolist += 1
            return original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, "tolist", counted)
        self.ops = OpNames()

    def __enter__(self):
        self.ops.__enter__()
        return self

    def __exit__(self, *exc):
        return self.ops.__exit__(*exc)

    @property
    def total(self) -> int:
        return self.tolist + sum(self.ops.syncs().values())


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, None])
def test_value_checks_read_the_device_once_per_call(monkeypatch, mask_dtype):
    gap, cu, mask = _batch(mask_dtype=mask_dtype or torch.bool)
    mask = None if mask_dtype is None else mask
    want = kernels.pcsd_weights(gap, cu, mask)
    monkeypatch.setattr(kernels, "kernel_for", lambda device: "reference")  # the CUDA path's checks
    reads = HostReads(monkeypatch)
    with reads:
        kernels._check_data(gap, cu, mask)
    assert reads.total == 1, (reads.tolist, reads.ops.syncs())
    torch.testing.assert_close(kernels.pcsd_weights(gap, cu, mask), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "change, match, cpu_match",
    [
        (dict(cu=torch.tensor([1, 7, 7, 25, 40])), r"cu_seqlens\[0\] must be 0, got 1", r"cu_seqlens\[0\] must be 0"),
        (
            dict(cu=torch.tensor([0, 7, 5, 25, 40])),
            r"non-decreasing; cu_seqlens\[2\] < cu_seqlens\[1\]",
            r"non-decreasing; cu_seqlens\[2\] < cu_seqlens\[1\]",
        ),
        (dict(cu=torch.tensor([0, 7, 7, 25, 39])), r"number of tokens T \(40\), got 39", r"T \(T=40\), got 39"),
        (dict(gap_at=(12, float("nan"))), r"gap\[12\] = nan", r"gap\[12\] = nan"),
        (dict(gap_at=(30, float("-inf"))), r"gap\[30\] = -inf", r"gap\[30\] = -inf"),
        (dict(mask=torch.full((40,), 0.5)), "only 0 and 1", "only 0 and 1"),
    ],
)
def test_value_checks_name_the_first_fault_on_the_device_path(monkeypatch, change, match, cpu_match):
    gap, cu, _ = _batch()
    mask = change.get("mask", torch.ones(40, dtype=torch.bool))  # all valid: a non-finite gap is a fault
    cu = change.get("cu", cu)
    if "gap_at" in change:
        i, v = change["gap_at"]
        gap[i] = v
    monkeypatch.setattr(kernels, "kernel_for", lambda device: "reference")
    with pytest.raises(ValueError, match=match):
        kernels.pcsd_weights(gap, cu, mask)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=cpu_match):  # the CPU kernel's own check, the same fault
        kernels.pcsd_weights(gap, cu, mask)


def test_eager_calls_skip_the_dispatcher_and_traced_ones_do_not(monkeypatch):
    gap, cu, mask = _batch()
    want = kernels.pcsd_weights(gap, cu, mask, return_stats=True)

    def refuse(*a, **k):
        raise AssertionError("the custom op ran in eager mode")

    for name in ("_op_weights", "_op_weights_out", "_op_weights_stats"):
        monkeypatch.setattr(kernels, name, refuse)
    out = torch.empty_like(gap)
    assert kernels.pcsd_weights(gap, cu, mask, out=out) is out
    torch.testing.assert_close(out, want.w, rtol=0, atol=0)
    got = kernels.pcsd_weights(gap, cu, mask, return_stats=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    monkeypatch.undo()
    # under a dispatch mode (fake tensors, tracing) the registered op runs
    calls = []
    real = kernels._op_weights
    monkeypatch.setattr(kernels, "_op_weights", lambda *a: calls.append(1) or real(*a))
    with OpNames():
        kernels.pcsd_weights(gap, cu, mask)
    assert calls == [1]


def test_parameter_checks_are_remembered_by_value_and_type():
    kernels._check_params_cached.cache_clear()
    args = (1, 8, 0.8, 0.05, 0.5, 0.3, 5.0, 1e-6, 1e-6)
    kernels._check_params(*args)
    kernels._check_params(*args)
    assert kernels._check_params_cached.cache_info().hits == 1
    with pytest.raises(ValueError, match="n_min must be an integer"):
        kernels._check_params(True, *args[1:])  # True == 1, but not an accepted n_min
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        kernels._check_params(1, 8, float("nan"), *args[3:])
    with pytest.raises(ValueError, match="n_min must be an integer"):
        kernels._check_params([1], *args[1:])  # unhashable: checked uncached


# ----------------------------------------------------------------------------- AdamW's implementation
def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((7, 5), (5,), (3, 2, 4))]


def _grads(params, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_adamw_is_fused_on_cuda_and_torchs_default_elsewhere():
    from pcsd.train.optim import adamw_kind, make_adamw, plan_adamw_kind

    assert adamw_kind("cuda") == adamw_kind(torch.device("cuda", 1)) == plan_adamw_kind() == "fused"
    assert adamw_kind("cpu") == adamw_kind("meta") == "foreach"
    # a run on CUDA (named: CPU parameters stand in, torch's fused AdamW also runs on CPU)
    fused = make_adamw(_params(), lr=1e-3, weight_decay=0.1, device=torch.device("cuda"))
    assert fused.defaults["fused"] is True and fused.defaults["weight_decay"] == 0.1
    plain = make_adamw(_params(), lr=1e-3, weight_decay=0.1, device="cpu")
    assert not plain.defaults["fused"] and plain.defaults["foreach"] is None  # exactly what CPU runs had
    # the same update, to rounding
    for opt in (fused, plain):
        for k in range(3):
            _grads(opt.param_groups[0]["params"], k)
            opt.step()
    for a, b in zip(fused.param_groups[0]["params"], plain.param_groups[0]["params"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_adamw_keeps_its_implementation_when_a_state_is_loaded():
    from pcsd.train.optim import make_adamw

    src = make_adamw(_params(), lr=1e-3, device="cpu")  # a checkpoint written by a CPU run
    _grads(src.param_groups[0]["params"], 0)
    src.step()
    state = src.state_dict()
    fused = make_adamw(_params(), lr=1e-3, device="cuda")
    fused.load_state_dict(state)
    assert fused.param_groups[0]["fused"] is True  # the saved group said fused=None
    assert state["param_groups"][0]["fused"] is None  # the caller's dict is left as it was
    for s in fused.state.values():  # where the fused kernel wants its counters
        assert s["step"].dtype == torch.float32 and s["step"].device == s["exp_avg"].device
    _grads(fused.param_groups[0]["params"], 1)
    fused.step()  # runs
    back = make_adamw(_params(), lr=1e-3, device="cpu")
    back.load_state_dict(fused.state_dict())  # and the other way round
    assert not back.param_groups[0]["fused"]
    _grads(back.param_groups[0]["params"], 2)
    back.step()


def test_the_optimizer_is_made_in_one_place():
    import re
    from pathlib import Path

    root = Path(kernels.__file__).resolve().parents[1]
    made = [
        f"{p.relative_to(root)}:{i + 1}"
        for p in root.rglob("*.py")
        if p.name != "optim.py"
        for i, line in enumerate(p.read_text().splitlines())
        if re.search(r"optim\.AdamW\(", line)
    ]
    assert made == [], f"AdamW made outside pcsd.train.optim.make_adamw: {made}"


# ----------------------------------------------------------------------------- models onto their device
class StagingCount:
    """``safetensors.safe_open`` whose ``get_tensor`` results are watched: the most alive at once."""

    def __init__(self, monkeypatch) -> None:
        import weakref

        import safetensors

        real = safetensors.safe_open
        self.alive = self.most = self.read = 0
        outer = self

        class Watched:
            def __init__(self, *a, **k):
                self.inner = real(*a, **k)

            def __enter__(self):
                self.inner.__enter__()
                return self

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_tensor(self, name):
                t = self.inner.get_tensor(name)
                outer.alive += 1
                outer.read += 1
                outer.most = max(outer.most, outer.alive)
                weakref.finalize(t, outer._gone)
                return t

        monkeypatch.setattr(safetensors, "safe_open", Watched)

    def _gone(self) -> None:
        self.alive -= 1


def test_a_model_is_loaded_straight_onto_its_device(tiny_dir, monkeypatch):
    """A named device (meta stands in for CUDA: no data, no host copy possible): every parameter
    is created there, none is moved there, and host memory holds one checkpoint tensor at a time."""
    import transformers

    from pcsd.models import load_model

    made: list[str] = []
    real_register = torch.nn.Module.register_parameter

    def register(self, name, param):
        if param is not None:
            made.append(param.device.type)
        return real_register(self, name, param)

    monkeypatch.setattr(torch.nn.Module, "register_parameter", register)
    monkeypatch.setattr(torch.nn.Module, "to", lambda *a, **k: pytest.fail("a model was moved with .to()"))
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded on the host first")
    )
    staging = StagingCount(monkeypatch)
    model = load_model(tiny_dir, torch.device("meta"), "float32")
    assert made and set(made) == {"meta"}, made
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert staging.read == len(model.state_dict()) - 1  # every tensor of the file (the tied lm-head is not in it)
    assert staging.most == 1
    assert not model.training and model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shards", [1, 3])
def test_the_on_device_load_equals_from_pretrained(tiny_dir, tmp_path, dtype, shards):
    from transformers import AutoConfig, AutoModelForCausalLM

    from pcsd.models import load_on_device

    src = tiny_dir
    if shards > 1:  # a sharded checkpoint with its index
        AutoModelForCausalLM.from_pretrained(tiny_dir).save_pretrained(tmp_path, max_shard_size="40KB")
        assert (
            len(list(tmp_path.glob("*.safetensors"))) >= shards
            and (tmp_path / "model.safetensors.index.json").is_file()
        )
        src = tmp_path
    got = load_on_device(src, AutoConfig.from_pretrained(src), torch.device("cpu"), dtype)
    want = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    a, b = got.state_dict(), want.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    for (n, x), (m, y) in zip(got.named_buffers(), want.named_buffers()):
        assert n == m and torch.equal(x, y), n
    assert got.generation_config == want.generation_config and got.config.to_dict() == want.config.to_dict()
    assert got.training == want.training is False
    ids = torch.randint(0, got.config.vocab_size, (2, 9))
    assert torch.equal(got(input_ids=ids).logits, want(input_ids=ids).logits)


def test_a_converted_layout_is_left_to_transformers(tiny_dir, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from pcsd import models

    for f in tiny_dir.iterdir():
        shutil.copy2(f, tmp_path / f.name)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k.replace("model.", "transformer.", 1): v for k, v in weights.items()}, tmp_path / "model.safetensors")
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert models.load_on_device(tmp_path, cfg, torch.device("cpu"), torch.float32) is None  # names not the model's
    weights.pop("model.norm.weight")
    save_file(weights, tmp_path / "model.safetensors")
    assert models.load_on_device(tmp_path, cfg, torch.device("cpu"), torch.float32) is None  # a parameter missing
    # and on the CPU load_model is what it was: transformers' from_pretrained
    monkeypatch.setattr(models, "load_on_device", lambda *a, **k: pytest.fail("the CPU path changed"))
    assert next(models.load_model(tiny_dir, torch.device("cpu")).parameters()).device.type == "cpu"


def _two_adamw_steps(model, opt) -> None:
    """The two steps both sides of the fused-AdamW test take (the same batch and loss)."""
    ids = torch.arange(24).reshape(2, 12) % 50
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids).logits.float().pow(2).mean().backward()
        opt.step()


def _fused_adamw_rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """One rank: the tiny model sharded with FSDP2 (gloo), AdamW as a CUDA run makes it (fused; it
    runs on CPU DTensors too), two steps; then its full state through a resume's round trip."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.models import load_model
    from pcsd.train import distributed as du
    from pcsd.train.optim import make_adamw

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        model = du.shard_model(load_model(model_dir, torch.device("cpu"), "float32"), ctx)
        opt = make_adamw(model.parameters(), lr=1e-2, device="cuda")
        _two_adamw_steps(model, opt)
        box = [du.full_optimizer_state(model, opt, ctx)]  # rank 0's, as a checkpoint file holds it
        torch.distributed.broadcast_object_list(box, src=0)  # every rank reads the file at a resume
        state = box[0]
        opt.zero_grad(set_to_none=True)
        again = make_adamw(model.parameters(), lr=1e-2, device="cuda")
        du.load_full_state(model, again, du.full_model_state(model, ctx, all_ranks=True), state, ctx)
        weights = du.full_model_state(model, ctx)
        if ctx.is_main:
            torch.save(dict(weights=weights, fused=[g["fused"] for g in again.param_groups]), out)
    finally:
        du.shutdown(ctx)


def _one_process_adamw(_rank: int, model_dir: str, out: str) -> None:
    """The reference of the test below: the same two steps in one process, torch's AdamW default."""
    torch.set_num_threads(1)
    from pcsd.models import load_model
    from pcsd.train.optim import make_adamw

    model = load_model(model_dir, torch.device("cpu"), "float32")
    opt = make_adamw(model.parameters(), lr=1e-2, device="cpu")
    _two_adamw_steps(model, opt)
    torch.save(model.state_dict(), out)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed with gloo is needed")
def test_fused_adamw_under_fsdp2_equals_one_process(tiny_dir, tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rank0.pt"
    mp.spawn(_fused_adamw_rank, args=(2, port, str(tiny_dir), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert got["fused"] and all(got["fused"])  # kept through the resume's load
    # the one-process reference in a fresh process on one thread, as the ranks: a reduction's rounding
    # follows the thread count and the process's backend state, which earlier tests of a session change
    ref = tmp_path / "one.pt"
    mp.spawn(_one_process_adamw, args=(str(tiny_dir), str(ref)), nprocs=1, join=True)
    want = torch.load(ref)
    for k, v in got["weights"].items():  # a step is ~lr = 1e-2: 1e-5 is rounding in near-zero gradients
        torch.testing.assert_close(v, want[k], rtol=0, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
