"""pcsd.tiny_model.make_tiny_model: a real, tiny, offline Qwen2 model + trained BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcsd import tiny_model as T

FIXTURES = Path(__file__).parent / "fixtures" / "templates"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return T.make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def test_files_and_config(tiny):
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny / f).is_file(), f
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32
    tcfg = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"] == T.QWEN25_CHAT_TEMPLATE
    assert tcfg["eos_token"] == "<|im_end|>" and tcfg["pad_token"] == "<|endoftext|>"


def test_loads_generates_and_is_float32(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert next(model.parameters()).dtype == torch.float32
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "put some keychain on sofa"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    x = torch.tensor([list(ids)])
    out = model.generate(x, max_new_tokens=6, do_sample=False)
    assert out.shape[1] > x.shape[1]
    assert int(out.max()) < model.config.vocab_size
    assert tok.convert_tokens_to_ids("<|im_end|>") == model.config.eos_token_id


def test_tokenizer_round_trip_and_specials(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    for text in [
        "<think>The mug is on the desk.</think>\n<action>take mug 1 from desk 1</action>",
        "You arrive at countertop 2. On the countertop 2, you see a apple 1.",
        "Ünïcödé 日本 😀 {{ x }}\n\n",
    ]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    for s in T.SPECIAL_TOKENS:
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1, s
    # BPE merges learned from the corpus: far fewer tokens than bytes on in-domain text
    text = "You arrive at coffeemachine 1. <think>go to countertop 1</think>"
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < len(text) // 3


def test_chat_template_renders(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_deterministic_for_a_seed(tiny, tmp_path):
    again = T.make_tiny_model(tmp_path / "again", seed=0)
    for f in ("tokenizer.json", "model.safetensors", "config.json"):
        assert (again / f).read_bytes() == (tiny / f).read_bytes(), f
    other = T.make_tiny_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


def test_builtin_templates_match_fixtures():
    assert (FIXTURES / "qwen2.5.jinja").read_text() == T.QWEN25_CHAT_TEMPLATE
    assert (FIXTURES / "qwen3.jinja").read_text() == T.QWEN3_CHAT_TEMPLATE


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="head size"):
        T.make_tiny_model(tmp_path, hidden_size=64, num_heads=4)
    with pytest.raises(ValueError, match="template"):
        T.make_tiny_model(tmp_path, template="llama3")
    with pytest.raises(ValueError, match="vocab_size"):
        T.make_tiny_model(tmp_path, vocab_size=10)
    with pytest.raises(ValueError, match="words: expected non-empty strings without whitespace"):
        T.make_tiny_model(tmp_path, words=["b00abc", "two words"])
    with pytest.raises(ValueError, match="words: expected distinct"):
        T.make_tiny_model(tmp_path, words=["b00abc", "b00abc"])
    with pytest.raises(TypeError, match="words: expected a sequence"):
        T.make_tiny_model(tmp_path, words="b00abc")


def test_words_are_one_token_in_transformers_and_in_the_native_builder(tmp_path):
    """WebShop's product ids as whole tokens: transformers and pcsd's Rust tokenizer agree, the
    ids decode back to the text, and the BPE part is the same as without the words."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pcsd.text.prompts import PromptBuilder

    words = ["b000j3hzxs", "b09309hmmj", "b07q2sp4y5"]
    plain = AutoTokenizer.from_pretrained(T.make_tiny_model(tmp_path / "plain"))
    d = T.make_tiny_model(tmp_path / "m", words=words)
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) == len(plain) + 3
    assert AutoModelForCausalLM.from_pretrained(d).config.vocab_size >= len(tok)
    text = "'click[b09309hmmj]',\n<action>click[b000j3hzxs]</action> B09309HMMJ b07q2sp4y5x"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    pieces = [tok.decode([i]) for i in ids]
    assert "b09309hmmj" in pieces and "b000j3hzxs" in pieces and "b07q2sp4y5" in pieces
    assert "B09309HMMJ" not in pieces  # case-sensitive: the page's upper-case id stays cut
    assert plain("a small model")["input_ids"] == tok("a small model")["input_ids"]
    native = PromptBuilder("webshop", tokenizer_dir=d).encode_chat([text])[0]
    ref = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    assert native == list(ref["input_ids"] if hasattr(ref, "keys") else ref)
