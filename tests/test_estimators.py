"""The advantage estimators (pcsd.ops.estimators) against values worked out by hand from the public
formulas (GRPO, verl's RLOO, GiGPO's Eqs. 3-8 as verl-agent's gigpo/core_gigpo.py computes them), and
against a plain loop written from those formulas on random batches."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.ops.estimators import (
    AdvantageInputs,
    anchor_group_counts,
    available_estimators,
    discounted_returns,
    get_estimator,
    groups_with_signal,
)
from pcsd.ops.grpo import group_advantages

S0, S1, S2, T0, T1 = 40, 41, 42, 50, 51  # anchor ids (any integers)


def hand_batch() -> AdvantageInputs:
    """Three task groups.

    group 7 (three trajectories, rewards 10, 0, 10):
      traj 0: turns 0-2 at anchors S0, S1, S0 (S0 repeated INSIDE the trajectory), step rewards 0, 0, 10
      traj 1: turns 0-1 at anchors S0, S2, step rewards 0, 0
      traj 2: one step (a single-step episode) at S0, step reward 10
    group 3 (two trajectories, rewards 10 and 10: all equal):
      traj 3: turns 0-1 at T0, T1, step rewards 0, 10
      traj 4: one step at T0, step reward 10
    group 9 (a group of one): traj 5, one step at S0 (S0 again: anchors never join across groups), reward 10
    """
    rows = [  # (traj, turn, anchor, step reward)
        (0, 0, S0, 0.0),
        (1, 0, S0, 0.0),
        (2, 0, S0, 10.0),
        (3, 0, T0, 0.0),
        (4, 0, T0, 10.0),
        (5, 0, S0, 10.0),
        (0, 1, S1, 0.0),
        (1, 1, S2, 0.0),
        (3, 1, T1, 10.0),
        (0, 2, S0, 10.0),
    ]
    traj, turn, anchor, r = zip(*rows)
    return AdvantageInputs(
        reward=torch.tensor([10.0, 0.0, 10.0, 10.0, 10.0, 10.0]),
        traj_group=torch.tensor([7, 7, 7, 3, 3, 9]),
        row_traj=torch.tensor(traj),
        row_turn=torch.tensor(turn),
        step_reward=torch.tensor(r),
        anchor=torch.tensor(anchor),
    )


def by_row(b: AdvantageInputs, per_row: dict) -> torch.Tensor:
    """``{(traj, turn): value}`` in the batch's row order."""
    return torch.tensor(
        [per_row[(t, k)] for t, k in zip(b.row_traj.tolist(), b.row_turn.tolist())], dtype=torch.float64
    )


def test_registry_names_and_errors():
    assert set(available_estimators()) >= {"grpo", "rloo", "gigpo"}
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'.*grpo"):
        get_estimator("gae")
    with pytest.raises(ValueError, match="no parameter.*'lam'"):
        get_estimator("gigpo")(hand_batch(), lam=0.9)
    b = hand_batch()
    with pytest.raises(ValueError, match="anchor must have row_traj's shape"):
        get_estimator("grpo")(b._replace(anchor=b.anchor[:3]))


def test_grpo_is_group_advantages_unchanged():
    b = hand_batch()
    got = get_estimator("grpo")(b, eps=1e-6)
    assert torch.equal(got, group_advantages(b.reward, b.traj_group, eps=1e-6)[b.row_traj])
    # group 7: mean 20/3, population std sqrt(200/9) -> 1/sqrt(2), -sqrt(2), 1/sqrt(2); the others 0
    exp = {0: 1 / math.sqrt(2), 1: -math.sqrt(2), 2: 1 / math.sqrt(2), 3: 0.0, 4: 0.0, 5: 0.0}
    torch.testing.assert_close(
        got.double(), torch.tensor([exp[t] for t in b.row_traj.tolist()], dtype=torch.float64), atol=1e-5, rtol=0
    )


def test_rloo_by_hand():
    b = hand_batch()._replace(reward=torch.tensor([3.0, 0.0, 6.0, 5.0, 5.0, 2.0]))
    got = get_estimator("rloo")(b)
    # group 7: R - mean of the other two: 3 - 3, 0 - 4.5, 6 - 1.5; group 3 all equal: 0; group of one: R itself
    exp = {0: 0.0, 1: -4.5, 2: 4.5, 3: 0.0, 4: 0.0, 5: 2.0}
    assert got.tolist() == [exp[t] for t in b.row_traj.tolist()]


def test_discounted_returns_by_hand():
    b = hand_batch()
    got = discounted_returns(b.step_reward, b.row_traj, b.row_turn, gamma=0.5)
    exp = {(0, 2): 10.0, (0, 1): 5.0, (0, 0): 2.5, (1, 0): 0.0, (1, 1): 0.0, (2, 0): 10.0}
    exp.update({(3, 1): 10.0, (3, 0): 5.0, (4, 0): 10.0, (5, 0): 10.0})
    assert torch.equal(got, by_row(b, exp))
    assert torch.equal(
        discounted_returns(b.step_reward, b.row_traj, b.row_turn, gamma=1.0),
        by_row(b, {k: (10.0 if k[0] != 1 else 0.0) for k in exp}),
    )
    with pytest.raises(ValueError, match="each turn of a trajectory once"):
        discounted_returns(torch.ones(2), torch.tensor([0, 0]), torch.tensor([1, 1]), 0.9)


def test_a_turn_without_a_row_is_no_step():
    """verl-agent discounts over the rows a trajectory has (``compute_step_discounted_returns``: the
    next row is one gamma away); a turn number with no row is neither a reward-0 step nor a further
    gamma. Trajectory 0 has turns 0, 2 and 5 (rows given out of order), trajectory 1 turns 1, 2."""
    step_reward = torch.tensor([10.0, 1.0, 2.0, 0.0, 4.0], dtype=torch.float64)
    row_traj = torch.tensor([0, 0, 0, 1, 1])
    row_turn = torch.tensor([5, 0, 2, 2, 1])
    got = discounted_returns(step_reward, row_traj, row_turn, gamma=0.5)
    # traj 0 in turn order: 1, 2, 10 -> 1 + 0.5 (2 + 0.5 * 10) = 4.5, 2 + 5 = 7, 10; traj 1: 4 + 0, 0
    assert got.tolist() == [10.0, 4.5, 7.0, 0.0, 4.0]
    # the same as the turns renumbered 0, 1, 2 (what the trajectory's rows are)
    dense = discounted_returns(step_reward, row_traj, torch.tensor([2, 0, 1, 1, 0]), gamma=0.5)
    assert torch.equal(got, dense)
    # and as the plain loop (verl-agent's) on a GiGPO batch whose trajectories skip turns
    b = AdvantageInputs(
        torch.tensor([10.0, 0.0, 10.0]),
        torch.tensor([4, 4, 4]),
        torch.tensor([0, 0, 1, 1, 2, 2]),
        torch.tensor([0, 3, 1, 4, 0, 1]),
        torch.tensor([0.0, 10.0, 0.0, 0.0, 0.0, 10.0]),
        torch.tensor([1, 2, 1, 2, 1, 2]),
    )
    exp = loop_gigpo(b, "mean_std", 0.7, 0.5, 1e-6)
    got_adv = get_estimator("gigpo")(b, eps=1e-6, norm="mean_std", step_weight=0.7, gamma=0.5)
    torch.testing.assert_close(got_adv.double(), torch.tensor(exp, dtype=torch.float64), atol=2e-5, rtol=1e-5)


def gigpo_hand(norm: str, step_weight: float) -> dict:
    """GiGPO on :func:`hand_batch` with gamma 0.5, worked out by hand."""
    # returns (gamma 0.5): traj 0: 2.5, 5, 10; traj 1: 0, 0; traj 2: 10; traj 3: 5, 10; traj 4: 10; traj 5: 10
    # episode advantages: group 7 rewards 10, 0, 10 (mean 20/3); groups 3 and 9: 0
    if norm == "mean_std":
        ep = {0: 1 / math.sqrt(2), 1: -math.sqrt(2), 2: 1 / math.sqrt(2), 3: 0.0, 4: 0.0, 5: 0.0}
    else:
        ep = {0: 10 / 3, 1: -20 / 3, 2: 10 / 3, 3: 0.0, 4: 0.0, 5: 0.0}
    # anchor groups: (7, S0) = rows (0,0) 2.5, (0,2) 10, (1,0) 0, (2,0) 10: mean 22.5/4 = 5.625,
    #   deviations -3.125, 4.375, -5.625, 4.375, squares sum 79.6875, sample std sqrt(79.6875 / 3)
    # (3, T0) = rows (3,0) 5, (4,0) 10: mean 7.5, deviations -2.5, 2.5, sample std sqrt(12.5 / 1)
    # (7, S1), (7, S2), (3, T1), (9, S0): one row each -> 0
    dev = {(0, 0): -3.125, (0, 2): 4.375, (1, 0): -5.625, (2, 0): 4.375, (3, 0): -2.5, (4, 0): 2.5}
    sd = {(0, 0): 79.6875 / 3, (0, 2): 79.6875 / 3, (1, 0): 79.6875 / 3, (2, 0): 79.6875 / 3}
    sd.update({(3, 0): 12.5, (4, 0): 12.5})
    out = {}
    for key in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (3, 0), (3, 1), (4, 0), (5, 0)]:
        step = 0.0
        if key in dev:
            step = dev[key] / math.sqrt(sd[key]) if norm == "mean_std" else dev[key]
        out[key] = ep[key[0]] + step_weight * step
    return out


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("step_weight", [1.0, 0.5])
def test_gigpo_by_hand(norm, step_weight):
    b = hand_batch()
    got = get_estimator("gigpo")(b, eps=1e-12, norm=norm, step_weight=step_weight, gamma=0.5)
    torch.testing.assert_close(got.double(), by_row(b, gigpo_hand(norm, step_weight)), atol=1e-5, rtol=1e-6)
    # the all-equal group 3 has no episode signal but a step signal (the shorter success is better)
    assert float(got[3]) < 0 < float(got[4])


def test_gigpo_without_step_weight_is_grpo():
    b = hand_batch()
    a = get_estimator("gigpo")(b, eps=1e-6, step_weight=0.0, norm="mean_std")
    assert torch.equal(a, get_estimator("grpo")(b, eps=1e-6))


def test_gigpo_rejects_unknown_norm_and_gamma():
    with pytest.raises(ValueError, match="norm must be one of"):
        get_estimator("gigpo")(hand_batch(), norm="std")
    with pytest.raises(ValueError, match="gamma must be in"):
        get_estimator("gigpo")(hand_batch(), gamma=1.5)


def test_groups_with_signal():
    b = hand_batch()
    assert groups_with_signal(b.reward, b.traj_group).tolist() == [False, True, False]  # groups 3, 7, 9
    assert groups_with_signal(torch.tensor([1.0, 1.0 + 1e-7]), torch.tensor([0, 0])).tolist() == [True]


def test_empty_batch():
    e = torch.zeros(0, dtype=torch.int64)
    b = AdvantageInputs(torch.zeros(0), e, e, e, torch.zeros(0), e)
    for name in available_estimators():
        assert get_estimator(name)(b).shape == (0,)


# ----------------------------------------------------------------------------- against a plain loop
def loop_gigpo(b: AdvantageInputs, norm: str, step_weight: float, gamma: float, eps: float) -> list[float]:
    """GiGPO as verl-agent's loops compute it (dicts of lists, torch.std for the step groups), with
    the episode part computed per trajectory with the population std (pcsd's GRPO)."""
    reward, group = b.reward.tolist(), b.traj_group.tolist()
    members = defaultdict(list)
    for t, g in enumerate(group):
        members[g].append(reward[t])
    ep = []
    for t, g in enumerate(group):
        mu = sum(members[g]) / len(members[g])
        sd = math.sqrt(sum((x - mu) ** 2 for x in members[g]) / len(members[g]))
        ep.append((reward[t] - mu) / (sd + eps) if norm == "mean_std" else reward[t] - mu)
    rows = list(zip(b.row_traj.tolist(), b.row_turn.tolist(), b.anchor.tolist(), b.step_reward.tolist()))
    ret = {}
    for t in set(r[0] for r in rows):
        steps = sorted((k, r) for tt, k, _, r in rows if tt == t)
        run = 0.0
        for k, r in reversed(steps):
            run = r + gamma * run
            ret[(t, k)] = run
    step_groups = defaultdict(list)
    for t, k, a, _ in rows:
        step_groups[(group[t], a)].append(ret[(t, k)])
    out = []
    for t, k, a, _ in rows:
        xs = step_groups[(group[t], a)]
        if len(xs) == 1:
            s = 0.0
        else:
            mu = sum(xs) / len(xs)
            sd = float(torch.tensor(xs, dtype=torch.float64).std())
            s = (ret[(t, k)] - mu) / (sd + eps) if norm == "mean_std" else ret[(t, k)] - mu
        out.append(ep[t] + step_weight * s)
    return out


@st.composite
def batches(draw):
    n_groups = draw(st.integers(1, 4))
    traj_group, reward, rows = [], [], []
    for g in range(n_groups):
        for _ in range(draw(st.integers(1, 4))):
            t = len(traj_group)
            traj_group.append(g * 3 + 1)
            reward.append(draw(st.sampled_from([0.0, 1.0, 10.0, 2.5])))
            for k in range(draw(st.integers(1, 5))):
                rows.append((t, k, draw(st.integers(0, 3)), draw(st.sampled_from([0.0, 0.0, 1.0, -0.1]))))
    order = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in order]
    traj, turn, anchor, r = zip(*rows)
    return AdvantageInputs(
        torch.tensor(reward),
        torch.tensor(traj_group),
        torch.tensor(traj),
        torch.tensor(turn),
        torch.tensor(r),
        torch.tensor(anchor),
    )


@settings(max_examples=60, deadline=None)
@given(b=batches(), norm=st.sampled_from(["mean_std", "mean"]), gamma=st.sampled_from([0.0, 0.5, 0.95, 1.0]))
def test_gigpo_matches_loop(b, norm, gamma):
    got = get_estimator("gigpo")(b, eps=1e-6, norm=norm, step_weight=0.7, gamma=gamma)
    exp = loop_gigpo(b, norm, 0.7, gamma, 1e-6)
    torch.testing.assert_close(got.double(), torch.tensor(exp, dtype=torch.float64), atol=2e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(b=batches())
def test_rloo_matches_loop(b):
    reward, group = b.reward.tolist(), b.traj_group.tolist()
    exp = []
    for t in b.row_traj.tolist():
        others = [reward[j] for j in range(len(reward)) if group[j] == group[t] and j != t]
        exp.append(reward[t] - sum(others) / len(others) if others else reward[t])
    torch.testing.assert_close(get_estimator("rloo")(b).double(), torch.tensor(exp, dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(
    n_traj=st.integers(1, 12),
    rows=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 3)), min_size=0, max_size=40),
    groups=st.lists(st.integers(0, 3), min_size=12, max_size=12),
)
def test_anchor_group_counts_equal_a_plain_count(n_traj, rows, groups):
    """(rows, anchor groups, rows in a group of two or more): the groups are (task group, anchor)
    pairs, counted here with a dict; an anchor id shared across task groups is two groups."""
    rows = [(t % n_traj, a) for t, a in rows]
    traj_group = torch.tensor(groups[:n_traj])
    row_traj = torch.tensor([t for t, _ in rows], dtype=torch.int64)
    anchor = torch.tensor([a for _, a in rows], dtype=torch.int64)
    size: dict[tuple[int, int], int] = defaultdict(int)
    for t, a in rows:
        size[(groups[t], a)] += 1
    want = (len(rows), len(size), sum(size[(groups[t], a)] >= 2 for t, a in rows))
    assert anchor_group_counts(traj_group, row_traj, anchor) == want


def test_anchor_group_counts_of_the_first_turns_of_one_group():
    """Four trajectories of one task group start from the same observation (one anchor group of 4
    rows); their second turns reach two states, one of them twice: 3 groups, 6 of 7 rows shared."""
    traj_group = torch.tensor([0, 0, 0, 0])
    row_traj = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    anchor = torch.tensor([5, 5, 5, 5, 8, 8, 9])
    assert anchor_group_counts(traj_group, row_traj, anchor) == (7, 3, 6)
    empty = torch.zeros(0, dtype=torch.int64)
    assert anchor_group_counts(traj_group, empty, empty) == (0, 0, 0)
