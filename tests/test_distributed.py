"""FSDP2 update on 2 CPU processes (gloo) == the same update in one process.

A fixed RolloutBatch (random token ids, no generation) is split by whole groups over 2 ranks; each
rank shards the tiny student and the frozen reference/teacher with ``fully_shard`` and runs
:func:`pcsd.train.update.update_step` on its share. The loss and the updated weights must match one
process on the whole batch: the GRPO ``1/G sum_g 1/M_g`` and PCSD ``1/M`` normalisers are global.
"""

from __future__ import annotations

import copy
import os
import socket
import sys

import pytest
import torch

from pcsd.train.distributed import DistContext, select_groups, single_process, split_groups

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="torch.distributed with gloo is needed"
)


def _cfg(extra=(), **algo):
    from pcsd.train.config import load_config

    ov = [
        "rollout.backend=hf",
        "optim.lr=1e-2",
        "optim.tokens_per_microbatch=96",
        "rollout.max_prompt_tokens=64",
        "rollout.max_response_tokens=32",
        "optim.grad_clip=1e9",
    ]
    ov += [f"algo.{k}={v}" for k, v in algo.items()] + list(extra)
    return load_config(ov)


def _optimizer(model):
    # SGD: the updated weights are w - lr * grad, so comparing them compares the gradients. (Adam's
    # first step is lr * g / (|g| + eps), about lr * sign(g): float rounding in near-zero gradient
    # entries would flip whole steps and say nothing about the loss normalisation.)
    return torch.optim.SGD(model.parameters(), lr=0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(model_dir):
    from pcsd.models import load_model

    m = load_model(model_dir, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(m).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():  # reference != student: the KL term and its gradient are not 0
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return m, frozen


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, algo: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = _cfg(**algo)
        student, frozen = _load(model_dir)
        du.shard_model(student, ctx)
        du.shard_model(frozen, ctx)
        opt = _optimizer(student)
        rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
        mine = select_groups(rb, split_groups(5, ctx))
        stats = update_step(student, frozen, opt, mine, cfg, step=0, ctx=ctx)
        state = du.full_model_state(student, ctx)
        if ctx.is_main:
            torch.save({"stats": stats, "state": state}, out)
    finally:
        du.shutdown(ctx)


# the ranks run the default update (fused lm-head, joint frozen pass); the one-process reference
# runs it too, or (third case) the recomputing path with two frozen passes
_RECOMPUTE = ("optim.fused_lm_head=false", "optim.joint_frozen_pass=never")


@pytest.fixture(scope="module")
def two_ranks(tiny_dir, tmp_path_factory):
    """``run(algo)``: rank 0's stats and full weights after the 2-rank update with ``algo``, computed once
    per ``algo`` (the first and third cases give the ranks the same update; only their references differ)."""
    import torch.multiprocessing as mp

    done: dict = {}

    def run(algo: dict) -> dict:
        key = tuple(sorted(algo.items()))
        if key not in done:
            out = tmp_path_factory.mktemp("ranks") / "rank0.pt"
            mp.spawn(_worker, args=(2, _free_port(), str(tiny_dir), str(out), algo), nprocs=2, join=True)
            done[key] = torch.load(out, weights_only=False)
        return done[key]

    return run


@pytest.mark.parametrize(
    "algo, ref_extra",
    [(dict(), ()), (dict(loss_agg="token-mean", lambda_distill=0.5), ()), (dict(), _RECOMPUTE)],
    ids=["paper-agg", "token-mean", "fused-vs-recompute"],
)
def test_two_gloo_ranks_match_one_process(tiny_dir, two_ranks, algo, ref_extra):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    got = two_ranks(algo)

    cfg = _cfg(ref_extra, **algo)
    assert cfg.optim.fused_lm_head == (not ref_extra)
    student, frozen = _load(tiny_dir)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    opt = _optimizer(student)
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = update_step(student, frozen, opt, rb, cfg, step=0, ctx=single_process())
    finally:
        torch.set_num_threads(threads)

    for key in ("loss", "pg", "kl", "pcsd", "clip_frac", "gap_mean", "weight_mean", "tokens"):
        assert got["stats"][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert abs(ref["pcsd"]) > 1e-6 and abs(ref["kl"]) > 1e-6  # the terms with global normalisers take part
    sd = student.state_dict()
    assert set(got["state"]) >= {k for k in sd if k != "lm_head.weight"}
    moved = 0
    for k, v in sd.items():
        if k not in got["state"]:
            continue
        torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
        moved += int(not torch.equal(v, before[k]))
    assert moved >= len(sd) - 1  # the update really moved the weights being compared


def test_split_groups_covers_every_group_once():
    for n in range(0, 13):
        for world in range(1, 5):
            parts = [split_groups(n, DistContext(rank=r, world_size=world)) for r in range(world)]
            assert [g for p in parts for g in p] == list(range(n))
            assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_select_groups_keeps_whole_groups():
    from pcsd.tiny_model import synthetic_rollout_batch

    rb = synthetic_rollout_batch(num_groups=4, group_size=3, seed=1)
    sub = select_groups(rb, range(1, 3))
    assert sub.num_trajectories == 6
    assert sub.traj_group.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(sub.reward, rb.reward[3:9])
    rows = [i for i, t in enumerate(rb.traj_id.tolist()) if 3 <= t < 9]
    assert sub.response_ids == [rb.response_ids[i] for i in rows]
    assert sub.traj_id.tolist() == [rb.traj_id[i].item() - 3 for i in rows]
    with pytest.raises(ValueError, match="select no trajectory"):
        select_groups(rb, range(4, 5))


def test_bad_arguments():
    from pcsd.train.distributed import init_distributed

    with pytest.raises(ValueError, match="rank"):
        init_distributed(rank=2, world_size=2)
    with pytest.raises(ValueError, match="device"):
        init_distributed(rank=0, world_size=1, device="tpu")
    with pytest.raises(ValueError, match="num_groups"):
        split_groups(-1, single_process())
