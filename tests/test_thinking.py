"""Qwen3's thinking switch (``model.enable_thinking``) reaches the student and the teacher prompts
exactly as transformers renders them, and a model directory's ``chat_template.jinja`` wins over
``tokenizer_config.json``'s ``chat_template`` as it does in transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcsd.text.prompts import ChatTokenizer, PromptBuilder
from pcsd.train.config import load_config

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
REQS = [
    {
        "task": "put a clean mug in coffeemachine",
        "observation": f"You see a cabinet {i}.",
        "admissible": ["go to cabinet 1", "look"],
        "history": [("obs a", "look")] * (i % 2),
        "step": i % 2,
    }
    for i in range(3)
]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("q3"), template=str(FIXTURES / "qwen3.jinja"))


@pytest.mark.parametrize("thinking", [False, True, None], ids=["off", "on", "unset"])
def test_student_and_teacher_prompts_match_transformers(qwen3_dir, thinking):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    kw = {} if thinking is None else {"enable_thinking": thinking}
    pb = PromptBuilder("alfworld", tokenizer_dir=qwen3_dir, max_prompt_tokens=None, enable_thinking=thinking)
    for teacher in (False, True):
        for text, ids in pb.build_batch(REQS, teacher=teacher):
            msgs = [{"role": "user", "content": text}]
            want_text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
            want_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False, **kw)
            assert ids == list(want_ids)
            assert pb.tokenizer.render([{"role": "user", "content": text}]) == want_text
            # off: an empty think block closes the generation prompt; on / unset: the model thinks
            assert want_text.endswith("<think>\n\n</think>\n\n") == (thinking is False)


def test_the_config_key_is_checked_and_recorded():
    assert load_config([]).model.enable_thinking is None
    assert load_config(["model.enable_thinking=false"]).model.enable_thinking is False
    qwen3 = load_config(["preset=alfworld-qwen3-1.7b"])
    assert qwen3.model.enable_thinking is False  # the preset's choice (see its comment)
    from pcsd.train.config import ConfigError

    with pytest.raises(ConfigError, match="enable_thinking"):
        load_config(["model.enable_thinking=maybe"])


def test_chat_template_jinja_wins_like_transformers(tmp_path):
    """A directory with both: tokenizer_config.json says Qwen2.5's template, chat_template.jinja
    Qwen3's; transformers renders with the .jinja file, and so must the Rust renderer."""
    from transformers import AutoTokenizer

    from pcsd.tiny_model import make_tiny_model

    d = make_tiny_model(tmp_path / "both", template="qwen2.5")
    (d / "chat_template.jinja").write_text((FIXTURES / "qwen3.jinja").read_text())
    msgs = [{"role": "user", "content": "hello"}]
    want = AutoTokenizer.from_pretrained(d).apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert "You are Qwen" not in want and want.endswith("<think>\n\n</think>\n\n")  # Qwen3's, not Qwen2.5's
    assert ChatTokenizer(d, enable_thinking=False).render(msgs) == want
