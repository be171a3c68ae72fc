"""WebShop wired through prompts, rollouts, training and evaluation (issue #14, "Wired through").

The prompt tests replay every step the verl-agent / SDAR wrapper recorded in
``$WEBSHOP_DATA/traces_public.jsonl.gz`` (``oracle/record_traces.py``): the task, the agent's
observation text, the admissible actions, the full student prompt and the action projection must be
byte-identical to verl's.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

import pytest

from pcsd.text import prompts as P


@lru_cache(maxsize=None)
def _verl_episodes(root: str) -> tuple[dict, ...]:
    with gzip.open(Path(root) / "traces_public.jsonl.gz", "rt") as f:
        return tuple(ep for ep in map(json.loads, f) if ep.get("env_config") == "verl")


def _avail(a: dict) -> list[str]:
    return P.webshop_actions(a["has_search_bar"], a["clickables"])


def test_prompts_equal_every_recorded_verl_prompt(webshop_data: Path) -> None:
    eps = _verl_episodes(str(webshop_data))
    assert len(eps) >= 100
    pb = P.PromptBuilder("webshop", history_length=2, max_prompt_tokens=None)
    n_prompts = n_fallback = 0
    for ep in eps:
        r = ep["reset"]
        task = P.webshop_task(r["obs"])
        assert task == r["task"]
        agent_obs = P.format_webshop_observation(r["obs"], task)
        assert agent_obs == r["agent_obs"]
        assert pb.build(task, agent_obs, _avail(r["available_actions"])) == r["prompt"]
        n_prompts += 1
        history: list[tuple[str, str]] = []
        for st in ep["steps"]:
            if "exception" in st:
                break
            history.append((agent_obs, st["env_action"]))
            agent_obs = P.format_webshop_observation(st["obs"], task)
            where = f"episode {ep['episode_id']} ({ep['config']}) step {st['i']}"
            assert agent_obs == st["agent_obs"], where
            text, variant, _ = pb.build_detailed(
                task, agent_obs, _avail(st["available_actions"]), history, len(history)
            )
            assert text == st["prompt"], where
            n_prompts += 1
            n_fallback += variant == "no_history"
    assert n_prompts > 1000
    assert n_fallback > 0, "the recorded steps include prompts over 13000 characters"


def test_projection_equals_every_recorded_verl_projection(webshop_data: Path) -> None:
    n = invalid = 0
    for ep in _verl_episodes(str(webshop_data)):
        for st in ep["steps"]:
            p = P.project_webshop_action(st["response"])
            assert (p.action, int(p.is_valid)) == (st["env_action"], st["action_valid"]), st["response"]
            n += 1
            invalid += not p.is_valid
    assert n > 1000 and invalid > 0


@pytest.mark.parametrize(
    "response, action, valid",
    [
        ("<think>x</think><action>Click[B0ABC]</action>", "click[b0abc]", True),
        ("<think>x</think><action> search[red shoes] </action> trailing", "search[red shoes]", True),
        ("<think>x</think> no tags here, just words at the end", "words at the end"[-20:], False),
        ("<action>click[buy now]</action>", "click[buy now]", False),  # no <think>
        ("<THINK>x</THINK><action>click[buy now]</action>", "click[buy now]", False),  # tags are case-sensitive
        ("<think>买</think><action>click[buy now]</action>", "click[buy now]", False),  # CJK
        ("<think>x</think><action>a</action><action>b</action>", "a", True),  # first block
    ],
)
def test_projection_rules(response: str, action: str, valid: bool) -> None:
    p = P.project_webshop_action(response)
    assert p.action == (response.lower()[-20:] if p.missing_action_tags else action)
    assert p.is_valid is valid


def test_observation_and_action_formatting() -> None:
    task = "i want red shoes"
    obs = f"Instruction: [SEP] {task} [SEP] Back to Search [SEP] Page 1 (Total results: 1) [SEP] Next >"
    assert (
        P.format_webshop_observation(obs, task) == "'Back to Search' [SEP] 'Page 1 (Total results: 1)' [SEP] 'Next >'"
    )
    done = "Thank you for shopping with us! [SEP] Your code: [SEP] None"
    assert P.format_webshop_observation(done, task) == done
    assert P.webshop_actions(True, ["search"]) == ["search[<your query>]", "click[search]"]
    assert P.webshop_actions(False, ["back to search", "b0"]) == ["click[back to search]", "click[b0]"]
    assert P.webshop_task(f"WebShop [SEP] Instruction: [SEP] {task} [SEP] Search") == task


def test_bad_webshop_text_arguments() -> None:
    with pytest.raises(ValueError, match="reset_observation"):
        P.webshop_task("Back to Search [SEP] x")
    with pytest.raises(ValueError, match="clickables"):
        P.webshop_actions(True, "search")
    with pytest.raises(ValueError, match="text"):
        P.project_webshop_action(None)  # type: ignore[arg-type]


def test_teacher_prompt_has_the_category_skills() -> None:
    pb = P.PromptBuilder("webshop", history_length=2, max_prompt_tokens=None)
    task = "i need gluten free snacks, and price lower than 20.00 dollars"
    student = pb.build(task, "'Search'", ["search[<your query>]", "click[search]"])
    teacher = pb.build_teacher(task, "'Search'", ["search[<your query>]", "click[search]"])
    assert teacher.endswith(student)
    skills = P.retrieve_skills(task, env="webshop")
    assert skills.count("## ") == 2, "general rules plus the food category's"
    assert skills in teacher[: -len(student)]


# ----------------------------------------------------------------------------- goals
def test_validation_draw_is_verl_agents(webshop_data: Path) -> None:
    """verl-agent's first validation batch: worker i plays RandomState(1000).choice(range(500), 128)[i]
    (recorded in the traces as `verl_valbatch`); worker 0 (seed 1000) is our validation shop's env 0."""
    from pcsd.envs.kinds.webshop import webshop_validation_goals
    from pcsd.envs.webshop import WebShop

    draw = webshop_validation_goals("paper", 0, seed=0, validation_index=0)
    assert len(draw) == 128 == len(set(draw)) and all(0 <= g < 500 for g in draw)
    batch = [ep for ep in _verl_episodes(str(webshop_data)) if ep["config"] == "verl_valbatch"]
    assert batch
    for ep in batch:
        worker = ep["env_seed"] - 1000
        assert draw[worker] == ep["goal_index"]
    shop = WebShop.load(webshop_data, seed=1000, variant="verl")
    ep0 = next(ep for ep in batch if ep["env_seed"] == 1000)
    assert shop.goal(draw[0])["instruction_text"] == ep0["goal"]["instruction_text"]
    assert webshop_validation_goals("full", 0, 0, 3) == draw  # fixed goals
    assert webshop_validation_goals("paper", 0, 0, 1) != draw  # verl-agent's next validation


def test_train_draws(webshop_data: Path) -> None:
    from pcsd.envs.kinds.webshop import train_goals
    from pcsd.envs.webshop import WebShop
    from pcsd.train.config import load_config

    cfg = load_config(["preset=webshop-qwen2.5-3b", f"env.webshop_data={webshop_data}"])
    shop = WebShop.load(webshop_data, seed=0, variant="verl")
    a, b = train_goals(cfg, shop, 0), train_goals(cfg, shop, 1)
    assert len(a) == 16 == len(set(a)) and all(500 <= g < shop.num_goals for g in a + b)
    assert a != b and train_goals(cfg, shop, 1) == b  # a fresh draw per step, reproducible (resume)


def test_bad_draw_arguments() -> None:
    from pcsd.envs.kinds.webshop import webshop_validation_goals
    from pcsd.envs.webshop import draw_goals
    from pcsd.eval.games import EvalError

    with pytest.raises(ValueError, match="count"):
        draw_goals(range(10), 11, 0)
    with pytest.raises(EvalError, match="protocol"):
        webshop_validation_goals("all")


# ----------------------------------------------------------------------------- config and presets
PRESETS = ["webshop-qwen2.5-3b", "webshop-qwen3-1.7b"]


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_validate_and_plan(webshop_data: Path, preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pcsd.train import cli
    from pcsd.train.config import load_config

    monkeypatch.setenv("WEBSHOP_DATA", str(webshop_data))
    cfg = load_config([f"preset={preset}"])
    assert (cfg.env.name, cfg.env.max_steps, cfg.env.history_length) == ("webshop", 15, 2)
    assert (cfg.rollout.tasks_per_step, cfg.rollout.group_size) == (16, 8)
    assert (cfg.rollout.max_prompt_tokens, cfg.rollout.max_response_tokens) == (4096, 512)
    assert (cfg.eval.temperature, cfg.algo.success_reward) == (0.4, 10.0)
    alf = load_config([f"preset={preset.replace('webshop', 'alfworld')}"])
    for key in ("param_dtype", "compute_dtype", "teacher_dtype", "export_dtype", "enable_thinking"):
        assert cfg.model[key] == alf.model[key]
    assert cli.main([f"preset={preset}", "--plan"]) == 0


@pytest.mark.parametrize(
    "override, named",
    [
        ("env.name=webshopp", "env.name"),
        ("env.webshop_variant=verll", "env.webshop_variant"),
        ("env.webshop_data=/nonexistent/webshop", "env.webshop_data"),
        ("env.rooms=[kitchen]", "env.rooms"),
        ("eval.episodes=501", "eval.episodes"),
        ("env.usual_place=0.5", "env.usual_place"),
        ("optim.sft_teacher_demos=skills", "optim.sft_teacher_demos"),
    ],
)
def test_bad_webshop_config(webshop_data: Path, override: str, named: str, monkeypatch) -> None:
    from pcsd.train.config import ConfigError, load_config

    monkeypatch.setenv("WEBSHOP_DATA", str(webshop_data))
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(["preset=tiny-cpu-webshop", override])


def test_missing_webshop_data_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pcsd.train.config import ConfigError, load_config

    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(ConfigError, match=r"env\.webshop_data.*WEBSHOP_DATA"):
        load_config(["preset=tiny-cpu-webshop"])
    with pytest.raises(ConfigError, match=r"env\.webshop_data=.*items_shuffle_1000\.json"):
        load_config(["preset=tiny-cpu-webshop", f"env.webshop_data={tmp_path}"])
    assert load_config(["preset=tiny-cpu"]).env.name == "alfworld"  # the default stays ALFWorld


# ----------------------------------------------------------------------------- rollouts and evaluation
class _ShopperBackend:
    """A scripted policy reading the verl-style prompt: search with the task, open the first
    product, buy; ``bad_turn`` answers without a <think> block (an invalid response)."""

    name = "scripted"

    def __init__(self, tokenizer, eos: int, bad_turn: int = -1) -> None:
        self.tok, self.eos, self.bad_turn, self.turn = tokenizer, eos, bad_turn, 0

    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0, stop_token_ids=()):
        import re

        from pcsd.rollout.backends import Sample

        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            task = re.search(r"Your task is to: (.*)\.\n", text).group(1)
            adm = text[text.rindex("are: \n[\n") :]
            if "'search[<your query>]'" in adm:
                act = f"search[{task}]"
            elif "'click[buy now]'" in adm:
                act = "click[buy now]"
            else:
                act = re.search(r"'(click\[b[0-9a-z]{9}\])'", adm).group(1)
            think = "" if self.turn == self.bad_turn else "<think>go</think>"
            ids_out = self.tok.encode(f"{think}<action>{act}</action>") + [self.eos]
            out.append([Sample(token_ids=ids_out, logprobs=[0.0] * len(ids_out), finished=True)])
        self.turn += 1
        return out


@pytest.fixture(scope="module")
def tiny_builder(tmp_path_factory):
    from pcsd.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny_ws"), seed=0)
    pb = P.PromptBuilder("webshop", history_length=2, max_prompt_tokens=None, tokenizer_dir=path)
    return pb, pb.tokenizer.encode("<|im_end|>")[0]


def test_rollouts_on_webshop(webshop_data: Path, tiny_builder) -> None:
    from pcsd.envs.webshop import WebShop
    from pcsd.rollout.loop import collect_rollouts

    pb, eos = tiny_builder
    shop = WebShop.load(webshop_data, seed=0, variant="verl")
    goals = [600, 601, 602, 603, 604, 605]
    rb = collect_rollouts(
        _ShopperBackend(pb.tokenizer, eos, bad_turn=1),
        pb,
        goals,
        2,
        max_steps=15,
        success_reward=10.0,
        invalid_action_penalty=0.1,
        env_kind="webshop",
        env_options={"shop": shop},
    )
    n = len(goals) * 2
    assert rb.num_trajectories == n and rb.length.tolist() == [3] * n  # search, open, buy
    assert rb.action_valid.view(-1, n).tolist() == [[True] * n, [False] * n, [True] * n]
    assert rb.task == [shop.goal(g)["instruction_text"] for g in goals for _ in range(2)]
    for e in range(n):  # the same actions replayed on a plain env give the recorded score
        env = shop.env()
        env.reset(goals[e // 2])
        acts = [a for t, a in zip(rb.traj_id.tolist(), rb.actions) if t == e]
        *_, (obs, r, done, info) = [env.step(a) for a in acts]
        assert done and float(r) == float(rb.score[e])
        assert bool(rb.won[e]) == (float(r) == 1.0)
        assert float(rb.reward[e]) == pytest.approx(10.0 * (float(r) == 1.0) - 0.1)
    assert 0 < float(rb.score.mean()) < 1
    # the first prompt of env 0 is the verl prompt of the reset page, chat-encoded
    obs0, info0 = shop.env().reset(goals[0])
    task = P.webshop_task(obs0)
    av = info0["available_actions"]
    expected = pb.encode_batch(
        [
            dict(
                task=task,
                observation=P.format_webshop_observation(obs0, task),
                admissible=P.webshop_actions(av["has_search_bar"], av["clickables"]),
            )
        ]
    )[0]
    assert rb.prompt_ids[0] == expected


def test_evaluation_reports_score_and_acc(webshop_data: Path, tiny_builder) -> None:
    from omegaconf import OmegaConf

    from pcsd.envs.webshop import WebShop
    from pcsd.eval.run import EvalResult, evaluate, render_table

    pb, eos = tiny_builder
    shop = WebShop.load(webshop_data, seed=1000, variant="verl")
    cfg = OmegaConf.create(
        dict(
            env=dict(name="webshop", max_steps=15, num_threads=0),
            rollout=dict(max_response_tokens=128),
            eval=dict(greedy=False, temperature=0.4, skills=False, batch_size=0, protocol="full"),
        )
    )
    goals = [0, 1, 2, 3, 4, 5, 6, 7]
    out = evaluate(
        _ShopperBackend(pb.tokenizer, eos),
        pb,
        goals,
        cfg,
        label="scripted",
        split="webshop",
        env_options={"shop": shop},
    )
    scores = [g["score"] for g in out["games"]]
    assert out["env"] == "webshop" and len(scores) == 8
    assert out["score"] == pytest.approx(100.0 * sum(scores) / 8)
    assert out["acc"] == pytest.approx(100.0 * sum(s == 1.0 for s in scores) / 8) == out["overall"]
    assert 0 < out["score"] < 100
    table = render_table([out])
    assert "| **Method** | **Score** | **Acc** | **Pick** |" in table
    assert f"| scripted | {out['score']:.1f} | {out['acc']:.1f} | – |" in table
    # next to ALFWorld's: one row per method
    alf = EvalResult(label="scripted", split="valid_seen", games=[]).to_dict()
    both = render_table([alf, out])
    assert f"| scripted | {out['score']:.1f} | {out['acc']:.1f} | – | – | – | – | – | – | 0.0 |" in both
    assert both.count("| scripted |") == 1


def test_eval_cli_webshop_split(webshop_data: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """``python -m pcsd.eval --split webshop``: validation goals, Score and Acc in the table."""
    from pcsd.eval import cli as ev
    from pcsd.tiny_model import make_tiny_model

    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    path = make_tiny_model(tmp_path / "m", seed=0)
    base = [
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
        "8",
        "--quiet",
        "--split",
        "webshop",
        "--count",
        "2",
    ]
    assert ev.main(base + ["--out", str(tmp_path / "a")]) == 2
    assert "webshop_data" in capsys.readouterr().err  # no data folder: an error naming it
    assert ev.main(base + ["--out", str(tmp_path / "a"), "--webshop-data", str(webshop_data)]) == 0
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    (res,) = doc["results"]
    assert res["env"] == "webshop" and res["episodes"] == 2 and res["score"] is not None
    from pcsd.envs.kinds.webshop import webshop_validation_goals

    assert [g["game"] for g in res["games"]] == [str(g) for g in webshop_validation_goals("full")[:2]]
    assert "| **Method** | **Score** | **Acc** |" in (tmp_path / "a" / "table.md").read_text()


def test_every_method_resolves_with_the_webshop_presets(webshop_data: Path, monkeypatch) -> None:
    from omegaconf import OmegaConf

    from pcsd.train.config import available_presets, load_config
    from pcsd.train.methods import METHODS, available_methods

    monkeypatch.setenv("WEBSHOP_DATA", str(webshop_data))
    presets = [p for p in available_presets() if "webshop" in p]
    assert set(presets) >= {"webshop-qwen2.5-3b", "webshop-qwen3-1.7b", "tiny-cpu-webshop"}
    for preset in presets:
        for m in available_methods():
            cfg = load_config([f"preset={preset}", f"method={m}"])
            assert cfg.method == m and cfg.env.name == "webshop"
            for key, val in METHODS[m]["overrides"].items():
                assert OmegaConf.select(cfg, key) == val, (preset, m, key)


def test_training_smoke_run(webshop_data: Path, tmp_path: Path, child_env: dict) -> None:
    """``python -m pcsd.train preset=tiny-cpu-webshop`` cut to 2 SFT steps and 1 RL step (hf backend):
    the expert warm-up, the evaluations with Score/Acc and the WebShop step metrics all run."""
    import subprocess
    import sys

    env = dict(child_env, WEBSHOP_DATA=str(webshop_data))
    args = [
        "preset=tiny-cpu-webshop",
        "rollout.backend=hf",
        "optim.sft_steps=2",
        "optim.sft_games=6",
        "optim.sft_batch_size=2",
        "optim.steps=1",
        "rollout.tasks_per_step=1",
        "rollout.group_size=2",
        "env.max_steps=8",
        "rollout.max_response_tokens=96",  # holds the warm-up's search[...] targets (91 tokens; shorter is refused)
        "eval.episodes=2",
        "model.tiny_layers=1",
        f"run.dir={tmp_path / 'run'}",
        "run.progress=false",
        "run.tensorboard=false",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "pcsd.train", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("score_before", "acc_before", "score_after", "acc_after", "sft_expert_success"):
        assert summary[key] is not None, key
    assert summary["sft_expert_success"] > 50  # the native expert wins most goals
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 1 and 0 <= rec["score"] <= 100
    ev = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert ev["after"]["env"] == "webshop" and ev["after"]["episodes"] == 2
    assert "| **Method** | **Score** | **Acc** |" in (tmp_path / "run" / "eval.md").read_text()
