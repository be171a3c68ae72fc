"""Every hyperparameter with a valid range is checked when the config is read (one test per class
of bad input), PCSD's with the op's own messages; a model.path without config.json is one line."""

from __future__ import annotations

import pytest

from pcsd.train.config import ConfigError, load_config


@pytest.mark.parametrize("override,message", [
    ("algo.pcsd.alpha=2", "algo.pcsd: alpha must be in (0, 1], got 2.0"),
    ("algo.pcsd.n_max=0", "algo.pcsd: n_max must be an integer >= n_min (1), got 0"),
    ("algo.pcsd.n_min=0", "algo.pcsd: n_min must be an integer >= 1, got 0"),
    ("algo.pcsd.tau_low=0.6", "algo.pcsd: tau_low must be < tau_high"),
    ("algo.pcsd.gamma=-1", "algo.pcsd: gamma must be >= 0"),
    ("algo.pcsd.beta_gate=-5", "algo.pcsd: beta_gate must be >= 0"),
])
def test_pcsd_parameters_with_the_ops_messages(override, message):
    from pcsd.ops.weighting import get_rule

    with pytest.raises(ConfigError) as exc:
        load_config([override])
    assert message in str(exc.value)
    # the same message the op gives at its first call
    k, v = override.removeprefix("algo.pcsd.").split("=")
    import torch

    gap = torch.zeros(4)
    cu = torch.tensor([0, 4])
    with pytest.raises(ValueError) as op_exc:
        get_rule("pcsd")(gap, cu, None, **{k: type(get_rule("pcsd").defaults[k])(float(v))})
    assert message.removeprefix("algo.pcsd: ") in str(op_exc.value)


@pytest.mark.parametrize("override,message", [
    ("algo.clip_eps=1.5", "algo.clip_eps must be in (0, 1)"),
    ("algo.kl_beta=-0.1", "algo.kl_beta must be >= 0"),
    ("algo.lambda_distill=-1", "algo.lambda_distill must be >= 0"),
    ("rollout.group_size=1", "GRPO needs groups of >= 2"),
    ("optim.tokens_per_microbatch=1000", "smaller than one row"),
    ("rollout.temperature=0", "rollout.temperature must be > 0"),
    ("eval.temperature=0", "eval.temperature must be > 0"),
    ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1]"),
    ("optim.lr=nan", "optim.lr=nan must be a finite number"),
    ("optim.lr=0", "optim.lr must be > 0"),
    ("rollout.gpu_memory_utilization=1.2", "rollout.gpu_memory_utilization must be in (0, 1)"),
    ("rollout.sync_bucket_mb=0", "rollout.sync_bucket_mb must be > 0"),
    ("eval.every=-1", "eval.every must be >= 0"),
    ("eval.protocol=best", "eval.protocol='best' is not valid"),
])
def test_ranges_are_checked_when_the_config_is_read(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config([override])


def test_greedy_evaluation_needs_no_temperature():
    assert load_config(["eval.temperature=0", "eval.greedy=true"]).eval.greedy


def test_model_path_without_config_json_is_one_line(tmp_path, capsys):
    from pcsd.train.cli import main

    assert main([f"model.path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert f"model.path={tmp_path}: no config.json there" in err
    assert main([f"model.path={tmp_path}/nope"]) == 2
    assert "no such folder" in capsys.readouterr().err
