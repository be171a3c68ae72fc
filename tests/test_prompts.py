"""Prompts, chat templates, tokenisation, action parsing and skill retrieval (pcsd.text.prompts)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.text import prompts as P

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
TEMPLATES = {"qwen2.5": FIXTURES / "qwen2.5.jinja", "qwen3": FIXTURES / "qwen3.jinja"}

TASK = "put a clean mug in coffeemachine"
OBS0 = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
    "a coffeemachine 1, a countertop 1, a sinkbasin 1, and a fridge 1."
)
ADM = ["go to cabinet 1", "go to coffeemachine 1", "go to countertop 1", "help", "inventory", "look"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    from pcsd.tiny_model import make_tiny_model

    return {
        name: make_tiny_model(tmp_path_factory.mktemp(name.replace(".", "")), template=str(path))
        for name, path in TEMPLATES.items()
    }


@pytest.fixture(scope="module")
def hf_tokenizers(model_dirs):
    from transformers import AutoTokenizer

    return {k: AutoTokenizer.from_pretrained(v) for k, v in model_dirs.items()}


def hf_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(out)


# ------------------------------------------------------------------------------------------------
# Plain-Python reference of the prompt templates (paper appendix wording), used to cross-check the
# Rust renderer.
# ------------------------------------------------------------------------------------------------
_ALF_INSTR = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags."
)


def ref_alfworld(task, obs, adm, history, step, h):
    acts = "\n ".join(f"'{a}'" for a in adm if a != "help")
    head = f"You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task}\n\n"
    tail = f"Your admissible actions of the current situation are: [{acts}].\n\n{_ALF_INSTR}"
    recent = history[-h:] if h > 0 else []
    if step == 0 or not recent:
        return head + f"Your current observation is: {obs}\n\n" + tail
    first = step - len(recent) + 1
    hist = "\n".join(f"[Observation {first + j}: '{o}', Action {first + j}: '{a}']" for j, (o, a) in enumerate(recent))
    return (
        head + f"Prior to this step, you have already taken {step} step(s). Below are the most recent "
        f"{len(recent)} observations and the corresponding actions you took: {hist}\n\n"
        f"You are now at step {step + 1} and your current observation is: {obs}\n\n" + tail
    )


# ------------------------------------------------------------------------------------------------
# Prompt text
# ------------------------------------------------------------------------------------------------
def test_first_step_has_no_history_and_no_help():
    pb = P.PromptBuilder("alfworld")
    text = pb.build(TASK, OBS0, ADM, history=[], step=0)
    assert "Prior to this step" not in text
    assert f"Your task is to: {TASK}\n\nYour current observation is: {OBS0}" in text
    assert "'help'" not in text and "'look'" in text
    assert text == ref_alfworld(TASK, OBS0, ADM, [], 0, 2)


def test_later_step_shows_last_h_pairs():
    hist = [("obs 1", "go to cabinet 1"), ("obs 2", "open cabinet 1"), ("obs 3", "go to countertop 1")]
    pb = P.PromptBuilder("alfworld", history_length=2)
    text = pb.build(TASK, "You arrive at countertop 1.", ADM, history=hist, step=3)
    assert "already taken 3 step(s)" in text and "most recent 2 observations" in text
    assert "[Observation 2: 'obs 2', Action 2: 'open cabinet 1']\n[Observation 3: 'obs 3'" in text
    assert "obs 1" not in text and "You are now at step 4" in text
    dict_hist = [{"observation": o, "action": a} for o, a in hist]
    assert pb.build(TASK, "You arrive at countertop 1.", ADM, dict_hist, 3) == text


_TXT = st.characters(categories=("L", "N", "P", "S", "Zs"), include_characters="\n{}'")


@settings(max_examples=60, deadline=None)
@given(
    task=st.text(_TXT, min_size=1, max_size=30).filter(lambda s: s.strip() == s and s),
    obs=st.text(_TXT, max_size=60).map(str.strip),
    adm=st.lists(st.one_of(st.just("help"), st.text(_TXT, max_size=15)), max_size=5),
    hist=st.lists(st.tuples(st.text(_TXT, max_size=20), st.text(_TXT, max_size=10)), max_size=5),
    extra=st.integers(0, 3),
    h=st.integers(0, 4),
)
def test_rust_prompt_matches_python_reference(task, obs, adm, hist, extra, h):
    step = len(hist) + extra if hist else extra
    pb = P.PromptBuilder("alfworld", history_length=h, max_prompt_tokens=None)
    assert pb.build(task, obs, adm, hist, step) == ref_alfworld(task, obs, adm, hist, step, h)


def test_webshop_prompt():
    pb = P.PromptBuilder("webshop")
    adm = ["search[<your query>]", "click[back to search]"]
    text = pb.build("i need a red shirt, size large", "'Search'", adm, [], 0)
    # verl-agent's template byte for byte (tests/test_webshop_wiring.py checks every recorded prompt)
    assert text.startswith(
        "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment. \n"
        "Your task is to: i need a red shirt, size large.\nYour current observation is: 'Search'.\n"
    )
    assert "[\n'search[<your query>]',\n'click[back to search]',\n]." in text
    text2 = pb.build("i need a red shirt", "page 2", adm, [("'Search'", "search[red shirt]")], 1)
    assert "[Observation 1: ''Search'', Action 1: 'search[red shirt]']" in text2
    assert "You are now at step 2 and your current observation is: page 2." in text2


def test_teacher_prompt_is_skills_then_student():
    pb = P.PromptBuilder("alfworld")
    hist = [("obs 1", "go to cabinet 1")]
    s = pb.build(TASK, "o", ADM, hist, 1)
    t = pb.build_teacher(TASK, "o", ADM, hist, 1)
    assert t.endswith(s)
    block = t[: len(t) - len(s)]
    assert block.startswith("[Privileged Skill Information]\n")
    assert block.endswith("[End of Skill Information]\n\n")
    assert P.retrieve_skills(TASK) in block


def test_bad_arguments():
    with pytest.raises(ValueError, match="env"):
        P.PromptBuilder("sokoban")
    with pytest.raises(ValueError, match="history_length"):
        P.PromptBuilder("alfworld", history_length=-1)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        P.PromptBuilder("alfworld", max_prompt_tokens=0)
    pb = P.PromptBuilder("alfworld")
    with pytest.raises(ValueError, match="history"):
        pb.build(TASK, "o", ADM, [("a", "b"), ("c", "d")], step=1)
    with pytest.raises(ValueError, match=r"history\[0\]"):
        pb.build(TASK, "o", ADM, [("a",)], step=1)
    with pytest.raises(ValueError, match="admissible"):
        pb.build(TASK, "o", "look", [], 0)
    with pytest.raises(ValueError, match="step"):
        pb.build(TASK, "o", ADM, [], -1)
    with pytest.raises(ValueError, match="task"):
        pb.build("  ", "o", ADM, [], 0)
    with pytest.raises(ValueError, match="tokenizer_dir"):
        pb.encode_chat(["x"])
    assert not pb.budget_enforced


# ------------------------------------------------------------------------------------------------
# Chat template + tokenisation vs transformers
# ------------------------------------------------------------------------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": TASK}],
    [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": OBS0}],
    [
        {"role": "user", "content": "heat some egg and put it in countertop"},
        {"role": "assistant", "content": "<think>\nfind the egg\n</think>\n\n<action>go to fridge 1</action>"},
        {"role": "user", "content": "You arrive at fridge 1. The fridge 1 is closed."},
    ],
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>r1</think>a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"},
    ],
    [{"role": "user", "content": "Ünïcödé – 日本語 😀\n\n\ttabs  and   spaces \r\n {{ not a template }}"}],
]


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_rust_tokens_equal_apply_chat_template(model_dirs, hf_tokenizers, name):
    tok = hf_tokenizers[name]
    ct = P.ChatTokenizer(model_dirs[name])
    for conv in CONVERSATIONS:
        want_text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        assert ct.render(conv) == want_text, conv
    got = ct.encode_conversations(CONVERSATIONS)
    want = [hf_ids(tok, c) for c in CONVERSATIONS]
    assert got == want
    # the generation prompt and the Qwen2.5 default system message
    text = ct.render(CONVERSATIONS[0])
    assert text.endswith("<|im_start|>assistant\n")
    if name == "qwen2.5":
        assert "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." in text
    else:
        assert "<|im_start|>system" not in text
        # qwen3 drops reasoning of earlier turns and keeps it for the last assistant turn
        t = ct.render(CONVERSATIONS[3], add_generation_prompt=False)
        assert "r1" not in t and "<think>\nr2\n</think>\n\na2" in t


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_enable_thinking_matches_transformers(model_dirs, hf_tokenizers, enable_thinking):
    tok = hf_tokenizers["qwen3"]
    ct = P.ChatTokenizer(model_dirs["qwen3"], enable_thinking=enable_thinking)
    conv = CONVERSATIONS[2]
    want = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False, enable_thinking=enable_thinking)
    assert ct.render(conv) == want
    assert want.endswith("<think>\n\n</think>\n\n") != enable_thinking
    ids = tok.apply_chat_template(
        conv, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=enable_thinking
    )
    assert ct.encode_conversations([conv]) == [list(ids)]


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_encode_chat_batch_matches_python(model_dirs, hf_tokenizers, name):
    tok = hf_tokenizers[name]
    pb = P.PromptBuilder("alfworld", tokenizer_dir=model_dirs[name], max_prompt_tokens=None)
    prompts = [
        pb.build(TASK, f"{OBS0} variant {i}", ADM, [(f"o{j}", f"a{j}") for j in range(i % 3)], i % 3) for i in range(40)
    ]
    for system in (None, "You are an agent."):
        got = pb.encode_chat(prompts, system=system)
        pre = [{"role": "system", "content": system}] if system else []
        want = [hf_ids(tok, pre + [{"role": "user", "content": p}]) for p in prompts]
        assert got == want
        assert got == pb.tokenizer._inner.encode_chat_sequential(prompts, system)


def test_build_batch_matches_single_calls(model_dirs, hf_tokenizers):
    d = model_dirs["qwen3"]
    reqs = [
        {
            "task": TASK,
            "observation": f"obs {i}",
            "admissible": ADM,
            "history": [(f"o{j}", f"a{j}") for j in range(i % 4)],
            "step": i % 4,
        }
        for i in range(30)
    ]
    for budget, threads in ((None, 0), (4096, 0), (None, 1), (4096, 3)):  # own pools of 1 and 3 threads too
        pb = P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=budget, num_threads=threads)
        for teacher in (False, True):
            for system in (None, "sys"):
                got = pb.build_batch(reqs, teacher=teacher, system=system)
                build = pb.build_teacher if teacher else pb.build
                texts = [build(r["task"], r["observation"], r["admissible"], r["history"], r["step"]) for r in reqs]
                assert [t for t, _ in got] == texts
                pre = [{"role": "system", "content": system}] if system else []
                want = [hf_ids(hf_tokenizers["qwen3"], pre + [{"role": "user", "content": t}]) for t in texts]
                assert [ids for _, ids in got] == want
    with pytest.raises(ValueError, match=r"requests\[0\]"):
        pb.build_batch([{"task": TASK}])
    with pytest.raises(ValueError, match="tokenizer_dir"):
        P.PromptBuilder("alfworld").build_batch(reqs)
    with pytest.raises(ValueError, match="num_threads"):
        P.PromptBuilder("alfworld", num_threads=-1)


@pytest.fixture(scope="module")
def batch_builder(model_dirs):
    return P.PromptBuilder("alfworld", tokenizer_dir=model_dirs["qwen2.5"], max_prompt_tokens=None)


@settings(max_examples=40, deadline=None)
@given(
    n_hist=st.integers(0, 9),
    h=st.integers(0, 4),
    extra_steps=st.integers(0, 3),
    obs=st.text(max_size=30),
    as_mappings=st.booleans(),
    as_tuples=st.booleans(),
)
def test_encode_batch_reads_requests_like_single_calls(model_dirs, n_hist, h, extra_steps, obs, as_mappings, as_tuples):
    """Requests are read in place (only the history tail the template shows) and ids go out as
    lists of shared ints: same prompts and ids as one build + encode_chat per request, whatever
    the history's length, H, the entries' form (pairs or mappings) and the containers."""
    from types import MappingProxyType

    pb = P.PromptBuilder("alfworld", history_length=h, tokenizer_dir=model_dirs["qwen2.5"], max_prompt_tokens=None)
    hist = [(f"obs {j} {obs}", f"go to cabinet {j}") for j in range(n_hist)]
    entries = [{"observation": o, "action": a} for o, a in hist] if as_mappings else hist
    step = n_hist + extra_steps
    reqs = [
        {
            "task": TASK,
            "observation": obs or "o",
            "admissible": tuple(ADM) if as_tuples else ADM,
            "history": tuple(entries) if as_tuples else entries,
            "step": step,
        },
        MappingProxyType({"task": TASK, "observation": OBS0, "admissible": ADM}),
    ]
    for teacher in (False, True):
        build = pb.build_teacher if teacher else pb.build
        texts = [build(TASK, obs or "o", ADM, hist, step), build(TASK, OBS0, ADM, [], 0)]
        got = pb.build_batch(reqs, teacher=teacher)
        assert [t for t, _ in got] == texts
        ids = pb.encode_batch(reqs, teacher=teacher)
        assert ids == [i for _, i in got] == pb.encode_chat(texts)
        assert all(type(i) is list and all(type(x) is int for x in i) for i in ids)
        ids[0].append(-1)  # each call hands out its own lists
        assert pb.encode_batch(reqs, teacher=teacher)[0] == got[0][1]


@pytest.mark.parametrize(
    "requests, match",
    [
        ("task", r"requests: expected a list of request mappings, got str"),
        (7, r"requests: expected a list of request mappings, got int"),
        ([["task", "obs"]], r"requests\[0\]: expected a mapping, got list"),
        ([{"observation": "o", "admissible": []}], r"requests\[0\]: missing key 'task'"),
        (
            [{"task": TASK, "observation": b"o", "admissible": []}],
            r"requests\[0\]\['observation'\]: expected str, got bytes",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": "look"}],
            r"\['admissible'\]: expected a list of strings, got str",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": ["look", 3]}],
            r"\['admissible'\]\[1\]: expected str, got int",
        ),
        ([{"task": TASK, "observation": "\ud800", "admissible": []}], r"\['observation'\]: not encodable as UTF-8"),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "step": -1}],
            r"\['step'\]: expected a non-negative int",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "step": True}],
            r"\['step'\]: expected a non-negative int",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "step": 1.0}],
            r"\['step'\]: expected a non-negative int",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "history": "ab", "step": 1}],
            r"\['history'\]: expected a list of \(observation, action\) pairs, got str",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "history": [("a", "b")] * 3, "step": 2}],
            r"requests\[0\]: .*at most `step` \(= 2\) entries.*got 3",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "history": [("a", "b", "c")], "step": 1}],
            r"\['history'\]\[0\]: expected an \(observation, action\) pair, got 3 items",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "history": [("a", None)], "step": 1}],
            r"\['history'\]\[0\]\[1\]: expected str, got NoneType",
        ),
        (
            [{"task": TASK, "observation": "o", "admissible": [], "history": [{"observation": "a"}], "step": 1}],
            r"\['history'\]\[0\]: expected keys 'observation' and 'action', missing 'action'",
        ),
        ([{"task": "  ", "observation": "o", "admissible": []}], r"`task`"),
    ],
)
def test_encode_batch_bad_requests(batch_builder, requests, match):
    for call in (batch_builder.build_batch, batch_builder.encode_batch):
        with pytest.raises(ValueError, match=match):
            call(requests)


def test_encode_batch_bad_system(batch_builder):
    with pytest.raises(ValueError, match="system: expected str or None, got int"):
        batch_builder.encode_batch([{"task": TASK, "observation": "o", "admissible": []}], system=3)


def test_budget_fallback_and_error(model_dirs):
    d = model_dirs["qwen2.5"]
    hist = [("You arrive at cabinet 1. " * 20, "go to cabinet 1")] * 2
    assert (
        P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=None).build_detailed(TASK, OBS0, ADM, hist, 2)[2]
        is None
    )  # no budget, nothing measured
    probe = P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=10**6)
    full, variant, n_full = probe.build_detailed(TASK, OBS0, ADM, hist, 2)
    assert variant == "history"
    n_short = len(probe.encode_chat([probe.build(TASK, OBS0, ADM, [], 0)])[0])
    assert n_full == len(probe.encode_chat([full])[0]) and n_short < n_full

    fits = P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=n_full)
    assert fits.budget_enforced
    assert fits.build_detailed(TASK, OBS0, ADM, hist, 2)[1] == "history"
    falls = P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=n_full - 1)
    text, variant, n = falls.build_detailed(TASK, OBS0, ADM, hist, 2)
    assert variant == "no_history" and n == n_short and "Prior to this step" not in text
    # the teacher follows the student's variant
    assert falls.build_teacher(TASK, OBS0, ADM, hist, 2).endswith(text)
    tight = P.PromptBuilder("alfworld", tokenizer_dir=d, max_prompt_tokens=n_short - 1)
    with pytest.raises(ValueError, match="too long") as ei:
        tight.build(TASK, OBS0, ADM, hist, 2)
    assert isinstance(ei.value, P.PromptTooLongError)


def test_missing_files(tmp_path, model_dirs):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        P.PromptBuilder("alfworld", tokenizer_dir=missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        P.ChatTokenizer(tmp_path / "empty")
    d = tmp_path / "no_template"
    d.mkdir()
    shutil.copy(model_dirs["qwen2.5"] / "tokenizer.json", d)
    with pytest.raises(FileNotFoundError, match="chat template"):
        P.ChatTokenizer(d)


def _dir_with_template(tmp_path, model_dirs, source: str, as_file: bool) -> Path:
    d = tmp_path / ("tpl_file" if as_file else "tpl_cfg")
    d.mkdir()
    src = model_dirs["qwen2.5"]
    shutil.copy(src / "tokenizer.json", d)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    if as_file:
        cfg.pop("chat_template")
        (d / "chat_template.jinja").write_text(source)
    else:
        cfg["chat_template"] = source
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_template_errors_are_value_errors(tmp_path, model_dirs):
    src = (FIXTURES / "no_system.jinja").read_text()
    d = _dir_with_template(tmp_path, model_dirs, src, as_file=True)
    ct = P.ChatTokenizer(d)
    assert ct.encode_chat(["hello"])  # renders without a system turn
    with pytest.raises(ValueError, match="System role not supported"):
        ct.encode_chat(["hello"], system="sys")
    bad = _dir_with_template(tmp_path, model_dirs, "{% for m in messages %}{{ m.content }", as_file=False)
    with pytest.raises(ValueError, match="template"):
        P.ChatTokenizer(bad)


# ------------------------------------------------------------------------------------------------
# Action parsing
# ------------------------------------------------------------------------------------------------
def test_parse_action_flags():
    p = P.parse_action("<think>mug is in cabinet</think>\n<action> go to cabinet 1 </action>", ADM)
    assert p.action == "go to cabinet 1" and p.think == "mug is in cabinet" and p.is_valid
    p = P.parse_action("<action>look</action>", ADM)
    assert p.missing_think and not p.is_valid and p.action == "look"
    p = P.parse_action("<think>x</think> go to cabinet 1", ADM)
    assert p.missing_action_tags and p.action == "go to cabinet 1"
    p = P.parse_action("<think>x</think><action>look</action><action>inventory</action>", ADM)
    assert p.multiple_actions and p.action == "look"
    p = P.parse_action("<think>x</think><action>Look</action>", ADM)
    assert p.not_admissible and p.action == "Look"
    assert not P.parse_action("<think>x</think><action>anything</action>").not_admissible


@settings(max_examples=200, deadline=None)
@given(st.text(), st.lists(st.text(max_size=10), max_size=3))
def test_parse_action_never_raises(text, adm):
    p = P.parse_action(text, adm)
    assert p.action == p.action.strip()


@settings(max_examples=100, deadline=None)
@given(
    think=st.text(st.characters(blacklist_characters="<>"), max_size=40),
    action=st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), min_size=1, max_size=30)
    .map(str.strip)
    .filter(bool),
)
def test_parse_action_round_trip(think, action):
    p = P.parse_action(f"<think>{think}</think>\n<action>{action}</action>", [action])
    assert p.action == action and p.is_valid


def test_parse_action_reads_lone_surrogates_as_replacement_characters():
    """A lone surrogate (a str that is not UTF-8) is read as U+FFFD, like the engine reads a command."""
    p = P.parse_action("<think>\ud800</think>\n<action>go \udfff</action>", ["go \udfff"])
    assert p.think == "\ufffd" * 3 and p.action == "go " + "\ufffd" * 3 and not p.missing_think


# ------------------------------------------------------------------------------------------------
# Skills
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "task,kind",
    [
        ("put a clean mug in coffeemachine", "pick_clean_then_place_in_recep"),
        ("examine the book with the desklamp", "look_at_obj_in_light"),
        ("look at alarmclock under the desklamp", "look_at_obj_in_light"),
        ("put two spraybottle in toilet", "pick_two_obj_and_place"),
        ("find two pillow and put them in sofa", "pick_two_obj_and_place"),
        ("heat some egg and put it in countertop", "pick_heat_then_place_in_recep"),
        ("put a hot apple in fridge", "pick_heat_then_place_in_recep"),
        ("cool some apple and put it in fridge", "pick_cool_then_place_in_recep"),
        ("put a cool mug in cabinet", "pick_cool_then_place_in_recep"),
        ("put some keychain on sofa", "pick_and_place_simple"),
        ("put a tomato in microwave", "pick_and_place_simple"),
    ],
)
def test_alfworld_skill_mapping(task, kind):
    assert P.classify_alfworld_task(task) == kind
    skills = P.retrieve_skills(task)
    assert skills.startswith("## General rules")
    assert skills == P.retrieve_skills(task)  # deterministic


def test_skills_are_procedural_and_env_specific():
    s = P.retrieve_skills("heat some egg and put it in countertop")
    assert "microwave" in s and "egg" not in s  # no instance answers
    w = P.retrieve_skills("i want gluten free snacks under 20 dollars", env="webshop")
    assert "shopping website" in w and "grocery" in w
    assert P.retrieve_skills("xyz", env="webshop").count("## ") == 1  # general only
    with pytest.raises(ValueError, match="env"):
        P.retrieve_skills("x", env="sokoban")


def _real_games(alfworld_data) -> list[tuple[str, str, str]]:
    """``(task sentence, task type, path)`` of every real ALFWorld game of the three splits, the
    type read from the game's path (``<split>/<type>-<object>-...-<scene>/<trial>/game.tw-pddl``)."""
    out = []
    for split in ("train", "valid_seen", "valid_unseen"):
        for f in sorted((alfworld_data / "json_2.1.1" / split).glob("*/*/game.tw-pddl")):
            g = json.loads(f.read_text())
            m = re.search(r'"task":\s*\[\s*\{\s*"rhs":\s*"Your task is to: ([^"]*)"', g["grammar"])
            assert m, f"no task sentence in {f}"
            out.append((m.group(1), f.parent.parent.name.split("-")[0], str(f)))
    return out


def test_every_real_alfworld_game_is_classified_as_its_own_task_type(alfworld_data):
    """Every game of train, valid_seen and valid_unseen (874 in the shared set: ~2 s): the keyword
    classifier names the type in the game's path, and retrieval gives general + that type's skills."""
    games = _real_games(alfworld_data)
    assert len(games) > 800 and len({t for _, t, _ in games}) == 6
    wrong = [
        (task, kind, P.classify_alfworld_task(task), path)
        for task, kind, path in games
        if P.classify_alfworld_task(task) != kind
    ]
    assert not wrong, wrong[:10]
    for task, kind, _ in games[:: max(len(games) // 60, 1)]:
        assert P._mod().retrieve_skill_names(task, "alfworld") == ["general", kind]


@pytest.mark.parametrize(
    "task", ["", "xyz", "go to the kitchen", "find a mug", "open the fridge", "the computer output"]
)
def test_no_task_type_match_gives_the_general_skills_only(task):
    """The paper's appendix: "If no task-type skill is matched, only the general skills are
    provided" (pick-and-place is matched by its own words, "put", "place", "move", not by default)."""
    assert P.classify_alfworld_task(task) is None
    general = P.retrieve_skills(task)
    assert general.startswith("## General rules") and general.count("## ") == 1
    assert P._mod().retrieve_skill_names(task, "alfworld") == ["general"]
    assert P.retrieve_skills("put a mug in desk").startswith(general + "\n\n")  # general + the type's


@pytest.mark.parametrize("verb", ["put", "place", "move"])
def test_pick_and_place_has_keywords_of_its_own(verb):
    assert P.classify_alfworld_task(f"{verb} a mug in desk") == "pick_and_place_simple"
    assert P._mod().retrieve_skill_names(f"{verb} some keychain on sofa", "alfworld") == [
        "general",
        "pick_and_place_simple",
    ]


def test_encode_chat_from_several_threads(model_dirs):
    """The GIL is released during encoding; concurrent callers get correct, independent results."""
    from concurrent.futures import ThreadPoolExecutor

    pb = P.PromptBuilder("alfworld", tokenizer_dir=model_dirs["qwen2.5"])
    batches = [[f"{TASK} {i} {j}" for j in range(50)] for i in range(4)]
    want = [pb.tokenizer._inner.encode_chat_sequential(b, None) for b in batches]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(pb.encode_chat, batches))
    assert got == want


# ------------------------------------------------------------------------------------------------
# Piece-cache encoding (rust_envpool/src/piece_cache.rs) against whole-string encoding.
# ------------------------------------------------------------------------------------------------
_PIECES = [
    "\n",
    "\n",
    "\n\n",
    " ",
    "  ",
    "\n ",
    " \n",
    "\r\n",
    "\t",
    "\u00a0",
    "\u2028",
    "a",
    "the",
    "Go to",
    "'s",
    "'",
    "[",
    "].",
    ",",
    "ü",
    "u\u0308",
    "\u0301",
    "e\u0301\u0323",
    "Å",
    "0",
    "12",
    "٣",
    "日本語",
    "🙂",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|im_",
    "cabinet 10",
]
_texts = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=6)), max_size=50).map("".join)


@pytest.fixture(scope="module")
def hf_fast_tokenizers(model_dirs):
    from tokenizers import Tokenizer

    return {k: Tokenizer.from_file(str(v / "tokenizer.json")) for k, v in model_dirs.items()}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_piece_cache_is_used_for_qwen_style_tokenizers(model_dirs, name):
    tok = P.ChatTokenizer(model_dirs[name])
    assert tok._inner.piece_cache_unsupported is None


@settings(max_examples=150, deadline=None)
@given(a=_texts, b=_texts)
def test_piece_cache_encode_equals_whole_string_encode(model_dirs, hf_fast_tokenizers, a, b):
    tok = P.ChatTokenizer(model_dirs["qwen2.5"])._inner
    hf = hf_fast_tokenizers["qwen2.5"]
    # The same pieces again in new company: the second and third texts hit the cache.
    for text in (a, b, a + "\n" + b, b + a):
        want = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == want, text
        assert tok.encode_whole(text) == want


def test_unsupported_pre_tokenizer_falls_back_to_whole_strings(tmp_path, model_dirs, hf_fast_tokenizers):
    from tokenizers import Tokenizer

    src = model_dirs["qwen2.5"]
    dst = tmp_path / "other"
    shutil.copytree(src, dst)
    doc = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    (dst / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    tok = P.ChatTokenizer(dst)._inner
    assert "pre_tokenizer" in tok.piece_cache_unsupported
    hf = Tokenizer.from_file(str(dst / "tokenizer.json"))
    text = "a\nb  <think>\n c\n\nYour admissible actions: ['go to cabinet 1'\n 'look']\n"
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids
    # Under this regex the whitespace run "\n " is one pre-token, so cutting after '\n' would be
    # wrong here.
    assert tok.encode("x\n y") == hf.encode("x\n y", add_special_tokens=False).ids


_REENTRANT = """
import gc, sys
from pcsd.text import prompts as P
pb = P.PromptBuilder("alfworld", tokenizer_dir=sys.argv[1], max_prompt_tokens=None)
req = [{"task": "put a mug in sinkbasin", "observation": "o", "admissible": ["look"]}]
want = pb.encode_batch(req)
inner, busy = [], [False]

def during_collection(phase, info):  # stands in for a finalizer: Python code run by the collector
    if phase == "start" and not busy[0]:
        busy[0] = True
        inner.append(pb.encode_batch(req))
        busy[0] = False

reqs = req * 8
gc.callbacks.append(during_collection)
gc.set_threshold(1)  # a collection at (nearly) every container allocation, the id lists' too
outer = [pb.encode_batch(reqs) for _ in range(20)]
gc.set_threshold(700)
gc.callbacks.remove(during_collection)
assert inner, "no collection ran during a call"
assert all(x == want for x in inner) and all(x == want * 8 for x in outer)
print("ok", len(inner))
"""


def test_encode_batch_reentered_during_a_collection(model_dirs, tmp_path):
    """A garbage collection while the ids are handed out can run Python code (finalizers, gc
    callbacks) that calls the same builder: the id cache is only tried, never waited for (a wait
    would deadlock)."""
    import subprocess
    import sys

    # cwd away from the checkout: `python -c` puts the cwd first on sys.path, and the source tree's
    # pcsd/ has no compiled modules when pcsd is installed
    r = subprocess.run(
        [sys.executable, "-c", _REENTRANT, str(model_dirs["qwen2.5"])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]
