"""The rest of the family (issue 39): ``algo.group_stats=row`` against the SDAR/verl-agent code's
GRPO, RLOO and GiGPO episode statistics; AgentOPSD's turn advantage and SDPO's sampled-token loss
against the public code's formulas, written here as that code computes them (padded ``[B, L]``
batches, loops over trajectories and groups); the teacher's context from the group's successes."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from pcsd.ops.estimators import AdvantageInputs, get_estimator
from pcsd.ops.losses import TokenTerms, sdpo_token_loss
from pcsd.ops.weighting import RowBatch, agentopsd_advantages, get_rule
from pcsd.rollout.teacher_context import SUCCESS_HEADER, pick_peers, success_text

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- group_stats=row
def sdar_rows(scores: list[float], index: list[int], mode: str, eps: float = 1e-6) -> list[float]:
    """The SDAR code's ``compute_grpo_outcome_advantage`` / GiGPO's ``episode_norm_reward``
    (``mode`` ``mean_std`` / ``mean``) and ``compute_rloo_outcome_advantage`` (``rloo``) with
    ``compute_mean_std_cross_steps=True``: every row's score enters its group's statistics."""
    s = torch.tensor(scores, dtype=torch.float32)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(len(scores)):
        id2score[index[i]].append(s[i])
    for idx, xs in id2score.items():
        if len(xs) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx] = torch.mean(torch.tensor(xs))
            id2std[idx] = torch.std(torch.tensor([xs]))
    out = s.clone()
    for i in range(len(scores)):
        n = len(id2score[index[i]])
        if mode == "rloo":
            if n > 1:
                out[i] = s[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
        elif mode == "mean":
            out[i] = s[i] - id2mean[index[i]]
        else:
            out[i] = (s[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return out.tolist()


def row_batch() -> AdvantageInputs:
    """Groups of unequal row counts: group 7 (trajectories of 3, 2 and 1 turns, rewards 10, 0, 10),
    group 3 (rewards all equal, 2 and 1 turns), group 9 (one trajectory of one turn: a group of one
    row), group 4 (one trajectory of two turns: one trajectory, two rows)."""
    rows = [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (0, 1), (1, 1), (3, 1), (0, 2), (6, 0), (6, 1)]
    traj, turn = zip(*rows)
    return AdvantageInputs(
        reward=torch.tensor([10.0, 0.0, 10.0, 10.0, 10.0, 7.0, 3.0]),
        traj_group=torch.tensor([7, 7, 7, 3, 3, 9, 4]),
        row_traj=torch.tensor(traj),
        row_turn=torch.tensor(turn),
        step_reward=torch.zeros(len(rows)),
        anchor=torch.arange(len(rows)),  # every anchor alone: GiGPO's step term is 0
    )


@pytest.mark.parametrize(
    "name,params,mode",
    [
        ("grpo", {}, "mean_std"),
        ("rloo", {}, "rloo"),
        ("gigpo", {"norm": "mean_std"}, "mean_std"),
        ("gigpo", {"norm": "mean"}, "mean"),
    ],
)
def test_group_stats_row_is_the_sdar_codes(name, params, mode):
    b = row_batch()
    scores = b.reward[b.row_traj].tolist()
    index = b.traj_group[b.row_traj].tolist()
    got = get_estimator(name)(b, eps=1e-6, group_stats="row", **params)
    ref = torch.tensor(sdar_rows(scores, index, mode))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    # group 9 (one row): R / (1 + eps), R under RLOO and norm=mean; group 4 (two rows of R): 0; group 3: 0
    single = b.row_traj.tolist().index(5)
    assert got[single].item() == pytest.approx(7.0 if mode in ("rloo", "mean") else 7.0 / (1 + 1e-6))
    for r, g in enumerate(index):
        if g in (3, 4):
            assert got[r].item() == 0.0
    # the default (trajectory) differs on this batch: rows are not trajectories
    assert not torch.allclose(get_estimator(name)(b, eps=1e-6, **params), got)


def test_group_stats_row_gigpo_step_term_is_unchanged():
    b = row_batch()._replace(anchor=torch.zeros(12, dtype=torch.int64), step_reward=torch.arange(12.0))
    est = get_estimator("gigpo")
    step = est(b, group_stats="row") - est(b, group_stats="row", step_weight=0.0)
    assert torch.allclose(step, est(b) - est(b, step_weight=0.0))


def test_group_stats_bad_value():
    with pytest.raises(ValueError, match="group_stats must be one of"):
        get_estimator("grpo")(row_batch(), group_stats="rows")
    from pcsd.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"algo.group_stats"):
        load_config(["algo.group_stats=rows"])


# ----------------------------------------------------------------------------- AgentOPSD
def opsd_turn_reference(
    student, teacher, mask, traj_uid, turn_step, v0, seq_adv, lam=0.5, band=0.2, eps=1e-6
) -> torch.Tensor:
    """``compute_opsd_turn_advantage`` with ``belief_mult``, ``signed``, ``belief_gate``,
    ``mult_signed`` (AgentOPSD's ALFWorld script), on padded ``[B, L]`` rows, float32."""
    rmask = mask.float()
    delta_turn = ((teacher - student) * rmask).sum(-1)
    V0 = torch.clamp(v0.float(), 1e-4, 1 - 1e-4)
    traj_to_rows = defaultdict(list)
    for i in range(len(traj_uid)):
        traj_to_rows[traj_uid[i]].append(i)
    A_row = torch.zeros(len(traj_uid))
    for rows in traj_to_rows.values():
        idx = torch.tensor(sorted(rows, key=lambda r: turn_step[r]))
        v0_ep = V0[idx[0]]
        d = delta_turn[idx]
        V = torch.clamp(torch.sigmoid(torch.log(v0_ep / (1 - v0_ep)) + torch.cumsum(d, 0)), eps, 1 - eps)
        q = V - torch.cat([v0_ep.view(1), V[:-1]])
        a = seq_adv[idx]
        std = q.std(unbiased=False) if q.numel() > 1 else torch.zeros(())
        m = torch.clamp(1 + band * torch.sign(a) * (q - q.mean()) / (std + eps), 1 - band, 1 + band)
        A_row[idx] = a * ((1 - lam) + lam * m)
    return A_row.unsqueeze(-1) * rmask


def opsd_case(seed: int = 0):
    """Three groups: group 0 (3 trajectories: 3, 2 and 1 turns; two won), group 1 (2 trajectories of
    2 turns, none won: all-equal rewards, advantage 0), group 2 (2 trajectories of 2 and 3 turns, none
    won but rewards that differ, e.g. by the invalid-action penalty: the prior clamped to 1e-4 under
    non-zero advantages), turns of 1-5 tokens padded to 5."""
    g = torch.Generator().manual_seed(seed)
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (3, 0), (3, 1), (4, 0), (4, 1)]
    rows += [(5, 0), (5, 1), (6, 0), (6, 1), (6, 2)]
    rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]  # rows in any order
    lens = torch.randint(1, 6, (len(rows),), generator=g)
    L = 5
    mask = torch.arange(L)[None, :] < lens[:, None]
    student = -torch.rand(len(rows), L, generator=g) * 2
    teacher = student + torch.randn(len(rows), L, generator=g)
    student, teacher = student * mask, teacher * mask  # padding: zeros
    won = torch.tensor([True, False, True, False, False, False, False])
    traj_group = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    seq_adv_traj = torch.tensor([0.7071, -1.4142, 0.7071, 0.0, 0.0, 1.0, -1.0])
    traj = torch.tensor([t for t, _ in rows])
    turn = torch.tensor([k for _, k in rows])
    v0 = torch.tensor([2 / 3, 2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])[traj]
    return rows, lens, mask, student, teacher, won, traj_group, seq_adv_traj, traj, turn, v0


def packed(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[r, : int(n)] for r, n in enumerate(lens)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agentopsd_is_the_public_turn_advantage(seed):
    rows, lens, mask, student, teacher, won, tg, adv_t, traj, turn, v0 = opsd_case(seed)
    ref = opsd_turn_reference(student, teacher, mask, traj.tolist(), turn.tolist(), v0, adv_t[traj])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    rb = RowBatch(
        advantages=torch.repeat_interleave(adv_t[traj], lens),
        gap=packed(teacher - student, lens),
        offsets=offsets,
        row_traj=traj,
        row_turn=turn,
        traj_group=tg,
        won=won,
    )
    got = agentopsd_advantages(rb)
    torch.testing.assert_close(got, packed(ref, lens), rtol=1e-5, atol=1e-6)
    assert torch.equal(get_rule("agentopsd").batch_advantages(rb, 1), got)  # the registered defaults
    # group 1 (no success, all-equal rewards): advantage 0; the multiplier stays in [0.9, 1.1] x A
    tok_traj = torch.repeat_interleave(traj, lens)
    assert bool((got[(tok_traj == 3) | (tok_traj == 4)] == 0).all())
    moved = (tok_traj < 3) | (tok_traj > 4)
    ratio = got[moved] / rb.advantages[moved]
    assert bool((ratio >= 0.9 - 1e-6).all() and (ratio <= 1.1 + 1e-6).all())
    assert float((ratio[tok_traj[moved] > 4] - 1).abs().max()) > 1e-3  # group 2: no success, still moved


def test_agentopsd_by_hand():
    """One trajectory of two turns, prior 0.5, summed gaps 1 and -1, A = 1: V = sigmoid(1), 0.5;
    q = sigmoid(1) - 0.5, 0.5 - sigmoid(1): z = +1, -1 (up to eps); m = 1.2, 0.8; A' = 1.1, 0.9."""
    rb = RowBatch(
        advantages=torch.ones(3),
        gap=torch.tensor([0.5, 0.5, -1.0]),
        offsets=torch.tensor([0, 2, 3]),
        row_traj=torch.tensor([0, 0]),
        row_turn=torch.tensor([0, 1]),
        traj_group=torch.tensor([0, 0]),
        won=torch.tensor([True, False]),
    )
    torch.testing.assert_close(agentopsd_advantages(rb), torch.tensor([1.1, 1.1, 0.9]), rtol=0, atol=1e-5)


def test_agentopsd_is_an_advantage_rule_that_needs_old_logprobs():
    rule = get_rule("agentopsd")
    assert rule.kind == "batch" and rule.needs_old and rule.needs_teacher and not rule.distills
    assert not get_rule("pcsd").needs_old
    adv = torch.arange(3.0)
    rb = RowBatch(
        adv, adv, torch.tensor([0, 3]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), torch.tensor([True])
    )
    assert get_rule("pcsd").batch_advantages(rb, 1) is adv  # other kinds: the estimator's


# ----------------------------------------------------------------------------- SDPO
def sdpo_reference(student, teacher, old, mask, sd_mask, is_clip=2.0) -> torch.Tensor:
    """``compute_self_distillation_loss`` (``full_logit_distillation=False``, ``alpha=1``,
    ``loss_agg_mode=token-mean``) on padded ``[B, L]`` rows."""
    loss_mask = mask.float() * sd_mask.unsqueeze(1)
    per = (student - teacher).detach() * student
    ratio = torch.exp(torch.clamp((student - old).detach(), min=-20.0, max=20.0)).clamp(max=is_clip)
    per = per * ratio
    return (per * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)


def test_sdpo_is_the_public_sampled_token_loss():
    g = torch.Generator().manual_seed(3)
    B, L = 4, 6
    lens = torch.tensor([6, 2, 4, 1])
    mask = torch.arange(L)[None, :] < lens[:, None]
    old = -torch.rand(B, L, generator=g) * 3
    student = (old + torch.randn(B, L, generator=g)).requires_grad_(True)  # some ratios above the cap 2
    teacher = old + torch.randn(B, L, generator=g)
    sd_mask = torch.tensor([1.0, 0.0, 1.0, 1.0])  # row 1: no demonstration
    ref = sdpo_reference(student, teacher, old, mask, sd_mask)
    (g_ref,) = torch.autograd.grad(ref, student)
    assert bool(((student - old).exp() > 2)[mask].any())  # the cap is exercised
    rule = get_rule("sdpo")
    dmask = packed(mask & sd_mask.bool()[:, None], lens)
    lp = packed(student, lens)
    per = rule(lp, packed(teacher, lens), packed(old, lens), dmask)
    got = per.sum() / dmask.sum()  # the code's denominator: tokens with a demonstration
    torch.testing.assert_close(got, ref)
    (g_got,) = torch.autograd.grad(got, student)
    torch.testing.assert_close(g_got, g_ref)
    assert torch.equal(per, sdpo_token_loss(lp, packed(teacher, lens), packed(old, lens)) * dmask)


def test_sdpo_through_the_rule_interface_reads_the_teacher_mask():
    n = 5
    lp = torch.randn(n)
    t = TokenTerms(
        old_logp=lp.clone(),
        advantages=torch.zeros(n),
        coef=torch.ones(n),
        mask=torch.ones(n, dtype=torch.bool),
        traj_ids=torch.zeros(n, dtype=torch.int64),
        segments=(0, 3, 5),
        gap=torch.ones(n),
        teacher_logp=lp + 1.0,
        teacher_mask=torch.tensor([True, True, True, False, False]),
    )
    r = get_rule("sdpo").terms(t, 1)
    loss = r.loss(lp, t)
    assert torch.equal(loss[3:], torch.zeros(2)) and bool((loss[:3] != 0).all())
    w = get_rule("pcsd").terms(t, 1).weights
    assert torch.equal(w[3:], torch.zeros(2))


# ----------------------------------------------------------------------------- the teacher's context
def test_pick_peers_first_other_success():
    assert (
        pick_peers([True, True, False, False, True, False, False, False, False], 3)
        == [1, 0, 0, 4, None, 4] + [None] * 3
    )
    with pytest.raises(ValueError):
        pick_peers([True], 0)


def test_success_text_bounded_in_tokens():
    steps = [(f"room {k}", f"go {k}") for k in range(10)]
    count = lambda s: len(s.split())  # noqa: E731
    full = success_text(steps, count, 10_000)
    assert full.startswith(SUCCESS_HEADER) and "Step 10 action: go 9" in full and "not shown" not in full
    budget = count(SUCCESS_HEADER) + 2 * count("Step 1 observation: room 0\nStep 1 action: go 0")
    short = success_text(steps, count, budget)
    assert "Step 2 action: go 1" in short and "Step 3" not in short and "(8 later steps of the 10-step episode" in short
    assert count("\n".join(short.split("\n")[:-1])) == budget  # whole steps within the budget


class _DoorBackend:
    """A scripted policy for :class:`textenv_secret.SecretDoor`: env ``e`` opens ``plan[e][turn]``."""

    name = "scripted"

    def __init__(self, tokenizer, eos: int, plan: list[list[int]], right: list[int]) -> None:
        self.tok, self.eos, self.plan, self.right = tokenizer, eos, plan, right
        self.active, self.turn = list(range(len(plan))), 0

    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0, stop_token_ids=()):
        from pcsd.rollout.backends import Sample

        assert len(prompts) == len(self.active)
        out, still = [], []
        for e in self.active:
            door = self.plan[e][self.turn]
            ids = self.tok.encode(f"<action>open door {door}</action>") + [self.eos]
            out.append([Sample(token_ids=ids, logprobs=[0.0] * len(ids), finished=True)])
            if door != self.right[e] and self.turn < 2:
                still.append(e)
        self.active, self.turn = still, self.turn + 1
        return out


def test_the_teachers_prompt_holds_a_peers_success_never_its_own(tiny_dir, monkeypatch):
    from pcsd.envs.protocol import EnvFactory
    from pcsd.rollout.loop import collect_rollouts
    from pcsd.text.prompts import PromptBuilder

    monkeypatch.syspath_prepend(str(HERE))
    builder = PromptBuilder("text", history_length=1, max_prompt_tokens=1024, tokenizer_dir=tiny_dir)
    eos = builder.tokenizer.encode("<|im_end|>")[0]
    seeds, G = [4, 5, 6], 3
    right = [random.Random(s).randrange(3) + 1 for s in seeds for _ in range(G)]
    wrong = [r % 3 + 1 for r in right]
    plan = [
        [right[0]] * 3,  # group 0: env 0 wins at once, env 1 at its second step, env 2 never
        [wrong[1], right[1], right[1]],
        [wrong[2]] * 3,
        [wrong[3]] * 3,  # group 1: env 4 alone wins
        [right[4]] * 3,
        [wrong[5]] * 3,
        *([[wrong[e]] * 3 for e in range(6, 9)]),  # group 2: no success
    ]
    backend = _DoorBackend(builder.tokenizer, eos, plan, right)

    def roll(**kw):
        backend.active, backend.turn = list(range(9)), 0
        return collect_rollouts(
            backend,
            builder,
            seeds,
            G,
            max_steps=3,
            max_response_tokens=16,
            stop_token_ids=[eos],
            env_kind="gym",
            env_options={"make_env": EnvFactory("textenv_secret:SecretDoor", kwargs={"privileged": False})},
            teacher_context="group-success",
            **kw,
        )

    rb = roll()
    assert rb.won.tolist() == [True, True, False, False, True, False, False, False, False]
    dec = builder.tokenizer.decode
    actions = defaultdict(list)
    for e, k, a in sorted(zip(rb.traj_id.tolist(), rb.turn.tolist(), rb.actions)):
        actions[e].append(a)
    peer = {0: 1, 1: 0, 2: 0, 3: 4, 4: None, 5: 4, 6: None, 7: None, 8: None}
    assert rb.teacher_context is not None
    for row in range(rb.num_rows):
        e = int(rb.traj_id[row])
        s, t = dec(rb.prompt_ids[row]), dec(rb.teacher_prompt_ids[row])
        assert SUCCESS_HEADER not in s
        p = peer[e]
        if p is None:  # no other success, no skills, no privileged text: no teacher context
            assert t == s and not bool(rb.teacher_context[row])
            continue
        assert bool(rb.teacher_context[row]) and SUCCESS_HEADER in t
        shown = t[t.index(SUCCESS_HEADER) :]
        for k, a in enumerate(actions[p]):
            assert f"Step {k + 1} action: {a}" in shown
        assert f"Step {len(actions[p]) + 1} action" not in shown  # the peer's episode, not the student's own
        assert actions[p] != actions[e] or len(actions[p]) != len(actions[e])
        assert t.endswith(s.split("<|im_start|>user\n", 1)[1])  # then exactly the student's prompt
    # the budget: a few tokens keep the header and leave the steps out
    # dynamic sampling's sub-batches and concatenation keep each row's flag
    flags = rb.teacher_context.tolist()
    keep = [f for f, g in zip(flags, rb.group_id.tolist()) if g in (0, 1)]
    assert rb.take_groups([1, 0]).teacher_context.tolist() == keep
    assert type(rb).concat([rb, rb]).teacher_context.tolist() == flags + flags
    rb2 = roll(teacher_context_tokens=len(builder.tokenizer.encode(SUCCESS_HEADER)))
    t = dec(rb2.teacher_prompt_ids[rb2.traj_id.tolist().index(2)])
    assert "Step 1 action" not in t and "later steps" in t


def test_group_success_lets_a_teacher_train_without_skills_or_privileged_text(monkeypatch):
    from pcsd.train.config import ConfigError, load_config

    monkeypatch.syspath_prepend(str(HERE))
    env = ["env.name=gym", "env.entry_point=textenv_secret:SecretDoor", "env.kwargs.privileged=false"]
    with pytest.raises(ConfigError, match="algo.teacher_context=group-success"):
        load_config([*env, "method=pcsd"])
    assert (
        load_config([*env, "method=pcsd", "algo.teacher_context=group-success"]).algo.teacher_context == "group-success"
    )
    assert load_config([*env, "method=sdpo"]).algo.teacher_context == "group-success"
    with pytest.raises(ConfigError, match="algo.teacher_context"):
        load_config([*env, "method=sdpo", "algo.teacher_context=peers"])
    with pytest.raises(ConfigError, match="algo.teacher_context_tokens must be > 0"):
        load_config([*env, "method=sdpo", "algo.teacher_context_tokens=0"])


#: the coin env: no skills, no privileged text, a group's episodes both win and lose untrained
COIN = ["env.name=gym", "env.entry_point=textenv_coin:CoinDoor", "env.max_steps=2"]


def _train(tmp_path, monkeypatch, env: list[str], *extra: str) -> tuple[dict, list[dict]]:
    """One RL step on the tiny model (:func:`test_privileged.one_step_args`, no warm-up), then
    ``extra``: the summary and the step records (``metrics.jsonl``)."""
    import json

    from test_privileged import one_step_args

    from pcsd.train.cli import main

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(HERE)
    run = tmp_path / "run"
    assert main([*env, *one_step_args(run), *extra]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return json.loads((run / "summary.json").read_text()), lines


#: a cheap end-to-end run: groups of 4 on 2 tasks (a coin-tossing env: a group with a success and a
#: failure for 1 - 2 x 2^-4 of the draws), the smallest model, one evaluation episode each side, one
#: env worker process per pool
CHEAP = [
    "rollout.group_size=4",
    "rollout.max_response_tokens=6",
    "eval.episodes=1",
    "model.tiny_hidden_size=32",
    "env.num_threads=1",
]


def _finite_update(rec: dict) -> None:
    import math

    assert not rec.get("skipped") and rec["tokens"] > 0
    for k in ("loss", "pg", "kl", "pcsd", "grad_norm", "gap_mean"):
        assert math.isfinite(rec[k]), (k, rec)
    assert 0 < rec["success"] < 100, rec  # the coin: a group's successes for the teacher's context


def test_sdpo_trains_end_to_end(tmp_path, monkeypatch):
    """method=sdpo (group-success, its default) on an env without skills or privileged text: the
    distillation term is the step's loss (no policy-gradient term), non-zero: the teachers of some
    turns read a peer's success."""
    s, (rec,) = _train(tmp_path, monkeypatch, COIN, "method=sdpo", *CHEAP)
    assert s["method"] == "sdpo" and s["steps"] == 1
    _finite_update(rec)
    assert rec["pcsd"] != 0.0 and rec["gap_mean"] != 0.0
    assert rec["pg"] == 0.0  # distillation alone (algo.grpo=false)


def test_agentopsd_trains_end_to_end(tmp_path, monkeypatch):
    """method=agentopsd on the same env: the update's advantages are the estimator's times the
    turn multiplier, in [0.9, 1.1] (lambda 0.5, band 0.2), not all 1 (two turns per episode, gaps
    from a peer's success); no distillation term."""
    from pcsd.ops.weighting import WeightRule

    seen = []
    batch_advantages = WeightRule.batch_advantages

    def spy(self, rows, step, **params):
        out = batch_advantages(self, rows, step, **params)
        seen.append((self.name, rows, out))
        return out

    monkeypatch.setattr(WeightRule, "batch_advantages", spy)
    s, (rec,) = _train(tmp_path, monkeypatch, COIN, "method=agentopsd", "algo.teacher_context=group-success", *CHEAP)
    assert s["method"] == "agentopsd" and s["steps"] == 1
    _finite_update(rec)
    assert rec["pcsd"] == 0.0 and rec["gap_mean"] != 0.0 and rec["pg"] != 0.0
    ((name, rows, out),) = seen
    assert name == "agentopsd" and bool(rows.gap.ne(0).any())
    a = rows.advantages
    ratio = out[a != 0] / a[a != 0]
    assert ratio.numel() and bool(((ratio >= 0.9 - 1e-6) & (ratio <= 1.1 + 1e-6)).all()), ratio
    assert float((ratio - 1).abs().max()) > 1e-3  # the multiplier moved some turn's advantage


def test_pcsd_trains_with_the_groups_successes_on_an_env_without_skills_or_privileged_text(tmp_path, monkeypatch):
    """method=pcsd algo.teacher_context=group-success on the coin env (no skills, no
    ``info["privileged"]``): the teacher reads a peer's success, so the gaps and the distillation
    term are non-zero."""
    s, (rec,) = _train(tmp_path, monkeypatch, COIN, "method=pcsd", "algo.teacher_context=group-success", *CHEAP)
    assert s["method"] == "pcsd" and s["steps"] == 1 and s["success_after"] is not None
    assert not (tmp_path / "run" / "skills").exists()
    _finite_update(rec)
    assert rec["gap_mean"] != 0.0 and rec["pcsd"] != 0.0


def test_the_new_keys_are_warned_about_where_unread():
    from pcsd.train.config import load_config
    from pcsd.train.methods import unused_keys

    opsd = unused_keys(load_config(["method=agentopsd"]))  # an advantage rule, the context env
    assert (
        "algo.teacher_context_tokens" in opsd and "algo.lambda_distill" in opsd and "algo.teacher_context" not in opsd
    )
    sdpo = unused_keys(load_config(["method=sdpo"]))
    assert "algo.group_stats" in sdpo and "algo.teacher_context_tokens" not in sdpo  # no policy term
