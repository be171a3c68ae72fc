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

from pcsd.ops.estimators import groups_with_signal
from pcsd.rollout.loop import RolloutBatch
from pcsd.train import distributed as dist_utils
from pcsd.train.distributed import DistContext, single_process

__all__ = ["Sampled", "sample_groups", "share_quota"]


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

    def metrics(self) -> dict[str, int]:
        """The step record's sampling counts (none without dynamic sampling)."""
        if not self.dynamic:
            return {}
        return dict(
            sample_batches=self.batches, groups_kept=self.kept, groups_dropped=self.dropped, groups_surplus=self.surplus
        )


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
) -> Sampled:
    """The step's rollouts. ``play(b)`` plays batch ``b`` (0, 1, ...): this rank's share of a draw of
    ``target`` task groups. Without ``dynamic`` one batch is played and trained on whole.

    With ``dynamic``: groups without a reward signal (:func:`pcsd.ops.estimators.groups_with_signal`)
    are dropped, and batches are played until ``target`` groups over every rank carry a signal or
    ``max_batches`` were played; at most ``target`` groups are kept, the first ones played on each
    rank (:func:`share_quota` over ranks). Ending short of ``target`` sets ``warning``; with no group
    at all the step is ``skipped`` (the caller trains nothing: the step still counts, its games were
    played, the model is unchanged)."""
    ctx = ctx or single_process()
    if target < 1 or max_batches < 1:
        raise ValueError(f"target and max_batches must be >= 1, got {target} and {max_batches}")
    first = play(0)
    if not dynamic:
        return Sampled(train=first, played=first, batches=1)
    batches = [first]
    signal = [groups_with_signal(first.reward, first.traj_group).tolist()]
    while True:
        (n_signal,) = dist_utils.global_sum([sum(sum(s) for s in signal)], ctx)
        if n_signal >= target or len(batches) >= max_batches:
            break
        rb = play(len(batches))
        batches.append(rb)
        signal.append(groups_with_signal(rb.reward, rb.traj_group).tolist())
    mine = sum(sum(s) for s in signal)
    onehot = [0.0] * ctx.world_size
    onehot[ctx.rank] = float(mine)
    counts = [int(c) for c in dist_utils.global_sum(onehot, ctx)]
    quota = share_quota(counts, target)[ctx.rank]
    parts = []
    for rb, sig in zip(batches, signal):
        take = [g for g, s in enumerate(sig) if s][:quota]
        quota -= len(take)
        parts.append(rb.take_groups(take))
    played_groups = int(dist_utils.global_sum([sum(len(s) for s in signal)], ctx)[0])
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
