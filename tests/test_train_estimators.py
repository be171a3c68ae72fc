"""Every new key of issue 27 trains end to end on the tiny CPU preset, with method=pcsd and
method=sdar: the estimators (gigpo with its parameters, rloo), the policy loss gspo, the upper clip
and dynamic sampling. Short runs (two RL steps, tiny sizes); the rollouts are the real ones, with one
winning trajectory added per batch so that dynamic sampling has groups with a signal to keep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

_TINY = [
    "rollout.backend=hf",
    "optim.sft_steps=0",
    "env.max_steps=2",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_response_tokens=4",
    "eval.episodes=1",
    "eval.before=false",
    "optim.steps=2",
    "run.save_every=0",
    "run.tensorboard=false",
    "optim.lr=1e-2",
]

#: every new key at a value other than its default, in one run
_ALL_NEW = [
    "algo.estimator=gigpo",
    "algo.gigpo.step_weight=0.5",
    "algo.gigpo.norm=mean",
    "algo.gigpo.gamma=0.9",
    "algo.policy_loss=gspo",
    "algo.clip_eps_high=0.28",
    "rollout.dynamic_sampling=true",
    "rollout.max_sample_batches=3",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)


@pytest.fixture
def one_winner_per_batch(monkeypatch):
    """The training rollouts as they are, except that the first trajectory of each batch wins one
    more unit of reward (on its last step): its group has a signal, the batch's others as played
    (the untrained tiny model's groups have none). Returns the list of rollout seeds played."""
    import pcsd.train.job as job

    real = job.collect_rollouts
    seeds: list[int] = []

    def play(*args, **kw):
        rb = real(*args, **kw)
        seeds.append(kw["seed"])
        rb.reward = rb.reward.clone()
        rb.reward[0] += 1.0
        last = max(i for i, t in enumerate(rb.traj_id.tolist()) if t == 0)
        rb.step_reward = rb.step_reward.clone()
        rb.step_reward[last] += 1.0
        return rb

    monkeypatch.setattr(job, "collect_rollouts", play)
    return seeds


def _train(tmp_path: Path, tiny_dir: Path, *extra: str) -> list[dict]:
    from pcsd.train.cli import main

    run = tmp_path / "run"
    assert main(_TINY + [f"model.path={tiny_dir}", f"run.dir={run}", *extra]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 2
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("method", ["pcsd", "sdar"])
def test_every_new_key_trains(tmp_path, tiny_dir, one_winner_per_batch, method):
    recs = _train(tmp_path, tiny_dir, f"method={method}", *_ALL_NEW)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        # one group with a signal per batch of two: two batches reach the target of 2 groups
        assert (r["sample_batches"], r["groups_kept"], r["groups_dropped"]) == (2, 2, 2), r
        assert not r.get("skipped") and math.isfinite(r["loss"]) and r["pg"] != 0.0 and r["pcsd"] != 0.0
        assert r["tokens"] > 0
    assert len(one_winner_per_batch) == 4  # 2 steps x 2 batches: never more


@pytest.mark.parametrize("method", ["pcsd", "sdar"])
def test_rloo_trains(tmp_path, tiny_dir, one_winner_per_batch, method):
    recs = _train(tmp_path, tiny_dir, f"method={method}", "algo.estimator=rloo")
    # (the policy term's value is ~0 at ratio 1: RLOO's advantages sum to 0 over a group)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["pg"]) and r["grad_norm"] > 0 for r in recs)
    assert "sample_batches" not in recs[0]  # no dynamic sampling: one batch, no sampling counts
