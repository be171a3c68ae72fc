"""Every hyperparameter with a valid range is checked when the config is read (one test per class
of bad input), PCSD's with the op's own messages; a model.path without config.json is one line."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_run

from pcsd.train.config import ConfigError, load_config


@pytest.mark.parametrize(
    "override,message",
    [
        ("algo.pcsd.alpha=2", "algo.pcsd: alpha must be in (0, 1], got 2.0"),
        ("algo.pcsd.n_max=0", "algo.pcsd: n_max must be an integer >= n_min (1), got 0"),
        ("algo.pcsd.n_min=0", "algo.pcsd: n_min must be an integer >= 1, got 0"),
        ("algo.pcsd.tau_low=0.6", "algo.pcsd: tau_low must be < tau_high"),
        ("algo.pcsd.gamma=-1", "algo.pcsd: gamma must be >= 0"),
        ("algo.pcsd.beta_gate=-5", "algo.pcsd: beta_gate must be >= 0"),
    ],
)
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


@pytest.mark.parametrize(
    "override,message",
    [
        ("algo.clip_eps=1.5", "algo.clip_eps must be in (0, 1)"),
        ("algo.clip_eps=0", "algo.clip_eps must be in (0, 1), got 0.0"),  # the open lower bound
        ("algo.clip_eps=1", "algo.clip_eps must be in (0, 1), got 1.0"),
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
        ("algo.estimator=gae", "algo.estimator='gae' is not valid; choose one of grpo, rloo, gigpo"),
        ("algo.policy_loss=cispo", "algo.policy_loss='cispo' is not valid; choose one of ppo, gspo"),
        ("algo.gigpo.norm=std", "algo.gigpo.norm='std' is not valid; choose one of mean_std, mean"),
        ("algo.gigpo.gamma=1.5", "algo.gigpo.gamma must be in [0, 1], got 1.5"),
        ("algo.gigpo.step_weight=-1", "algo.gigpo.step_weight must be >= 0"),
        ("algo.clip_eps_high=0", "algo.clip_eps_high must be > 0"),
        ("algo.clip_eps_high=inf", "algo.clip_eps_high=inf must be a finite number"),
        ("rollout.max_sample_batches=0", "rollout.max_sample_batches must be >= 1"),
    ],
)
def test_ranges_are_checked_when_the_config_is_read(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config([override])


def test_dynamic_sampling_needs_groups_that_can_differ():
    with pytest.raises(ConfigError, match="a group of rollout.group_size=1 always is"):
        load_config(["method=opsd", "rollout.group_size=1", "rollout.dynamic_sampling=true"])


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


# ----------------------------------------------------------------------------- issue 22, part 2
def _one_line(err: str, needle: str, only: bool = True) -> None:
    """stderr holds one error line (``only``: and nothing else; after a run started, the libraries'
    progress bars may be there too), naming what it must, and no traceback."""
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and (only or ln.startswith("pcsd.train:"))]
    assert len(lines) == 1 and needle in lines[0], err[-3000:]


@pytest.mark.parametrize(
    "override,message",
    [
        ("run.seed=-1", "run.seed must be in [0, 2147483647], got -1"),
        ("run.seed=4294967296", "run.seed must be in [0, 2147483647], got 4294967296"),
        ("env.num_threads=-1", "env.num_threads must be >= 0, got -1"),
        ("optim.sft_steps=-5", "optim.sft_steps must be >= 0, got -5"),
        ("model.tiny_hidden_size=0", "model.tiny_hidden_size must be >= 32"),
        ("model.tiny_hidden_size=100", "divisible by its head count"),
        ("model.tiny_layers=-1", "model.tiny_layers must be >= 1, got -1"),
        ("rollout.tasks_per_step=1000000", "4000000 envs per rank, more than the env pool holds (1048576)"),
    ],
)
def test_values_that_failed_late_are_caught_when_the_config_is_read(override, message, tmp_path, capsys):
    """Each was accepted, or failed after the warm-up with a traceback (run.seed=-1 naming the
    derived seed -100000): now one line, exit 2, before the run folder exists."""
    from pcsd.train.cli import main

    with pytest.raises(ConfigError) as exc:
        load_config([override])
    assert message in str(exc.value)
    assert main([override, f"run.dir={tmp_path / 'run'}"]) == 2
    _one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "run").exists()


def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    from pcsd.train.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["run.device=cuda", f"run.dir={tmp_path / 'run'}"]) == 2
    _one_line(capsys.readouterr().err, "run.device=cuda, but torch sees no CUDA GPU")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)


def test_a_damaged_model_folder_is_one_line_naming_the_file(tmp_path, tiny_model, capsys):
    """A corrupt config.json or truncated weights under model.path: refused when the config is
    read, naming the file; load_model (the run's own sft-model/, base-model/) says the same."""
    import shutil

    from pcsd.models import ModelLoadError, load_model
    from pcsd.train.cli import main

    bad_json = tmp_path / "bad-json"
    shutil.copytree(tiny_model, bad_json)
    (bad_json / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], ')
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model, truncated)
    weights = truncated / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    for folder, message in (
        (bad_json, f"{bad_json / 'config.json'}: not valid JSON"),
        (truncated, f"{weights}: truncated"),
    ):
        assert main([f"model.path={folder}", f"run.dir={tmp_path / 'run'}"]) == 2
        _one_line(capsys.readouterr().err, f"model.path: {message}")
        with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_model(folder, torch.device("cpu"))
    assert not (tmp_path / "run").exists()


def test_a_prompt_budget_no_prompt_fits_is_refused_at_config_read(tiny_model):
    from pcsd.text.prompts import PromptBuilder

    least = PromptBuilder("alfworld", tokenizer_dir=tiny_model, max_prompt_tokens=None).min_prompt_tokens()
    assert 50 < least < 1024
    with pytest.raises(
        ConfigError,
        match=rf"rollout.max_prompt_tokens={least - 1} cannot hold a single prompt: "
        rf"the alfworld template alone .* is {least} tokens",
    ):
        load_config([f"model.path={tiny_model}", f"rollout.max_prompt_tokens={least - 1}"])
    assert load_config([f"model.path={tiny_model}", f"rollout.max_prompt_tokens={least}"])


def test_a_corrupt_config_yaml_on_resume_is_one_line(tmp_path, capsys):
    from pcsd.train.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for text, message in (
        ("model: {path: [unclosed\n", "is not a readable config"),
        ("- a\n- b\n", "is not a config (a YAML mapping of keys)"),
        (b"\xff\xfe\x00garbage", "is not a readable config"),
    ):
        (run / "config.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
        assert main(["--resume", str(run)]) == 2
        _one_line(capsys.readouterr().err, f"run.resume={run}: {run / 'config.yaml'} {message}")


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_earlier_checkpoints(
    tmp_path, tiny_model, capsys, monkeypatch
):
    import errno

    from pcsd.train import checkpoint as ck
    from pcsd.train.cli import main

    real = torch.save

    def full_disk(obj, f, *a, **k):  # the second checkpoint's optimizer state does not fit
        if "step-00000002" in str(f) and str(f).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real(obj, f, *a, **k)

    monkeypatch.setattr(ck.torch, "save", full_disk)
    run = tmp_path / "run"
    args = tiny_run(f"model.path={tiny_model}", f"run.dir={run}")
    assert main(args) == 2
    err = capsys.readouterr().err
    _one_line(err, "No space left on device; the run's complete checkpoints are intact", only=False)
    assert "optimizer.pt" in err and f"--resume {run}" in err
    assert [s for s, _ in ck.list_checkpoints(run)] == [1] and ck.load_checkpoint(run).step == 1
    assert not list((run / "checkpoints").glob(".tmp-*"))


# ----------------------------------------------------------------------------- issue 42: sizes, clips
@pytest.mark.parametrize(
    "override,message",
    [
        (["rollout.max_sample_batches=1000000"], "rollout.max_sample_batches must be <= 100"),
        (["algo.clip_eps_high=0.1"], "algo.clip_eps_high=0.1 is below algo.clip_eps=0.2"),
        (
            ["model.lora_rank=1024"],
            "model.lora_rank=1024 is larger than the model's width (the tiny model: hidden_size=128)",
        ),
        (["model.lora_rank=100000000", "model.tiny_hidden_size=64"], "choose a rank <= 64"),
        (["rollout.max_privileged_tokens=0"], "rollout.max_privileged_tokens must be >= 1"),
    ],
)
def test_sizes_that_failed_late_or_never_are_refused_at_config_read(override, message, tmp_path, capsys):
    """A million sample batches sat silent, a LoRA rank of 10^8 allocated 51 GB after the warm-up
    wrote its folders, an upper clip below the lower one was taken: one line, nothing written."""
    from pcsd.train.cli import main

    with pytest.raises(ConfigError) as exc:
        load_config(override)
    assert message in str(exc.value)
    assert main([*override, f"run.dir={tmp_path / 'run'}"]) == 2
    _one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "run").exists()


def test_the_bounds_themselves_are_taken():
    cfg = load_config(
        [
            "rollout.dynamic_sampling=true",
            "rollout.max_sample_batches=100",
            "algo.clip_eps_high=0.2",
            "model.lora_rank=128",
        ]
    )
    assert cfg.rollout.max_sample_batches == 100 and cfg.model.lora_rank == 128
    assert load_config(["rollout.max_privileged_tokens=null"]).rollout.max_privileged_tokens is None


def test_lora_rank_against_a_model_folders_width(tmp_path):
    """A model folder readable at config read is checked then; one that is not (a model id not
    fetched yet) when the run reads its config.json, before the warm-up (lora_rank_problem)."""
    import json

    from pcsd.train.config import lora_rank_problem

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    assert lora_rank_problem(64, tmp_path) is None
    problem = lora_rank_problem(65, tmp_path)
    assert problem is not None and f"({tmp_path}: hidden_size=64)" in problem and "\n" not in problem
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 32}}))
    assert "hidden_size=32" in (lora_rank_problem(33, tmp_path) or "")
    (tmp_path / "config.json").write_text("{not json")
    assert lora_rank_problem(10**8, tmp_path) is None  # the model's load says what is wrong with it


def test_a_warm_up_without_a_won_expert_episode_is_refused_before_anything_is_written():
    from types import SimpleNamespace

    from pcsd.envs.experts import ExpertEpisode
    from pcsd.envs.registry import get
    from pcsd.train.config import warmup_problem

    cfg = load_config(["env.max_steps=4"])
    lost = [ExpertEpisode("buy a shirt", "webshop"), ExpertEpisode("buy a hat", "webshop")]
    problem = warmup_problem(get("webshop"), lost, [], cfg)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("env.max_steps=4: the WebShop expert won none of the warm-up's 2 episodes")
    assert warmup_problem(get("webshop"), lost, lost[:1], cfg) is None
    assert warmup_problem(get("webshop"), [], [], cfg) is None  # no expert at all: said elsewhere
    assert warmup_problem(get("webshop"), lost, [], SimpleNamespace(optim=SimpleNamespace(sft_steps=0))) is None


def test_webshop_steps_shorter_than_its_expert_are_refused_at_config_read(webshop_data, tmp_path, capsys):
    """env.max_steps=2 failed in the warm-up (``examples is empty``) after writing base-model/."""
    from pcsd.train.cli import main

    over = ["preset=tiny-cpu-webshop", f"env.webshop_data={webshop_data}", "env.max_steps=2"]
    message = "env.max_steps=2 is shorter than any episode of the WebShop expert"
    with pytest.raises(ConfigError, match=message):
        load_config(over)
    assert main([*over, f"run.dir={tmp_path / 'run'}"]) == 2
    _one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "run").exists()
    assert load_config([*over[:2], "env.max_steps=3"]).env.max_steps == 3
    assert load_config([*over, "optim.sft_steps=0"]).env.max_steps == 2  # no warm-up: no expert to fit


def test_webshop_steps_shorter_than_every_warm_up_play_are_refused_at_config_read(
    webshop_data, tmp_path, capsys, monkeypatch
):
    """env.max_steps=4 with optim.sft_games=6: the 6 warm-up goals each have 2 or 3 options, so the
    expert's plays take 5 or 6 steps and none fits. It passed the config check and was refused only
    after the expert played; now the expert's plays are known at config read (the minimum named)
    and nothing is written into the run folder (no base-model/, no config.yaml)."""
    import pcsd.envs.kinds.webshop as ws
    from pcsd.train.cli import main

    over = ["preset=tiny-cpu-webshop", f"env.webshop_data={webshop_data}", "optim.sft_games=6", "env.max_steps=4"]
    message = "env.max_steps=4 is shorter than any episode of the WebShop expert the warm-up imitates"
    with pytest.raises(ConfigError, match=message + r" .* 6 plays, optim.sft_games, takes 5 steps\)"):
        load_config(over)
    run = tmp_path / "run"
    run.mkdir()
    assert main([*over, f"run.dir={run}"]) == 2
    _one_line(capsys.readouterr().err, "raise env.max_steps to at least 5 (verl-agent's WebShop: 15)")
    assert list(run.iterdir()) == []
    assert load_config([*over[:3], "env.max_steps=5"]).env.max_steps == 5
    with pytest.raises(ConfigError, match=r"^optim.sft_games=6411: the warm-up plays distinct training goals, and "):
        load_config([*over[:2], "optim.sft_games=6411"])
    monkeypatch.setattr(ws, "expert_play_lengths", lambda *a: (None, None))
    with pytest.raises(ConfigError, match=r"^optim.sft_games=6: the WebShop expert wins none of the warm-up's 6 "):
        load_config(over)
