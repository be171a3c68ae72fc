"""DAPO's dynamic sampling (pcsd.train.sampling) with a fake player: which groups are kept, the limit
on batches, the one warning line, a skipped step, and on 2 gloo ranks the same number of batches."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch

from pcsd.tiny_model import synthetic_rollout_batch
from pcsd.train.distributed import DistContext
from pcsd.train.sampling import sample_groups, share_quota


def batch(signal: list[bool], seed: int = 0, group_size: int = 2):
    """A batch of len(signal) groups; group g's rewards differ iff signal[g]."""
    rb = synthetic_rollout_batch(num_groups=len(signal), group_size=group_size, seed=seed)
    r = torch.zeros(rb.num_trajectories)
    for g, s in enumerate(signal):
        if s:
            r[g * group_size] = 10.0
    rb.reward = r
    return rb


class Player:
    """Plays the scripted batches in turn, recording the calls."""

    def __init__(self, *scripts: list[bool]) -> None:
        self.scripts, self.calls = scripts, []

    def __call__(self, b: int):
        self.calls.append(b)
        return batch(self.scripts[min(b, len(self.scripts) - 1)], seed=b)


def test_without_dynamic_sampling_one_batch_is_trained_whole():
    play = Player([False, True, False])
    out = sample_groups(play, target=3, max_batches=3, dynamic=False)
    assert play.calls == [0] and out.train is out.played and out.train.num_groups == 3
    assert not out.skipped and out.warning is None and out.metrics() == {}


def test_enough_signal_in_the_first_batch_keeps_the_first_groups():
    play = Player([True, False, True, True])
    out = sample_groups(play, target=2, max_batches=3, dynamic=True)
    assert play.calls == [0] and out.batches == 1 and out.warning is None
    assert out.metrics() == dict(sample_batches=1, groups_kept=2, groups_dropped=1, groups_surplus=1)
    first = batch([True, False, True, True], seed=0)
    assert out.train.response_ids == first.take_groups([0, 2]).response_ids
    assert out.played.num_groups == 4


def test_more_batches_until_the_target_and_no_more():
    play = Player([False, True, False], [True, True, False], [True, True, True])
    out = sample_groups(play, target=3, max_batches=5, dynamic=True)
    assert play.calls == [0, 1] and out.batches == 2 and out.warning is None
    assert (out.kept, out.dropped, out.surplus) == (3, 3, 0)
    assert out.train.num_groups == 3 and out.played.num_groups == 6
    b0, b1 = batch([False, True, False], seed=0), batch([True, True, False], seed=1)
    assert out.train.response_ids == b0.take_groups([1]).response_ids + b1.take_groups([0, 1]).response_ids
    # the kept groups' rewards differ, group by group
    for g in range(3):
        assert out.train.reward[out.train.traj_group == g].unique().numel() == 2


def test_the_limit_ends_the_sampling_short_with_one_warning():
    play = Player([False, False, False], [False, True, False])
    out = sample_groups(play, target=3, max_batches=3, dynamic=True)
    assert play.calls == [0, 1, 2] and out.batches == 3  # never more than rollout.max_sample_batches
    assert out.kept == 2 and out.train.num_groups == 2 and not out.skipped
    assert out.warning is not None and "\n" not in out.warning
    assert "2 of the rollout.tasks_per_step=3 groups" in out.warning and "trains on these 2" in out.warning


def test_no_group_with_a_signal_skips_the_step():
    play = Player([False, False])
    out = sample_groups(play, target=2, max_batches=4, dynamic=True)
    assert play.calls == [0, 1, 2, 3] and out.skipped and out.train.num_rows == 0
    assert out.metrics() == dict(sample_batches=4, groups_kept=0, groups_dropped=8, groups_surplus=0)
    assert "the step is skipped" in out.warning and out.played.num_groups == 8


def test_one_batch_allowed_filters_without_playing_more():
    play = Player([True, False])
    out = sample_groups(play, target=2, max_batches=1, dynamic=True)
    assert play.calls == [0] and out.kept == 1 and out.warning is not None


def test_share_quota():
    assert share_quota([3, 3], 4) == [2, 2]
    assert share_quota([0, 5], 3) == [0, 3]
    assert share_quota([1, 4, 2], 6) == [1, 3, 2]
    assert share_quota([1, 1], 5) == [1, 1]
    assert share_quota([], 3) == []
    with pytest.raises(ValueError):
        share_quota([-1], 1)


# ----------------------------------------------------------------------------- two ranks
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# per rank, per batch: the signal of each of its groups (rank 1 finds its signal later than rank 0)
SCRIPTS = {0: ([True, False], [True, True], [True, True]), 1: ([False, False], [False, False], [True, False])}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from pcsd.train import distributed as du

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        play = Player(*SCRIPTS[rank])
        res = sample_groups(play, target=4, max_batches=3, dynamic=True, ctx=ctx)
        torch.save(dict(calls=play.calls, groups=res.train.num_groups, metrics=res.metrics()), f"{out}.{rank}")
    finally:
        du.shutdown(ctx)


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="gloo is needed")
def test_every_rank_plays_the_same_batches_and_the_kept_groups_are_shared(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "res")
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=False) for r in range(2))
    # after batch 1: 3 groups with a signal over both ranks (< 4), so both play batch 2; then 6 >= 4
    assert r0["calls"] == r1["calls"] == [0, 1, 2]
    # rank 0 has 5 kept, rank 1 has 1: dealt out one at a time -> 3 and 1
    assert (r0["groups"], r1["groups"]) == (3, 1)
    assert r0["metrics"] == r1["metrics"] == dict(sample_batches=3, groups_kept=4, groups_dropped=6, groups_surplus=2)


def test_single_process_context_is_the_default():
    play = Player([True, True])
    a = sample_groups(play, target=2, max_batches=2, dynamic=True)
    b = sample_groups(Player([True, True]), target=2, max_batches=2, dynamic=True, ctx=DistContext())
    assert a.metrics() == b.metrics()


# ----------------------------------------------------------------------------- issue 42
def test_group_ids_that_are_not_positions_keep_the_groups_with_a_signal():
    """take_groups takes group ids; the kept groups were named by their position among the batch's
    groups, right only while the ids are 0..k-1."""
    rb = batch([False, True, False, True]).take_groups([0, 1, 2, 3])
    rb.traj_group = rb.traj_group * 5 + 3  # ids 3, 8, 13, 18: the signal is in groups 8 and 18
    out = sample_groups(lambda b: rb, target=2, max_batches=1, dynamic=True)
    assert out.kept == 2 and out.train.num_groups == 2
    assert out.train.response_ids == rb.take_groups([8, 18]).response_ids
    for g in range(2):  # each kept group has its reward signal
        assert out.train.reward[out.train.traj_group == g].unique().numel() == 2


def test_share_quota_deals_from_the_first_rank():
    assert share_quota([2, 2], 3) == [2, 1]
    assert share_quota([1, 1, 1], 2) == [1, 1, 0]
    assert share_quota([3, 0, 3], 5) == [3, 0, 2]


def test_each_further_batch_says_what_it_found():
    lines: list[str] = []
    play = Player([False, True, False], [True, False, False], [True, True, True])
    out = sample_groups(play, target=3, max_batches=4, dynamic=True, report=lines.append)
    assert play.calls == [0, 1, 2] and out.kept == 3
    assert lines == [  # the first batch says nothing: one line per further batch
        "dynamic sampling: batch 2 (of at most rollout.max_sample_batches=4): 1 of its 3 groups carry a reward "
        "signal; 2 of the 3 wanted so far",
        "dynamic sampling: batch 3 (of at most rollout.max_sample_batches=4): 3 of its 3 groups carry a reward "
        "signal; 5 of the 3 wanted so far",
    ]
    quiet: list[str] = []
    sample_groups(Player([True, True, True]), target=3, max_batches=4, dynamic=True, report=quiet.append)
    assert quiet == []


def test_anchor_counts_are_of_the_groups_trained_on_not_of_every_group_played():
    """GiGPO's anchor fields of a step count the groups the estimator read (dynamic sampling's kept
    ones), not the dropped groups played beside them."""
    from pcsd.ops.estimators import anchor_group_counts

    play = Player([False, True, False, False])
    out = sample_groups(play, target=1, max_batches=1, dynamic=True)
    tb, pb = out.train, out.played
    assert out.anchor_counts() == anchor_group_counts(tb.traj_group, tb.traj_id, tb.anchor)
    assert out.anchor_counts()[0] == tb.num_rows < pb.num_rows
    assert out.anchor_counts() != anchor_group_counts(pb.traj_group, pb.traj_id, pb.anchor)
    skipped = sample_groups(Player([False, False]), target=1, max_batches=1, dynamic=True)
    assert skipped.skipped and skipped.anchor_counts() == (0, 0, 0)
