"""``python -m pcsd.train ... --plan``: the memory plan per GPU from the config and the model's
shape, without loading the model; a run whose plan does not fit stops before loading anything."""

from __future__ import annotations

import json

import pytest

from pcsd.train.config import load_config
from pcsd.train.plan import BUILTIN_SHAPES, GiB, PlanError, Shape, memory_plan, model_shape

PRESETS = ["alfworld-qwen2.5-3b", "alfworld-qwen3-1.7b"]


def test_builtin_shapes_have_the_published_parameter_counts():
    # Qwen2.5-3B: 3.09 B (2.77 B without embeddings); Qwen3-1.7B: 1.7 B (1.4 B without embeddings)
    q25 = Shape.from_config(BUILTIN_SHAPES["qwen2.5-3b"], "q")
    q3 = Shape.from_config(BUILTIN_SHAPES["qwen3-1.7b"], "q")
    assert q25.params() == pytest.approx(3.086e9, rel=2e-3)
    assert q25.params() - q25.vocab * q25.hidden == pytest.approx(2.77e9, rel=5e-3)
    assert q3.params() == pytest.approx(1.72e9, rel=1e-2)
    assert q3.params() - q3.vocab * q3.hidden == pytest.approx(1.4e9, rel=2e-2)


def test_shape_comes_from_the_model_dirs_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BUILTIN_SHAPES["qwen3-1.7b"]))
    a = memory_plan(load_config(["preset=alfworld-qwen3-1.7b"]), 1, 80 * GiB)
    cfg = load_config(["preset=alfworld-qwen3-1.7b", f"model.path={tmp_path}"])
    b = memory_plan(cfg, 1, 80 * GiB)
    assert model_shape(cfg).name == str(tmp_path) and a.peak == b.peak
    with pytest.raises(PlanError, match="no built-in model shape.*model.path"):
        model_shape(load_config(["preset=tiny-cpu"]))


@pytest.mark.parametrize("preset", PRESETS)
def test_fsdp_divides_weights_gradients_and_adam(preset):
    cfg = load_config([f"preset={preset}"])
    one, four = memory_plan(cfg, 1, 80 * GiB), memory_plan(cfg, 4, 80 * GiB)
    rows1, rows4 = {r[0]: r[1] for r in one.rows}, {r[0]: r[1] for r in four.rows}
    P = model_shape(cfg).params()
    assert rows1["master weights"] == 4 * P and rows1["gradients"] == 4 * P
    assert rows1["AdamW state (2 moments)"] == 8 * P and rows1["frozen teacher/reference"] == 2 * P
    for k in ("master weights", "gradients", "AdamW state (2 moments)", "frozen teacher/reference"):
        assert rows4[k] == rows1[k] // 4, k


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("gpus,mem", [(1, 80), (4, 80), (8, 40)])
def test_paper_presets_fit_the_documented_machines(preset, gpus, mem):
    plan = memory_plan(load_config([f"preset={preset}"]), gpus, mem * GiB)
    assert plan.fits, plan.render()
    assert "verdict: fits" in plan.render()


def test_a_plan_that_does_not_fit_names_the_setting():
    cfg = load_config(["preset=alfworld-qwen2.5-3b", "optim.gradient_checkpointing=false"])
    plan = memory_plan(cfg, 1, 80 * GiB)
    assert not plan.fits
    text = plan.render()
    assert "does NOT fit" in text and "optim.tokens_per_microbatch to <=" in text
    assert "optim.gradient_checkpointing=true" in text
    small = memory_plan(load_config(["preset=alfworld-qwen2.5-3b"]), 1, 40 * GiB)
    assert not small.fits and "more GPUs" in small.render()


def test_cli_plan_prints_and_loads_nothing(capsys, monkeypatch):
    from pcsd.train import cli

    monkeypatch.setattr("pcsd.models.load_model", lambda *a, **k: pytest.fail("--plan loaded a model"))
    assert cli.main(["preset=alfworld-qwen3-1.7b", "--plan", "--gpus", "8", "--gpu-memory-gb=40"]) == 0
    out = capsys.readouterr().out
    assert "8 GPU(s) of 40 GiB" in out and "verdict: fits" in out
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--gpu-memory-gb", "24"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", "--gpus", "0"]) == 2
    assert "--gpus must be > 0" in capsys.readouterr().err
    for args, message in ((["--gpu-memory-gb", "nan"], "--gpu-memory-gb must be a finite number, got 'nan'"),
                          (["--gpu-memory-gb=inf"], "--gpu-memory-gb must be a finite number, got 'inf'"),
                          (["--gpu-memory-gb", "1e9"], "--gpu-memory-gb must be at most 4096, got 1e+09"),
                          (["--gpus", str(10**12)], "--gpus must be at most 65536, got 1e+12"),
                          (["--gpus", "1.5"], "--gpus must be a whole number, got '1.5'")):
        assert cli.main(["preset=alfworld-qwen2.5-3b", "--plan", *args]) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"pcsd.train: {message}", err


def test_a_run_whose_plan_cannot_fit_stops_before_loading(capsys, monkeypatch):
    from pcsd.train import cli

    monkeypatch.setattr("pcsd.train.plan.device_memory_bytes", lambda: 16 * GiB)  # as if on a 16 GB GPU
    monkeypatch.setattr("pcsd.train.job.train", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.setattr("pcsd.train.distributed.init_distributed", lambda **k: pytest.fail("the run started"))
    assert cli.main(["preset=alfworld-qwen2.5-3b", "run.device=cuda"]) == 2
    err = capsys.readouterr().err
    assert "does NOT fit" in err and "does not fit this GPU" in err
