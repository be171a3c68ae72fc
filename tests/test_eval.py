"""``pcsd.eval``: fixed task lists, determinism, per-game seeds, the Table-1 layout, named subsets,
model resolution and bad arguments — on the generated tiny model with procedural games (and 2-3 real
ALFWorld games when ALFWORLD_DATA is set)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import pcsd.eval as ev
from pcsd.eval import cli as ev_cli
from pcsd.rollout.backends import make_backend
from pcsd.text.prompts import PromptBuilder
from pcsd.tiny_model import make_tiny_model

PAPER_HEADER = ["Method", "Pick", "Look", "Clean", "Heat", "Cool", "Pick2", "Overall"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=1024, tokenizer_dir=path)
    eos = builder.tokenizer.encode("<|im_end|>")[0]
    return path, make_backend("hf", model=model, pad_token_id=eos), builder, eos


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    # one game per category, in the paper's column order
    return ev.procedural_eval_games(tmp_path_factory.mktemp("games"), 6, distractors=0)


def play(tiny, games, **kw):
    _, backend, builder, eos = tiny
    opts = dict(max_steps=2, max_response_tokens=8, temperature=0.4, seed=7, stop_token_ids=[eos])
    opts.update(kw)
    return ev.play_games(backend, builder, games, **opts)


def test_two_runs_give_the_same_results_and_table(tiny, games):
    a, b = play(tiny, games), play(tiny, games)
    assert [g.actions for g in a] == [g.actions for g in b]
    assert [(g.won, g.steps, g.seed) for g in a] == [(g.won, g.steps, g.seed) for g in b]
    ta = ev.render_table([ev.EvalResult("m", "procedural", a, dict(temperature=0.4, seed=7))])
    tb = ev.render_table([ev.EvalResult("m", "procedural", b, dict(temperature=0.4, seed=7))])
    assert ta == tb
    # the comparison can fail: another seed samples other actions
    c = play(tiny, games, seed=8)
    assert [g.actions for g in c] != [g.actions for g in a]
    # results come back in the order of the list, one per game, with their categories
    assert [g.game for g in a] == games
    assert [g.category for g in a] == list(ev.CATEGORY_ORDER)
    assert all(1 <= g.steps <= 2 and len(g.actions) == g.steps for g in a)


def test_per_game_seeds_make_a_game_independent_of_its_batch(tiny, games):
    """With batch_size=1 each game has its own seed: a subset gives the same per-game results."""
    full = play(tiny, games[:4], batch_size=1)
    sub = play(tiny, [games[3], games[1]], batch_size=1)
    assert [g.actions for g in sub] == [full[3].actions, full[1].actions]
    assert sub[0].seed == full[3].seed != full[1].seed
    # batches of 2: seeds per batch (the seed of its first game)
    pairs = play(tiny, games[:4], batch_size=2)
    assert [g.seed for g in pairs] == [full[0].seed] * 2 + [full[2].seed] * 2


def test_greedy_ignores_the_seed(tiny, games):
    a = play(tiny, games[:2], temperature=0.0, seed=1)
    b = play(tiny, games[:2], temperature=0.0, seed=2)
    assert [g.actions for g in a] == [g.actions for g in b]


def result(label, split, outcomes):
    """An EvalResult from [(task_type, won), ...]."""
    return ev.EvalResult(
        label,
        split,
        [ev.GameResult(f"g{i}", tt, ev.CATEGORIES[tt], w, 5, 0) for i, (tt, w) in enumerate(outcomes)],
        dict(temperature=0.4, seed=3),
    )


def test_table_layout_matches_the_papers_table_1():
    pick, look, heat = "pick_and_place_simple", "look_at_obj_in_light", "pick_heat_then_place_in_recep"
    a = result("PCSD", "valid_seen", [(pick, True), (pick, True), (pick, False), (look, True)])
    b = result("GRPO", "valid_seen", [(pick, False), (heat, True)])
    c = result("PCSD", "valid_unseen", [(heat, False)])
    md = ev.render_table([a, b, c])
    lines = md.splitlines()
    assert [h.strip().strip("*") for h in lines[0].strip("|").split("|")] == PAPER_HEADER
    assert lines[1] == "|:---|---:|---:|---:|---:|---:|---:|---:|"
    rows = [[x.strip() for x in ln.strip("|").split("|")] for ln in lines[2:7]]
    assert rows[0][0] == "*valid_seen*" and rows[3][0] == "*valid_unseen*"
    # Pick 2/3, Look 1/1, no Clean/Heat/Cool/Pick2 games; Overall is instance-level (3/4), not the
    # mean of the categories (83.3)
    assert rows[1] == ["PCSD", "66.7", "100.0", "–", "–", "–", "–", "75.0"]
    assert rows[2] == ["GRPO", "0.0", "–", "–", "100.0", "–", "–", "50.0"]
    assert rows[4] == ["PCSD", "–", "–", "–", "0.0", "–", "–", "0.0"]
    assert "valid_seen: 4 games (Pick 3, Look 1, Clean 0, Heat 0, Cool 0, Pick2 0)" in md
    assert "temperature 0.4, seed 3" in md


def test_named_subsets(games, tmp_path):
    assert ev.select_games(games, count=2) == games[:2]
    assert ev.select_games(games, task_types=["Heat", "pick_cool_then_place_in_recep"]) == games[3:5]
    assert ev.select_games(games, task_types=["heat", "Pick2"], count=1) == [games[3]]
    assert [ev.game_task_type(g) for g in games] == list(ev.CATEGORIES)
    # a games file: comments, blank lines, paths relative to the file
    for g in games[:3]:
        shutil.copy(g, tmp_path / Path(g).name)
    (tmp_path / "list.txt").write_text(f"# three games\n{Path(games[2]).name}\n\n{Path(games[0]).name}  # first\n")
    assert ev.read_games_file(tmp_path / "list.txt") == [str(tmp_path / Path(games[i]).name) for i in (2, 0)]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda g: ev.select_games(g, task_types=["Sweep"]), "task type 'Sweep' is unknown"),
        (lambda g: ev.select_games(g, count=-1), "count=-1"),
        (lambda g: ev.select_games(g[:2], task_types=["Heat"]), "no games left"),
        (lambda g: ev.split_games("valid_foo"), "split='valid_foo' is unknown"),
        (lambda g: ev.read_games_file("/nonexistent/list.txt"), "no such file"),
        (lambda g: ev.resolve_model("/nonexistent/model"), "no such file or directory"),
        (lambda g: ev.procedural_eval_games("/tmp", 0), "count=0"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(games, call, match):
    with pytest.raises(ev.EvalError, match=match):
        call(games)


def test_bad_play_arguments(tiny, games):
    with pytest.raises(ev.EvalError, match="batch_size"):
        play(tiny, games, batch_size=-1)
    with pytest.raises(ev.EvalError, match="temperature"):
        play(tiny, games, temperature=-0.1)
    with pytest.raises(ev.EvalError, match="games is empty"):
        play(tiny, [])


def test_missing_alfworld_data_is_an_error(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ev.EvalError, match="ALFWORLD_DATA"):
        ev.split_games("valid_seen")


def fake_checkpoint(d: Path, tokenizer: bool = False) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": torch.zeros(4)}, str(d / "model.safetensors"))
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


def test_resolve_model_from_a_checkpoint_or_a_run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("rule: sdar\nmodel: {path: null}\noptim: {steps: 3}\n")
    base = fake_checkpoint(run / "base-model", tokenizer=True)
    fake_checkpoint(run / "checkpoints" / "step-5")
    newest = fake_checkpoint(run / "checkpoints" / "step-10")
    fake_checkpoint(run / "checkpoints" / "step-9")
    assert ev.resolve_model(run) == (newest, base, run)  # no final-model: the newest checkpoint
    nested = fake_checkpoint(run / "checkpoints" / "step-12" / "model")  # weights one level down
    assert ev.resolve_model(run) == (nested, base, run)
    final = fake_checkpoint(run / "final-model")
    assert ev.resolve_model(run) == (final, base, run)
    assert ev.resolve_model(final) == (final, base, run)  # a checkpoint inside a run finds its tokenizer
    assert ev_cli._run_label(run, final, skills=True) == "SDAR*"
    alone = fake_checkpoint(tmp_path / "hf", tokenizer=True)
    assert ev.resolve_model(alone) == (alone, alone, None)
    with pytest.raises(ev.EvalError, match="no tokenizer.json"):
        ev.resolve_model(fake_checkpoint(tmp_path / "notok"))
    with pytest.raises(ev.EvalError, match="neither a HF checkpoint"):
        ev.resolve_model(tmp_path)
    warm = tmp_path / "warm"  # a run stopped after its warm-up: no RL model yet, the message names sft-model
    warm.mkdir()
    (warm / "config.yaml").write_text("rule: pcsd\nmodel: {path: null}\n")
    fake_checkpoint(warm / "sft-model", tokenizer=True)
    with pytest.raises(
        ev.EvalError,
        match=f"without final-model/ or any checkpoint \\(its warm-up's model: --model {warm / 'sft-model'}\\)$",
    ):
        ev.resolve_model(warm)
    weights = final / "model.safetensors"  # damaged: one line naming the file, before anything loads
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(ev.EvalError, match=f"{weights}: truncated"):
        ev.resolve_model(run)
    (final / "model.safetensors").unlink()
    with pytest.raises(ev.EvalError, match="no weights"):
        ev.resolve_model(final)


def cli(tiny, tmp_path, *extra):
    path = tiny[0]
    return ev.main(
        [
            "--model",
            str(path),
            "--label",
            "Tiny",
            "--backend",
            "hf",
            "--device",
            "cpu",
            "--max-steps",
            "2",
            "--max-response-tokens",
            "12",
            "--max-prompt-tokens",
            "1024",
            "--quiet",
            "--out",
            str(tmp_path),
            *extra,
        ]
    )


def test_cli_writes_table_and_per_game_json_and_repeats(tiny, tmp_path, capsys):
    args = [
        "--split",
        "procedural",
        "--procedural-games",
        "12",
        "--distractors",
        "0",
        "--games-dir",
        str(tmp_path / "games"),
        "--task-types",
        "Pick,Heat",
    ]
    assert cli(tiny, tmp_path / "a", *args) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "a" / "table.md").read_text()
    assert table in out and "| Tiny |" in table and "*procedural*" in table
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    (res,) = doc["results"]
    assert res["label"] == "Tiny" and res["split"] == "procedural" and res["episodes"] == 4
    assert [g["category"] for g in res["games"]] == ["Pick", "Heat", "Pick", "Heat"]
    assert set(res["games"][0]) >= {"game", "task_type", "category", "won", "steps", "seed", "actions"}
    assert res["counts"]["Pick"] == 2 and res["per_category"]["Look"] is None
    assert cli(tiny, tmp_path / "b", *args) == 0
    assert (tmp_path / "b" / "table.md").read_text() == table
    assert json.loads((tmp_path / "b" / "results.json").read_text())["results"][0]["games"] == res["games"]


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--split", "valid_foo"], "split='valid_foo' is unknown"),
        (["--split", "procedural", "--task-types", "Sweep"], "task type 'Sweep' is unknown"),
        (["--split", "procedural", "--games-file", "/nonexistent.txt"], "no such file"),
        (["--split", "procedural", "--count", "-2"], "count=-2"),
        (["--split", "procedural", "--max-steps", "0"], "max_steps=0"),
        (["--split", "procedural", "--label", "extra"], "one --label per --model"),
    ],
)
def test_cli_bad_arguments_exit_2_with_a_message(tiny, tmp_path, capsys, extra, match):
    assert cli(tiny, tmp_path, *extra) == 2
    assert match in capsys.readouterr().err


def test_cli_missing_model_path(tmp_path, capsys):
    assert ev.main(["--model", str(tmp_path / "nope"), "--split", "procedural", "--quiet"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_trainer_uses_the_same_evaluation():
    from pcsd.train import job

    assert job.evaluate is ev.evaluate


def test_real_alfworld_splits_and_games(tiny, alfworld_data):
    seen, unseen = ev.split_games("valid_seen"), ev.split_games("valid_unseen")
    assert (len(seen), len(unseen)) == (140, 134)
    assert seen == sorted(seen)
    cats = {ev.CATEGORIES[ev.game_task_type(g)] for g in seen}
    assert cats == set(ev.CATEGORY_ORDER)
    picked = ev.select_games(seen, task_types=["Heat", "Look"], count=3)
    assert [ev.game_task_type(g) for g in picked] == [
        ev.game_task_type(g)
        for g in seen
        if ev.game_task_type(g) in ("pick_heat_then_place_in_recep", "look_at_obj_in_light")
    ][:3]
    res = play(tiny, picked, max_steps=2)
    again = play(tiny, picked, max_steps=2)
    assert [g.actions for g in res] == [g.actions for g in again]
    assert [g.task_type for g in res] == [ev.game_task_type(g) for g in picked]
    assert all(g.steps <= 2 for g in res)
    assert ev.game_name(picked[0]).count("/") == 1


def test_vllm_evaluation_repeats_on_many_games(tiny, vllm_available, tmp_path):
    """vLLM (CPU build) on 12 games at once: the prompts exceed one scheduler step, so without whole
    prefills a seeded request would be chunked and vLLM's generator rewind would fail on CPU."""
    path, _, builder, eos = tiny
    games = ev.procedural_eval_games(tmp_path, 12, distractors=0)
    vb = make_backend("vllm", model_path=path, dtype="float32", max_model_len=1024 + 8, seed=0)
    try:
        opts = dict(max_steps=2, max_response_tokens=8, temperature=0.4, seed=7, stop_token_ids=[eos])
        a = ev.play_games(vb, builder, games, **opts)
        b = ev.play_games(vb, builder, games, **opts)
    finally:
        vb.close()
    assert [g.actions for g in a] == [g.actions for g in b]
    assert len(a) == 12 and all(1 <= g.steps <= 2 for g in a)


def test_procedural_list_of_a_tiny_run_is_the_trainers_eval_list(tmp_path):
    """``--split procedural`` on a run rebuilds the trainer's own evaluation games (the run's
    env.receptacles / env.distractors knobs, eval.episodes games)."""
    from pcsd.envs.procedural import write_games as procedural_games

    args = ev_cli._parser().parse_args(["--model", "x", "--split", "procedural"])
    run_cfg = {"preset": "tiny-cpu", "eval": {"episodes": 7}, "env": {"receptacles": 11, "distractors": 0}}
    mine = ev_cli._resolve_games("procedural", args, tmp_path / "eval", run_cfg)
    theirs = procedural_games(tmp_path / "train-run", 7, seed=900_000, receptacles=11, distractors=0)
    assert [Path(g).read_bytes() for g in mine] == [Path(g).read_bytes() for g in theirs]
    other = procedural_games(tmp_path / "other-knobs", 7, seed=900_000, distractors=2)
    assert [Path(g).read_bytes() for g in mine] != [Path(g).read_bytes() for g in other]
    assert len(ev_cli._resolve_games("procedural", args, tmp_path / "other", {})) == 48
