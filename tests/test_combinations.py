"""Every combination trains (issue 27 part 5): each advantage estimator and policy loss with every
trained method of the method table through the update, on one process and on 2 FSDP2 ranks (gloo),
including a rank that dynamic sampling left without a group."""

from __future__ import annotations

import copy
import math
import os
import socket
import sys

import pytest
import torch

from pcsd.ops.estimators import available_estimators
from pcsd.ops.policy_losses import available_policy_losses
from pcsd.train.methods import METHODS

TRAINED = [m for m, v in METHODS.items() if not m.endswith("-star") and v["overrides"].get("optim.steps") != 0]

_SMALL = [
    "rollout.backend=hf",
    "optim.lr=1e-2",
    "optim.tokens_per_microbatch=96",
    "rollout.max_prompt_tokens=64",
    "rollout.max_response_tokens=32",
    "optim.grad_clip=1e9",
    "optim.ppo_epochs=2",  # a second epoch: ratios differ from 1, so ppo and gspo differ
    "algo.clip_eps_high=0.28",
]


def _cfg(*extra: str):
    import warnings

    from pcsd.train.config import ConfigWarning, load_config

    with warnings.catch_warnings():  # keys some methods do not read (e.g. the policy loss under opsd)
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(_SMALL + list(extra))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from pcsd.models import load_model
    from pcsd.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)
    student = load_model(path, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(student).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():  # the reference differs from the student: the KL term is not 0
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return path, student, frozen


def _update(models, cfg, rb):
    from pcsd.train.update import update_step

    _, base, frozen = models
    student = copy.deepcopy(base)
    before = [p.detach().clone() for p in student.parameters()]
    stats = update_step(student, frozen, torch.optim.SGD(student.parameters(), lr=0.02), rb, cfg, step=0)
    moved = sum(int(not torch.equal(a, p.detach())) for a, p in zip(before, student.parameters()))
    return stats, moved


def _combinations(models, method: str, pairs) -> dict:
    from pcsd.tiny_model import synthetic_rollout_batch

    rb = synthetic_rollout_batch(num_groups=3, group_size=2, seed=5)
    rb.reward[0] += 1.0  # no two groups alike
    out = {}
    for est, loss in pairs:
        cfg = _cfg(f"method={method}", f"algo.estimator={est}", f"algo.policy_loss={loss}")
        stats, moved = _update(models, cfg, rb)
        assert all(math.isfinite(stats[k]) for k in ("loss", "pg", "kl", "pcsd", "grad_norm")), (est, loss)
        assert moved > 0, (est, loss)
        out[est, loss] = stats
    base = out["grpo", "ppo"]
    for key, stats in out.items():
        if key == ("grpo", "ppo"):
            continue
        if cfg.algo.grpo:  # the estimator or the policy loss reaches the loss
            assert stats["pg"] != base["pg"], key
        else:  # OPSD: no policy-gradient term, neither changes anything
            assert stats["loss"] == base["loss"], key
    return out


@pytest.mark.parametrize("method", TRAINED)
def test_every_method_trains_with_gigpo_and_gspo(models, method):
    """Every method with GiGPO's advantages and GSPO's ratio, against GRPO's and PPO's."""
    _combinations(models, method, [("grpo", "ppo"), ("gigpo", "gspo")])


@pytest.mark.slow
@pytest.mark.parametrize("method", TRAINED)
def test_every_estimator_and_policy_loss_with_every_method(models, method):
    pairs = [(e, p) for e in available_estimators() for p in available_policy_losses()]
    out = _combinations(models, method, pairs)
    if METHODS[method]["overrides"]["algo.grpo"]:
        assert len({s["pg"] for s in out.values()}) == len(pairs)  # each pair its own policy term


def test_gigpo_without_anchors_is_one_line(models):
    from pcsd.tiny_model import synthetic_rollout_batch

    rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=5)
    rb.anchor = None
    with pytest.raises(ValueError, match="algo.estimator=gigpo needs each row's anchor state"):
        _update(models, _cfg("method=grpo", "algo.estimator=gigpo"), rb)


# ----------------------------------------------------------------------------- FSDP2
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, extra: list, shares: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = _cfg(*extra)
        student, frozen = _load(model_dir)
        du.shard_model(student, ctx)
        du.shard_model(frozen, ctx)
        opt = torch.optim.SGD(student.parameters(), lr=0.5)
        mine = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7).take_groups(shares[rank])
        stats = update_step(student, frozen, opt, mine, cfg, step=0, ctx=ctx)
        state = du.full_model_state(student, ctx)
        if ctx.is_main:
            torch.save({"stats": stats, "state": state}, out)
    finally:
        du.shutdown(ctx)


def _load(model_dir):
    from pcsd.models import load_model

    m = load_model(model_dir, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(m).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return m, frozen


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="gloo is needed")
@pytest.mark.parametrize(
    "extra, shares",
    [
        # dynamic sampling may leave a rank without a group: it joins the collectives with padding passes
        (["method=pcsd", "algo.estimator=gigpo", "algo.policy_loss=gspo"], [[0, 1, 2, 3, 4], []]),
        pytest.param(["method=sdar", "algo.estimator=rloo"], [[0, 1, 2], [3, 4]], marks=pytest.mark.slow),
    ],
    ids=["gigpo-gspo-a-rank-without-groups", "rloo"],
)
def test_two_gloo_ranks_match_one_process(models, tmp_path, extra, shares):
    import torch.multiprocessing as mp

    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.distributed import single_process
    from pcsd.train.update import update_step

    path = str(models[0])
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(2, _free_port(), path, str(out), extra, shares), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    student, frozen = _load(path)
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = update_step(
            student, frozen, torch.optim.SGD(student.parameters(), lr=0.5), rb, _cfg(*extra), 0, single_process()
        )
    finally:
        torch.set_num_threads(threads)
    for key in ("loss", "pg", "kl", "pcsd", "clip_frac", "tokens"):
        assert got["stats"][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert abs(ref["pg"]) > 1e-6
    for k, v in student.state_dict().items():
        if k in got["state"]:
            torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
