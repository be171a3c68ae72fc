"""DAPO's dynamic sampling in the RL step's rollout phase (``rollout.dynamic_sampling=true``).

A group whose trajectories all got the same reward has GRPO advantage 0: it trains nothing but the
KL and distillation terms. With dynamic sampling the step drops such groups and plays batches of
fresh tasks (``rollout.tasks_per_step`` groups each) until ``rollout.tasks_per_step`` groups carry
a signal or ``rollout.max_sample_batches`` batches were played; the kept groups beyond
``tasks_per_step`` are left out (DAPO trims its batch to the batch size), and a step that ends
short trains on what it has, with one warning line. Never an error, never an endless loop; a step
left with no group at all is skipped (see :func:`sample_groups`).

Under FSDP2 every rank plays its share of each batch and the decision to play another is taken on
the count summed over ranks, so every rank plays the same number of batches (their generation and
collectives stay in step); the groups kept are shared out over the ranks as evenly as each rank's
own kept groups allow (:func:`share_quota`).

:func:`sample_groups` takes the playing as a callable, so it is tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from pcsd.ops.estimators import anchor_group_counts, groups_with_signal
from pcsd.rollout.loop import RolloutBatch
from pcsd.train import distributed as dist_utils
from pcsd.train.distributed import DistContext, single_process

__all__ = ["MAX_SAMPLE_BATCHES", "Sampled", "sample_groups", "share_quota", "signal_groups"]

#: the most batches one step may play (``rollout.max_sample_batches``'s bound, checked at config read):
#: a model whose groups never carry a signal costs at most this many batches' rollouts per step
MAX_SAMPLE_BATCHES = 100


@dataclass
class Sampled:
    """What a step's rollout phase played and what it trains on (this rank's; counts over ranks)."""

    train: RolloutBatch  # the groups the step trains on (empty: the step is skipped)
    played: RolloutBatch  # every episode this rank played in the step, dropped groups included
    batches: int  # batches played (the same on every rank)
    kept: int = 0  # groups trained on, over every rank
    dropped: int = 0  # groups dropped for rewards all equal, over every rank
    surplus: int = 0  # groups with a signal beyond rollout.tasks_per_step, left out, over every rank
    warning: Optional[str] = None  # the step's one warning line (ended short of the target), or None
    dynamic: bool = False  # dynamic sampling ran (the counts above are set)

    @property
    def skipped(self) -> bool:
        """Dynamic sampling left no group: the step trains on nothing."""
        return self.dynamic and self.kept == 0

    def anchor_counts(self) -> tuple[int, int, int]:
        """GiGPO's anchor-group counts (:func:`pcsd.ops.estimators.anchor_group_counts`: rows, anchor
        groups, rows in a group of two or more) of the groups the step trains on, which the
        estimator read, not of every group played; zeros for a skipped step or a batch without
        anchor states."""
        tb = self.train
        if tb.anchor is None:
            return 0, 0, 0
        return anchor_group_counts(tb.traj_group, tb.traj_id, tb.anchor)

    def metrics(self) -> dict[str, int]:
        """The step record's sampling counts (none without dynamic sampling)."""
        if not self.dynamic:
            return {}
        return dict(
            sample_batches=self.batches, groups_kept=self.kept, groups_dropped=self.dropped, groups_surplus=self.surplus
        )


def signal_groups(rb: RolloutBatch) -> list[int]:
    """The ids (values of ``rb.traj_group``, in sorted order) of the groups whose rewards are not all
    equal: what :meth:`pcsd.rollout.loop.RolloutBatch.take_groups` takes, whatever the ids are."""
    ids = torch.unique(rb.traj_group, sorted=True).tolist()
    mask = groups_with_signal(rb.reward, rb.traj_group).tolist()
    return [g for g, s in zip(ids, mask) if s]


def _count_groups(rb: RolloutBatch) -> int:
    return int(torch.unique(rb.traj_group).numel())


def share_quota(counts: list[int], target: int) -> list[int]:
    """How many of its kept groups each rank trains on: ``min(target, sum(counts))`` groups dealt
    out one at a time in rank order to the ranks that still have one (as even as ``counts`` allow)."""
    if target < 0 or any(c < 0 for c in counts):
        raise ValueError(f"counts and target must be >= 0, got {counts} and {target}")
    quota = [0] * len(counts)
    left = min(target, sum(counts))
    while left:
        for r, c in enumerate(counts):
            if left and quota[r] < c:
                quota[r] += 1
                left -= 1
    return quota


def sample_groups(
    play: Callable[[int], RolloutBatch],
    *,
    target: int,
    max_batches: int,
    dynamic: bool,
    ctx: Optional[DistContext] = None,
    report: Optional[Callable[[str], None]] = None,
) -> Sampled:
    """The step's rollouts. ``play(b)`` plays batch ``b`` (0, 1, ...): this rank's share of a draw of
    ``target`` task groups. Without ``dynamic`` one batch is played and trained on whole.

    With ``dynamic``: groups without a reward signal (:func:`pcsd.ops.estimators.groups_with_signal`)
    are dropped, and batches are played until ``target`` groups over every rank carry a signal or
    ``max_batches`` were played; at most ``target`` groups are kept, the first ones played on each
    rank (:func:`share_quota` over ranks). Ending short of ``target`` sets ``warning``; with no group
    at all the step is ``skipped`` (the caller trains nothing: the step still counts, its games were
    played, the model is unchanged). ``report`` gets one line per further batch (batch 2, 3, ...):
    what it found, over every rank (give it on every rank or on none)."""
    ctx = ctx or single_process()
    if target < 1 or max_batches < 1:
        raise ValueError(f"target and max_batches must be >= 1, got {target} and {max_batches}")
    first = play(0)
    if not dynamic:
        return Sampled(train=first, played=first, batches=1)
    batches = [first]
    signal = [signal_groups(first)]  # per batch: the ids of its groups with a signal
    while True:
        (n_signal,) = dist_utils.global_sum([sum(len(s) for s in signal)], ctx)
        if n_signal >= target or len(batches) >= max_batches:
            break
        rb = play(len(batches))
        batches.append(rb)
        signal.append(signal_groups(rb))
        if report is not None:  # what the extra batch found, summed over ranks
            found, groups = dist_utils.global_sum([len(signal[-1]), _count_groups(rb)], ctx)
            report(
                f"dynamic sampling: batch {len(batches)} (of at most rollout.max_sample_batches={max_batches}): "
                f"{int(found)} of its {int(groups)} groups carry a reward signal; {int(n_signal + found)} of the "
                f"{target} wanted so far"
            )
    mine = sum(len(s) for s in signal)
    onehot = [0.0] * ctx.world_size
    onehot[ctx.rank] = float(mine)
    counts = [int(c) for c in dist_utils.global_sum(onehot, ctx)]
    quota = share_quota(counts, target)[ctx.rank]
    parts = []
    for rb, sig in zip(batches, signal):
        take = sig[:quota]
        quota -= len(take)
        parts.append(rb.take_groups(take))
    played_groups = int(dist_utils.global_sum([sum(_count_groups(rb) for rb in batches)], ctx)[0])
    total = sum(counts)
    kept = min(total, target)
    out = Sampled(
        train=RolloutBatch.concat(parts),
        played=RolloutBatch.concat(batches),
        batches=len(batches),
        kept=kept,
        dropped=played_groups - total,
        surplus=total - kept,
        dynamic=True,
    )
    if kept < target:
        what = (
            f"the step trains on these {kept}"
            if kept
            else "none carries one: the step is skipped (it counts as a step; the model is unchanged)"
        )
        out.warning = (
            f"dynamic sampling: {kept} of the rollout.tasks_per_step={target} groups wanted carry a reward "
            f"signal after {len(batches)} batches (rollout.max_sample_batches={max_batches}, {played_groups} "
            f"groups played); {what}"
        )
    return out
