"""No non-finite value reaches the weights or a checkpoint (issue 42, item 3): the settings that
overflow float32 are refused when the config is read (one line naming the key), and an update whose
loss or gradient norm is not finite is never applied: skipped with one line, counted in the metrics,
the run stopped after ``optim.max_nonfinite_updates`` in a row; a parameter an applied update made
non-finite stops the run, and no checkpoint of non-finite weights is written."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from conftest import tiny_run

from pcsd.train.config import ConfigError, load_config


# ----------------------------------------------------------------------------- config read
@pytest.mark.parametrize(
    "overrides, key",
    [
        # the reproductions: -inf rewards, NaN losses and weights (1e300); an inf gradient norm (1e30)
        (["algo.estimator=gigpo", "rollout.invalid_action_penalty=1e300"], "rollout.invalid_action_penalty=1e+300"),
        (["algo.estimator=gigpo", "algo.gigpo.step_weight=1e300"], "algo.gigpo.step_weight=1e+300"),
        (["algo.estimator=gigpo", "algo.gigpo.step_weight=1e30"], "algo.gigpo.step_weight=1e+30"),
        (["algo.success_reward=-1e300"], "algo.success_reward=-1e+300"),
        (["algo.lambda_distill=1e20"], "algo.lambda_distill=1e+20"),
        (["algo.kl_beta=1e20"], "algo.kl_beta=1e+20"),
    ],
)
def test_a_reward_or_weight_that_overflows_float32_is_refused(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    msg = str(e.value)
    assert msg.startswith(f"{key} is too large") and "at most 1e+06" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rollout.temperature=1e-40"], "rollout.temperature=1e-40 is too small"),
        (["eval.temperature=1e-40"], "eval.temperature=1e-40 is too small"),
        (["optim.max_nonfinite_updates=0"], "optim.max_nonfinite_updates must be >= 1"),
    ],
)
def test_other_float32_bounds_are_one_line(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_settings_at_the_bounds_are_accepted():
    cfg = load_config(
        [
            "algo.estimator=gigpo",
            "rollout.invalid_action_penalty=1e6",
            "algo.gigpo.step_weight=1e6",
            "algo.success_reward=-1e6",
            "rollout.temperature=1e-5",
            "eval.greedy=true",
            "eval.temperature=1e-40",  # greedy: not read
            "optim.max_nonfinite_updates=1",
        ]
    )
    assert cfg.algo.gigpo.step_weight == 1e6


# ----------------------------------------------------------------------------- the update
_SMALL = [
    "rollout.backend=hf",
    "optim.tokens_per_microbatch=96",
    "rollout.max_prompt_tokens=64",
    "rollout.max_response_tokens=32",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from pcsd.models import load_model
    from pcsd.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)
    student = load_model(path, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(student).eval().requires_grad_(False)
    return path, student, frozen


def _poison(model, what: float = float("nan")):
    """A gradient hook on one weight: its gradient becomes ``what`` (the forced non-finite update)."""
    p = next(p for n, p in model.named_parameters() if "mlp" in n)
    return p.register_hook(lambda g: torch.full_like(g, what))


@pytest.mark.parametrize("epochs, fused", [(1, True), (2, False)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_gradient_is_not_applied(models, epochs, fused, bad):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    _, base, frozen = models
    student = copy.deepcopy(base)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    cfg = load_config(_SMALL + [f"optim.ppo_epochs={epochs}", f"optim.fused_lm_head={str(fused).lower()}"])
    hook = _poison(student, bad)
    try:
        stats = update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=2, seed=1), cfg, step=0)
    finally:
        hook.remove()
    assert stats["nonfinite_updates"] == epochs  # the first pass already: it and the rest are not applied
    assert not math.isfinite(stats["grad_norm"])
    for n, p in student.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    assert opt.state == {} and all(p.grad is None for p in student.parameters())  # no step, no gradient kept
    # the same model and optimizer then train normally
    stats = update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=2, seed=1), cfg, step=1)
    assert stats["nonfinite_updates"] == 0 and math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])
    assert any(not torch.equal(p.detach(), before[n]) for n, p in student.named_parameters())


def test_a_later_pass_that_is_not_finite_keeps_the_passes_before(models):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    _, base, frozen = models
    student = copy.deepcopy(base)
    opt = torch.optim.SGD(student.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in student.parameters()]
    steps: list[int] = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    p0 = next(p for n, p in student.named_parameters() if "mlp" in n)
    p0.register_hook(lambda g: torch.full_like(g, float("nan")) if steps else g)  # from the second pass on
    cfg = load_config(_SMALL + ["optim.ppo_epochs=3", "optim.fused_lm_head=false"])
    stats = update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=2, seed=1), cfg, step=0)
    assert stats["nonfinite_updates"] == 2 and len(steps) == 1  # passes 2 and 3 are not applied
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, student.parameters()))  # pass 1 stands
    assert all(torch.isfinite(p).all() for p in student.parameters())


def test_an_update_that_makes_a_parameter_non_finite_stops(models):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import NonFiniteUpdate, update_step

    _, base, frozen = models
    student = copy.deepcopy(base)

    class Overflows(torch.optim.SGD):  # an applied step that overflows one weight (e.g. a huge learning rate)
        def step(self, closure=None):
            super().step(closure)
            with torch.no_grad():
                self.param_groups[0]["params"][-1].view(-1)[0] = float("inf")

    opt = Overflows(student.parameters(), lr=1e-3)
    with pytest.raises(NonFiniteUpdate, match=r"^an update with a finite loss and gradient norm .* non-finite"):
        update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=2, seed=1), load_config(_SMALL), step=0)


# ----------------------------------------------------------------------------- the run
def test_a_run_skips_counts_and_stops_after_non_finite_updates(models, tmp_path, monkeypatch, capsys):
    """Every update of a short run is forced non-finite: each step says so in one line and counts it
    (metrics.jsonl, TensorBoard), the checkpoint holds the untouched finite weights, and the run
    stops after optim.max_nonfinite_updates=2 in a row with one line (exit status 2)."""
    from safetensors.torch import load_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import pcsd.train.update as upd
    from pcsd.train.cli import main

    path = models[0]
    real = upd.micro_batch_loss

    def nan_loss(*a, **k):
        loss, parts = real(*a, **k)
        return loss * float("nan"), parts

    monkeypatch.setattr(upd, "micro_batch_loss", nan_loss)
    run = tmp_path / "run"
    code = main(
        [
            f"model.path={path}",
            f"run.dir={run}",
            "method=grpo",
            *tiny_run("eval.before=false", "optim.steps=4", "optim.max_nonfinite_updates=2"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("pcsd.train")] == [
        "pcsd.train: stopped at step 2: 2 updates in a row had a loss or gradient norm that is not finite "
        "(optim.max_nonfinite_updates=2); none was applied, the checkpoints hold finite weights (lower optim.lr "
        "or the reward scales)"
    ]
    said = [ln for ln in out.splitlines() if "not applied" in ln]
    assert len(said) == 2 and said[1].startswith("[pcsd] warning: step 2: the update was not applied: loss nan")
    assert "(2 in a row; the run stops at optim.max_nonfinite_updates=2)" in said[1]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["nonfinite_updates"], r["loss"]) for r in recs] == [(1, 1, None), (2, 1, None)]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("optim/nonfinite_updates")] == [1.0, 1.0]
    base = load_file(str(path / "model.safetensors"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001"]  # the stop writes none
    saved = load_file(str(run / "checkpoints" / "step-00000001" / "model" / "model.safetensors"))
    for k, v in saved.items():  # the weights the run started from, finite
        assert torch.isfinite(v).all() and torch.equal(v, base[k].to(v.dtype)), k


def test_a_checkpoint_of_non_finite_weights_is_refused(models):
    from types import SimpleNamespace

    from pcsd.train.distributed import single_process
    from pcsd.train.job import save
    from pcsd.train.update import NonFiniteUpdate

    student = copy.deepcopy(models[1])
    with torch.no_grad():
        next(iter(student.parameters()))[0, 0] = float("inf")
    job = SimpleNamespace(ctx=single_process(), peft=None, student=student)
    with pytest.raises(NonFiniteUpdate, match="the checkpoint after step 3 is not written: the model has non-finite"):
        save(job, 3)
