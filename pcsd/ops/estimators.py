"""Advantage estimators, pure functions registered by name (verl's ``register_adv_est`` pattern):
``grpo``, ``rloo`` and ``gigpo``. The trainer calls the one ``algo.estimator`` names and never
branches on it; a new estimator is a function plus a :func:`register_estimator`.

Every estimator takes one :class:`AdvantageInputs` (a batch of experience as rows = response turns,
trajectories and groups; shapes in its fields) and returns one advantage per ROW ``[R]`` float32,
which the update spreads over the row's response tokens. GRPO and RLOO give every row of a
trajectory the trajectory's advantage; GiGPO adds a step-level advantage that differs per row.

* ``grpo``: ``A_i = (R_i - mean_g R) / (std_g R + eps)`` over the G trajectories of group g,
  population std (:func:`pcsd.ops.grpo.group_advantages`, the paper's appendix). A group of one
  has advantage 0.
* ``rloo`` (verl's ``compute_rloo_outcome_advantage``): the leave-one-out baseline,
  ``A_i = R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_g R)``; a group of one has no other
  trajectory and keeps ``A_i = R_i`` (verl's rule).
* ``gigpo`` (GiGPO, verl-agent's ``gigpo/core_gigpo.py``):
  ``A_row = A^E(traj) + step_weight * A^S(row)``. The episode advantage ``A^E`` is GRPO's
  (``norm=mean_std``) or ``R_i - mean_g R`` (``norm=mean``). The step advantage groups the rows of
  one task group by their anchor state (identical observations, within a trajectory and across
  the group's trajectories) and normalises each row's discounted return
  ``G_t = sum_{k >= t} gamma^(k - t) r_k`` (``r_k`` the step rewards of its trajectory) within its
  anchor group: ``(G - mean) / (std + eps)`` with the sample (n - 1) std (``mean_std``) or
  ``G - mean`` (``mean``); an anchor group of one row has step advantage 0.

``group_stats`` (the config's ``algo.group_stats``) says what the group statistics of the reward
count: ``trajectory`` (the default, the paper's GRPO) counts each trajectory once, as above; ``row``
counts every response turn, as the SDAR/verl-agent code does (``compute_mean_std_cross_steps=True``
in its ``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage`` and GiGPO's
``episode_norm_reward``): a trajectory of L turns enters its group's mean and std L times, the std
is ``torch.std``'s (n - 1), and a group of one row has mean 0 and std 1 (GRPO, GiGPO: ``A = R /
(1 + eps)``; RLOO: ``A = R``). GiGPO's step level is per row under both.

Where pcsd differs from the public code, and why, is in ``docs/estimators.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from pcsd.ops.grpo import group_advantages
from pcsd.ops.registry import Registry
from pcsd.ops.segments import segment_sum

__all__ = [
    "AdvantageInputs",
    "Estimator",
    "anchor_group_counts",
    "available_estimators",
    "discounted_returns",
    "get_estimator",
    "gigpo_episode_advantages",
    "gigpo_step_advantages",
    "groups_with_signal",
    "register_estimator",
    "GIGPO_NORMS",
    "GROUP_STATS",
    "row_episode_advantages",
]

#: GiGPO's normalisations (verl-agent's ``mode``: ``mean_std_norm`` / ``mean_norm``)
GIGPO_NORMS = ("mean_std", "mean")
#: what the reward's group statistics count (``algo.group_stats``): trajectories (the paper) or rows (SDAR's code)
GROUP_STATS = ("trajectory", "row")


class AdvantageInputs(NamedTuple):
    """A batch of experience as the estimators read it: R rows (one per response turn), N
    trajectories. Integer ids need not be contiguous; the functions renumber them."""

    reward: Tensor  # (N,) float: each trajectory's reward R_i
    traj_group: Tensor  # (N,) int64: the group (task) of each trajectory
    row_traj: Tensor  # (R,) int64: the trajectory of each row, in [0, N)
    row_turn: Tensor  # (R,) int64: the row's turn within its trajectory, from 0, each (traj, turn) once
    step_reward: Tensor  # (R,) float: the reward of the row's step (a trajectory's steps sum to its R_i)
    anchor: Tensor  # (R,) int64: the row's anchor state (equal ids = identical observations)


@dataclass(frozen=True)
class Estimator:
    """A named estimator: ``fn(inputs, *, eps, **params) -> [R]`` float32 row advantages.
    ``defaults`` names exactly the parameters it reads (the config's ``algo.<name>.*`` keys)."""

    name: str
    fn: Callable[..., Tensor]
    defaults: dict[str, Any] = field(default_factory=dict)
    doc: str = ""
    uses_eps: bool = True  # reads eps (algo.adv_eps) under some setting of its parameters
    needs_anchor: bool = False  # reads the rows' anchor states
    group_stats: bool = False  # fn takes group_stats= (trajectory | row: what its group statistics count)

    def __call__(
        self, inputs: AdvantageInputs, *, eps: float = 1e-6, group_stats: str = "trajectory", **params: Any
    ) -> Tensor:
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"estimator {self.name!r} has no parameter(s) {sorted(unknown)}; valid: {sorted(self.defaults)}"
            )
        if group_stats not in GROUP_STATS:
            raise ValueError(f"group_stats must be one of {GROUP_STATS}, got {group_stats!r}")
        _check_inputs(inputs)
        kw = {**self.defaults, **params}
        if self.group_stats:
            kw["group_stats"] = group_stats
        elif group_stats != "trajectory":
            raise ValueError(f"estimator {self.name!r} has no group_stats={group_stats!r} (only trajectory)")
        return self.fn(inputs, eps=eps, **kw).to(torch.float32)


_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_estimator(
    name: str,
    doc: str = "",
    uses_eps: bool = True,
    needs_anchor: bool = False,
    group_stats: bool = False,
    **defaults: Any,
) -> Callable:
    """Decorator registering ``fn(inputs, *, eps, **params) -> [R]`` under ``name`` with the
    defaults of the parameters it reads (the config's ``algo.<name>.*`` keys); with
    ``group_stats=True`` ``fn`` also takes ``group_stats=`` (``trajectory`` or ``row``)."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        spec = Estimator(name, fn, dict(defaults), doc or (fn.__doc__ or ""), uses_eps, needs_anchor, group_stats)
        _ESTIMATORS.add(name, spec)
        return fn

    return deco


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; ValueError listing the valid names otherwise."""
    return _ESTIMATORS.get(name)


def available_estimators() -> list[str]:
    return _ESTIMATORS.names()


def _check_inputs(b: AdvantageInputs) -> None:
    n = b.reward.shape
    if b.reward.dim() != 1 or b.traj_group.shape != n:
        raise ValueError(
            f"reward and traj_group must be 1-D of one shape (N,), got {tuple(b.reward.shape)} and "
            f"{tuple(b.traj_group.shape)}"
        )
    r = b.row_traj.shape
    for name in ("row_turn", "step_reward", "anchor"):
        t = getattr(b, name)
        if t.shape != r or t.dim() != 1:
            raise ValueError(f"{name} must have row_traj's shape {tuple(r)} (one entry per row), got {tuple(t.shape)}")
    if b.row_traj.numel() and (int(b.row_traj.min()) < 0 or int(b.row_traj.max()) >= b.reward.numel()):
        raise ValueError(f"row_traj must be trajectory indices in [0, {b.reward.numel()})")
    if b.row_turn.numel() and int(b.row_turn.min()) < 0:
        raise ValueError("row_turn must be >= 0")


def _dense_ids(ids: Tensor) -> tuple[Tensor, int]:
    """``ids`` renumbered ``0..k-1`` (sorted order) and ``k``."""
    if ids.numel() == 0:
        return ids.long(), 0
    _, inv = torch.unique(ids, return_inverse=True)
    return inv, int(inv.max()) + 1


def _group_stats(x: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per group of ``ids`` (dense, ``k`` groups): count, mean and the sum of squared deviations
    (float64, deterministic sums)."""
    cnt = torch.bincount(ids, minlength=k).to(torch.float64)
    mean = segment_sum(x, ids, k) / cnt.clamp_min(1.0)
    dev = x - mean[ids]
    return cnt, mean, segment_sum(dev * dev, ids, k)


def groups_with_signal(reward: Tensor, traj_group: Tensor) -> Tensor:
    """``[k]`` bool per group (groups of ``traj_group`` in sorted order): its trajectories' rewards
    are not all equal (DAPO's dynamic sampling keeps these; an all-equal group has GRPO advantage
    0). Rewards compare exactly, as verl-agent's ``filter_group_data``."""
    ids, k = _dense_ids(traj_group)
    r = reward.to(torch.float64)
    hi = torch.full((k,), -torch.inf, dtype=torch.float64).scatter_reduce(0, ids, r, "amax")
    lo = torch.full((k,), torch.inf, dtype=torch.float64).scatter_reduce(0, ids, r, "amin")
    return hi > lo


# ----------------------------------------------------------------------------- grpo, rloo
def _row_stats(b: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(r, n, mean, std)`` per ROW: its trajectory's reward and its group's row count, mean and
    ``torch.std`` (n - 1) over the group's rows, a group of one row with mean 0 and std 1 (the
    SDAR/verl-agent code's ``compute_mean_std_cross_steps=True``)."""
    r = b.reward.to(torch.float64)[b.row_traj]
    ids, k = _dense_ids(b.traj_group[b.row_traj])
    cnt, mean, ss = _group_stats(r, ids, k)
    n = cnt[ids]
    one = n < 2
    mean_r = torch.where(one, torch.zeros_like(r), mean[ids])
    std_r = torch.where(one, torch.ones_like(r), (ss / (cnt - 1).clamp_min(1.0)).sqrt()[ids])
    return r, n, mean_r, std_r


def row_episode_advantages(b: AdvantageInputs, *, norm: str, eps: float) -> Tensor:
    """``[R]`` float64: GRPO's (``norm=mean_std``: ``(R - mean) / (std + eps)``) or the mean-centred
    (``mean``: ``R - mean``) advantage with the group statistics over ROWS (``group_stats=row``:
    :func:`_row_stats`), as the SDAR code's ``compute_grpo_outcome_advantage`` and GiGPO's
    ``episode_norm_reward``."""
    if norm not in GIGPO_NORMS:
        raise ValueError(f"norm must be one of {GIGPO_NORMS}, got {norm!r}")
    r, _, mean, std = _row_stats(b)
    return r - mean if norm == "mean" else (r - mean) / (std + eps)


@register_estimator("grpo", doc="GRPO: (R - group mean) / (group population std + eps)", group_stats=True)
def _grpo(b: AdvantageInputs, *, eps: float, group_stats: str = "trajectory") -> Tensor:
    if group_stats == "row":
        return row_episode_advantages(b, norm="mean_std", eps=eps)
    adv = group_advantages(b.reward, b.traj_group, eps=eps)
    return adv[b.row_traj]


@register_estimator(
    "rloo", doc="RLOO: R minus the mean of the group's other trajectories", uses_eps=False, group_stats=True
)
def _rloo(b: AdvantageInputs, *, eps: float, group_stats: str = "trajectory") -> Tensor:
    if group_stats == "row":  # verl-agent: n rows, each row a sample left out; a group of one row keeps R
        r, n, mean, _ = _row_stats(b)
        return torch.where(n > 1, r * n / (n - 1).clamp_min(1.0) - mean * n / (n - 1).clamp_min(1.0), r)
    ids, k = _dense_ids(b.traj_group)
    r = b.reward.to(torch.float64)
    cnt, mean, _ = _group_stats(r, ids, k)
    n = cnt[ids]
    # verl: R n/(n-1) - mean n/(n-1) for n > 1; a group of one keeps its reward
    adv = torch.where(n > 1, (r - mean[ids]) * n / (n - 1).clamp_min(1.0), r)
    return adv[b.row_traj]


# ----------------------------------------------------------------------------- gigpo
def discounted_returns(step_reward: Tensor, row_traj: Tensor, row_turn: Tensor, gamma: float) -> Tensor:
    """``[R]`` float64: each row's discounted return ``G_t = r_t + gamma G_{t+1}`` within its
    trajectory, turns in order (verl-agent's ``compute_step_discounted_returns``, its Eq. 5): the
    next step is the trajectory's next row by turn. A turn number without a row (none in pcsd's
    batches) is no step: it adds neither a reward nor a discount, as verl-agent discounts over the
    rows a trajectory has (a reward-0 step there would shrink the later rewards by one more gamma)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    R = step_reward.numel()
    if R == 0:
        return step_reward.to(torch.float64)
    traj, n = _dense_ids(row_traj)
    width = int(row_turn.max()) + 1
    key = traj * width + row_turn
    if torch.unique(key).numel() != R:
        raise ValueError("row_turn must name each turn of a trajectory once (two rows share a (trajectory, turn))")
    # each row's step index within its trajectory: its rank among the trajectory's turns
    order = torch.argsort(key)
    counts = torch.bincount(traj, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    step = torch.empty_like(row_turn)
    step[order] = torch.arange(R, device=row_turn.device) - starts[traj[order]]
    steps = int(counts.max())
    dense = torch.zeros(n, steps + 1, dtype=torch.float64, device=step_reward.device)
    dense[traj, step] = step_reward.to(torch.float64)
    for t in range(steps - 1, -1, -1):  # the last column stays 0: nothing after the last step
        dense[:, t] += gamma * dense[:, t + 1]
    return dense[traj, step]


def gigpo_episode_advantages(reward: Tensor, traj_group: Tensor, *, norm: str, eps: float) -> Tensor:
    """``[N]`` float64 episode-level advantages (GiGPO's Eq. 3): GRPO's with ``norm=mean_std``
    (population std, as :func:`pcsd.ops.grpo.group_advantages`), ``R - mean_g R`` with ``mean``."""
    if norm == "mean_std":
        return group_advantages(reward.to(torch.float64), traj_group, eps=eps)
    if norm != "mean":
        raise ValueError(f"norm must be one of {GIGPO_NORMS}, got {norm!r}")
    ids, k = _dense_ids(traj_group)
    r = reward.to(torch.float64)
    _, mean, _ = _group_stats(r, ids, k)
    return r - mean[ids]


def _anchor_group_ids(row_group: Tensor, anchor: Tensor) -> Tensor:
    """``[R]`` each row's anchor group, numbered from 0: rows of one task group (``row_group``) with
    equal ``anchor`` share one (``R`` > 0)."""
    _, ids = torch.unique(torch.stack([row_group.long(), anchor.long()], dim=1), dim=0, return_inverse=True)
    return ids


def gigpo_step_advantages(
    returns: Tensor, row_group: Tensor, anchor: Tensor, *, norm: str, eps: float
) -> tuple[Tensor, Tensor]:
    """``([R], [R])``: each row's step-level advantage (GiGPO's Eqs. 6-7) and the size of its
    anchor group. Rows of one task group (``row_group``) with equal ``anchor`` form an anchor
    group; ``returns`` ``[R]`` are normalised within it: ``(G - mean) / (std + eps)``, sample std
    (``mean_std``), or ``G - mean`` (``mean``). A group of one row gives 0."""
    if norm not in GIGPO_NORMS:
        raise ValueError(f"norm must be one of {GIGPO_NORMS}, got {norm!r}")
    R = returns.numel()
    if R == 0:
        return returns.to(torch.float64), torch.zeros(0, dtype=torch.int64)
    ids = _anchor_group_ids(row_group, anchor)
    k = int(ids.max()) + 1
    g = returns.to(torch.float64)
    cnt, mean, ss = _group_stats(g, ids, k)
    dev = g - mean[ids]
    if norm == "mean":
        adv = dev
    else:
        std = (ss / (cnt - 1).clamp_min(1.0)).sqrt()  # torch.std's (n - 1), as verl-agent
        adv = dev / (std[ids] + eps)
    single = cnt[ids] < 2
    return torch.where(single, torch.zeros_like(adv), adv), cnt[ids].long()


def anchor_group_counts(traj_group: Tensor, row_traj: Tensor, anchor: Tensor) -> tuple[int, int, int]:
    """``(rows, anchor groups, rows in an anchor group of two or more)`` of a batch: the groups
    :func:`gigpo_step_advantages` normalises within (rows of one task group with equal anchor
    states). A row alone in its group gets no step-level advantage. Counts, so that ranks holding
    whole task groups can sum them."""
    R = row_traj.numel()
    if R == 0:
        return 0, 0, 0
    ids = _anchor_group_ids(traj_group[row_traj], anchor)
    cnt = torch.bincount(ids)
    return R, int(cnt.numel()), int((cnt[ids] >= 2).sum())


@register_estimator(
    "gigpo",
    doc="GiGPO: episode advantage + step_weight x step advantage within anchor-state groups",
    needs_anchor=True,
    group_stats=True,
    step_weight=1.0,
    norm="mean_std",
    gamma=0.95,
)
def _gigpo(
    b: AdvantageInputs, *, eps: float, step_weight: float, norm: str, gamma: float, group_stats: str = "trajectory"
) -> Tensor:
    if group_stats == "row":
        adv = row_episode_advantages(b, norm=norm, eps=eps)
    else:
        adv = gigpo_episode_advantages(b.reward, b.traj_group, norm=norm, eps=eps)[b.row_traj]
    if step_weight != 0 and b.row_traj.numel():
        returns = discounted_returns(b.step_reward, b.row_traj, b.row_turn, gamma)
        step, _ = gigpo_step_advantages(returns, b.traj_group[b.row_traj], b.anchor, norm=norm, eps=eps)
        adv = adv + step_weight * step
    return adv
