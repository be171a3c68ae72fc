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
            text, variant, _ = pb.build_detailed(task, agent_obs, _avail(st["available_actions"]), history,
                                                 len(history))
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
    assert P.format_webshop_observation(obs, task) == "'Back to Search' [SEP] 'Page 1 (Total results: 1)' [SEP] 'Next >'"
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
