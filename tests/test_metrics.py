"""Per-step metrics (JSONL + TensorBoard + PNG plots) and the rich progress bars."""

from __future__ import annotations

import io
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.envs.alfworld import CATEGORIES
from pcsd.progress import ProgressReporter
from pcsd.rollout.loop import RolloutBatch, RolloutTimings
from pcsd.train.metrics import MetricsLogger, UpdateStats, category_success, read_jsonl, step_record, tag_for

TT = list(CATEGORIES)


def fake_batch(step: int) -> RolloutBatch:
    """4 trajectories (Pick x2, Heat, Pick2), one row each, with known outcomes."""
    won = torch.tensor([True, step % 2 == 0, step >= 2, False])
    resp = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    return RolloutBatch(
        prompt_ids=[[0]] * 4,
        teacher_prompt_ids=[[0]] * 4,
        response_ids=resp,
        behaviour_logprobs=[[0.0] * len(r) for r in resp],
        traj_id=torch.arange(4),
        group_id=torch.arange(4) // 2,
        turn=torch.zeros(4, dtype=torch.int64),
        action_valid=torch.tensor([True, True, False, True]),
        actions=["a"] * 4,
        reward=won.float() * 10,
        won=won,
        length=torch.tensor([1, 2, 3, 4]),
        traj_group=torch.arange(4) // 2,
        task_type=[TT[0], TT[0], TT[3], TT[5]],
        task=["t"] * 4,
        timings=RolloutTimings(generation=0.5, env=0.1, prompts=0.1, parsing=0.05, total=1.0),
    )


def fake_stats(step: int) -> UpdateStats:
    return UpdateStats(
        loss=0.1 * step,
        pg=0.05,
        kl=0.001 * step,
        pcsd=0.2,
        clip_frac=0.01,
        grad_norm=1.5,
        score_seconds=0.3,
        update_seconds=0.7,
        tokens=10,
        gap_mean=0.1 * step,
        weight_mean=0.4,
        gate_activation=0.25 * step,
        entropy_proxy=2.0,
        nonfinite_updates=0,
    )


def test_anchor_fields_and_their_tags():
    """GiGPO's record fields from a batch's anchor-group counts (rows, groups, rows in a group of two
    or more), tagged under gigpo/; a skipped step's zeros stay finite."""
    from pcsd.train.metrics import anchor_fields

    assert anchor_fields(7, 3, 6) == dict(anchor_groups=3.0, anchor_group_rows=7 / 3, anchor_shared=6 / 7)
    assert anchor_fields(0, 0, 0) == dict(anchor_groups=0.0, anchor_group_rows=0.0, anchor_shared=0.0)
    assert [tag_for(k) for k in anchor_fields(1, 1, 0)] == [
        "gigpo/anchor_groups",
        "gigpo/anchor_group_rows",
        "gigpo/anchor_shared",
    ]


def test_step_record_fields():
    rec = step_record(1, fake_batch(1), fake_stats(1), step_seconds=2.0, sync_seconds=0.25).line()
    assert rec["step"] == 1 and rec["success"] == 25.0 and rec["reward"] == 2.5
    assert rec["success/Pick"] == 50.0 and rec["success/Heat"] == 0.0 and rec["success/Pick2"] == 0.0
    assert "success/Look" not in rec  # only categories present in the batch
    assert rec["tokens_per_s"] == 5.0 and rec["gen_tokens_per_s"] == 20.0
    assert rec["valid_actions"] == 0.75 and rec["turns"] == 2.5
    assert rec["rollout_seconds"] == 1.0 and rec["sync_seconds"] == 0.25 and rec["step_seconds"] == 2.0
    assert rec["entropy"] == 2.0 and "entropy_proxy" not in rec
    assert rec["outside_model_share"] == pytest.approx(0.25)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TT), st.booleans()), min_size=1, max_size=40))
def test_category_success_matches_a_plain_count(outcomes):
    tts, won = [t for t, _ in outcomes], [w for _, w in outcomes]
    got = category_success(tts, won)
    for tt, name in CATEGORIES.items():
        n = sum(t == tt for t in tts)
        if n == 0:
            assert f"success/{name}" not in got
        else:
            assert got[f"success/{name}"] == pytest.approx(100.0 * sum(w for t, w in outcomes if t == tt) / n)
    # instance-weighted mean of the categories is the overall success
    total = sum(got[f"success/{CATEGORIES[t]}"] * sum(x == t for x in tts) for t in set(tts)) / len(tts)
    assert total == pytest.approx(100.0 * sum(won) / len(won))


def test_category_success_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        category_success([TT[0]], [True, False])


def test_three_steps_to_jsonl_tensorboard_and_pngs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recs = [step_record(s, fake_batch(s), fake_stats(s), step_seconds=2.0, sync_seconds=0.1).line() for s in (1, 2, 3)]
    with MetricsLogger(tmp_path) as m:
        m.log_eval("before", dict(overall=10.0, per_category={"Pick": 20.0, "Look": None}), step=0)
        for r in recs:
            m.log(r)
        m.log_eval("after", dict(overall=40.0, per_category={"Pick": 60.0, "Look": None}), step=3)
        pngs = m.plot()

    assert read_jsonl(tmp_path / "metrics.jsonl") == json.loads(json.dumps(recs))
    assert [e["name"] for e in read_jsonl(tmp_path / "evals.jsonl")] == ["before", "after"]

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {
        "train/reward",
        "train/success",
        "success/Pick",
        "success/Heat",
        "success/Pick2",
        "pcsd/gap_mean",
        "pcsd/gate_activation",
        "pcsd/weight_mean",
        "loss/kl",
        "loss/clip_frac",
        "entropy",
        "perf/tokens_per_s",
        "time/rollout",
        "time/scoring",
        "time/update",
        "time/weight_sync",
        "eval/overall",
        "eval/Pick",
    }
    assert want <= tags, want - tags
    assert "eval/Look" not in tags  # no games of that category: nothing logged
    gate = acc.Scalars("pcsd/gate_activation")
    assert [e.step for e in gate] == [1, 2, 3]
    assert [e.value for e in gate] == pytest.approx([0.25, 0.5, 0.75])
    assert [e.value for e in acc.Scalars("success/Pick")] == pytest.approx([50.0, 100.0, 50.0])
    assert [(e.step, e.value) for e in acc.Scalars("eval/overall")] == [(0, 10.0), (3, 40.0)]

    import matplotlib.image as mpimg

    assert sorted(p.name for p in pngs) == ["success.png", "training_dynamics.png"]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert float(img[..., :3].std()) > 0.01  # something was drawn


def test_logger_without_tensorboard_and_bad_record(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as m:
        m.log(dict(step=1, reward=1.0, note="text is kept in JSONL"))
        with pytest.raises(ValueError, match="'step'"):
            m.log(dict(reward=1.0))
    assert not (tmp_path / "tensorboard").exists()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [dict(step=1, reward=1.0, note="text is kept in JSONL")]


def test_tags():
    assert tag_for("reward") == "train/reward" and tag_for("kl") == "loss/kl"
    assert tag_for("score_seconds") == "time/scoring" and tag_for("success/Cool") == "success/Cool"
    assert tag_for("something_new") == "train/something_new"


def test_progress_quiet_when_not_a_terminal():
    from rich.console import Console

    buf = io.StringIO()
    with ProgressReporter(console=Console(file=buf, force_terminal=False)) as pr:
        assert not pr.enabled
        assert pr.rollout() is None and pr.phase("update", 3) is None
        pr.print("a line")
    assert buf.getvalue() == "a line\n"
    with ProgressReporter(enabled=False, console=Console(file=io.StringIO(), force_terminal=True)) as pr:
        assert pr.rollout() is None


def test_progress_bars_draw_on_a_terminal():
    from rich.console import Console

    buf = io.StringIO()
    with ProgressReporter(enabled=True, console=Console(file=buf, force_terminal=True, width=120)) as pr:
        cb = pr.rollout("rollout")
        cb(0, 8)
        cb(5, 8)
        up = pr.phase("update", 4)
        for i in range(1, 5):
            up(i, 4)
        again = pr.phase("update", 2)  # reused bar, reset
        again(1, 2)
    out = buf.getvalue()
    assert "rollout" in out and "5/8" in out and "turn 2" in out
    assert "update" in out and "1/2" in out


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_update_step_reports_scoring_and_micro_batches(ppo_epochs):
    """The trainer's update calls the progress callbacks: scoring passes, then each micro-batch.
    One PPO epoch takes log pi_old from the update's own forward (reference + teacher passes
    only); more epochs score the old policy first."""
    from omegaconf import OmegaConf

    from pcsd.tiny_model import make_tiny_model
    from pcsd.train.config import TrainConfig
    from pcsd.train.update import update_step

    cfg = OmegaConf.structured(TrainConfig)
    cfg.optim.tokens_per_microbatch = 8
    cfg.optim.ppo_epochs = ppo_epochs
    calls = []

    def progress(name, total):
        return lambda d, n: calls.append((name, d, n))

    import tempfile

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        path = make_tiny_model(d, seed=0)
        student = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        frozen = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rb = fake_batch(1)
    rb.prompt_ids = [[5, 6, 7]] * 4
    rb.teacher_prompt_ids = [[9, 5, 6, 7]] * 4
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
    update_step(student, frozen, opt, rb, cfg, 0, progress=progress)
    n = 2 + (ppo_epochs > 1)
    assert [c for c in calls if c[0] == "scoring"] == [("scoring", i, n) for i in range(1, n + 1)]
    ups = [c for c in calls if c[0] == "update"]
    n_up = 4 * ppo_epochs  # rows of 6, 5, 4, 7 tokens: one micro-batch each, per epoch
    assert [c[1] for c in ups] == list(range(1, n_up + 1)) and all(c[2] == n_up for c in ups)
