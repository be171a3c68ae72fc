"""The CPU default's model: a tiny, offline Qwen2-architecture causal LM with a trained BPE tokenizer
(what a run without ``model.path`` trains), and the hand-made batches the tests and benchmarks use.

:func:`make_tiny_model` writes a complete Hugging Face model directory (config, float32
safetensors weights, ``tokenizer.json``, ``tokenizer_config.json`` with a ChatML chat template,
generation config) in a few seconds without network access. It is deterministic for a seed, so
tests of rollout, tokenisation and training code can use a real model end to end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

__all__ = [
    "QWEN25_CHAT_TEMPLATE",
    "QWEN3_CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "make_tiny_model",
    "plain_logprobs",
    "student_and_frozen",
    "synthetic_rollout_batch",
    "tiny_corpus",
]

#: ChatML special tokens, in id order (ids 0, 1, 2 of the trained vocabulary).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# The pre-tokenisation regex of the Qwen2 / Qwen2.5 / Qwen3 tokenizers.
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Qwen2.5-Instruct style ChatML template (default system message when none is given).
QWEN25_CHAT_TEMPLATE: str = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"

#: Qwen3 style ChatML template (``<think>`` handling of assistant turns, ``enable_thinking``).
QWEN3_CHAT_TEMPLATE: str = "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if message.content is string %}\n        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n    {%- endif %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n        {%- if message.reasoning_content is string %}\n            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n            {%- if '</think>' in content %}\n                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or (not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}\n"

_TEMPLATES = {"qwen2.5": QWEN25_CHAT_TEMPLATE, "qwen3": QWEN3_CHAT_TEMPLATE}

_OBJECTS = (
    "apple",
    "bowl",
    "book",
    "bread",
    "butterknife",
    "candle",
    "cd",
    "cellphone",
    "cloth",
    "creditcard",
    "cup",
    "dishsponge",
    "egg",
    "fork",
    "glassbottle",
    "kettle",
    "keychain",
    "knife",
    "ladle",
    "lettuce",
    "mug",
    "newspaper",
    "pan",
    "pen",
    "pencil",
    "pillow",
    "plate",
    "pot",
    "potato",
    "remotecontrol",
    "saltshaker",
    "soapbar",
    "spatula",
    "spoon",
    "spraybottle",
    "statue",
    "tomato",
    "towel",
    "vase",
    "watch",
    "winebottle",
    "alarmclock",
    "box",
    "laptop",
)
_RECEPTACLES = (
    "armchair",
    "bed",
    "cabinet",
    "coffeemachine",
    "coffeetable",
    "countertop",
    "desk",
    "diningtable",
    "drawer",
    "dresser",
    "fridge",
    "garbagecan",
    "microwave",
    "shelf",
    "sidetable",
    "sinkbasin",
    "sofa",
    "stoveburner",
    "toilet",
    "bathtubbasin",
    "safe",
    "desklamp",
    "floorlamp",
    "handtowelholder",
    "toiletpaperhanger",
    "cart",
    "ottoman",
)
_PROMPT_TEXT = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: ",
    "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 "
    "observations and the corresponding actions you took: ",
    "You are now at step 4 and your current observation is: ",
    "Your admissible actions of the current situation are: ",
    "Now it's your turn to take an action.",
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags.",
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags.",
    "You are an expert autonomous agent operating in the WebShop e\u2011commerce environment.",
    "Now it's your turn to take one action for the current step.",
    "then think carefully which admissible action best advances the shopping goal.",
    "i need a long sleeve shirt in navy, size large, and price lower than 40.00 dollars",
    "search[<your query>] click[back to search] click[buy now] click[next >] [SEP] Instruction:",
    "[Privileged Skill Information] [End of Skill Information]",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
)


def tiny_corpus(seed: int = 0, n_episodes: int = 60) -> list[str]:
    """Deterministic ALFWorld-like training text for the tiny tokenizer.

    Commands, observations, prompt-template sentences, ``<think>``/``<action>`` responses and
    ChatML-formatted turns, generated from fixed word lists with a seeded RNG.
    """
    import random

    rng = random.Random(seed)
    lines: list[str] = list(_PROMPT_TEXT)
    for _ in range(n_episodes):
        obj = rng.choice(_OBJECTS)
        rec = rng.choice(_RECEPTACLES)
        dst = rng.choice(_RECEPTACLES)
        i, j = rng.randint(1, 9), rng.randint(1, 4)
        task = rng.choice(
            (
                f"put a {obj} in {dst}.",
                f"put some {obj} on {dst}.",
                f"put a clean {obj} in {dst}.",
                f"heat some {obj} and put it in {dst}.",
                f"cool some {obj} and put it in {dst}.",
                f"find two {obj} and put them in {dst}.",
                f"examine the {obj} with the desklamp.",
                f"look at {obj} under the desklamp.",
            )
        )
        seen = ", ".join(f"a {rng.choice(_RECEPTACLES)} {rng.randint(1, 6)}" for _ in range(5))
        cmds = [
            f"go to {rec} {j}",
            f"open {rec} {j}",
            f"close {rec} {j}",
            f"take {obj} {i} from {rec} {j}",
            f"put {obj} {i} in/on {dst} {j}",
            f"clean {obj} {i} with sinkbasin 1",
            f"heat {obj} {i} with microwave 1",
            f"cool {obj} {i} with fridge 1",
            f"use desklamp {j}",
            f"examine {obj} {i}",
            "look",
            "inventory",
        ]
        lines += [
            "-= Welcome to TextWorld, ALFRED! =-",
            f"You are in the middle of a room. Looking quickly around you, you see {seen}.",
            f"Your task is to: {task}",
            f"You arrive at {rec} {j}. On the {rec} {j}, you see a {obj} {i}.",
            f"You open the {rec} {j}. The {rec} {j} is open. In it, you see nothing.",
            f"You pick up the {obj} {i} from the {rec} {j}.",
            f"You heat the {obj} {i} using the microwave 1.",
            "Nothing happens.",
            "Your admissible actions of the current situation are: [" + "\n ".join(f"'{c}'" for c in cmds) + "].",
            f"[Observation {j}: 'You arrive at {rec} {j}.', Action {j}: 'go to {rec} {j}']",
            f"<think>The {obj} is probably in the {rec}. I should go there first.</think>\n"
            f"<action>{rng.choice(cmds)}</action>",
            f"<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ]
    return lines


# Pieces the BPE merges are *learned* within: Qwen's split with punctuation cut off the words
# (``'take``, ``>go`` -> ``'`` ``take``, ``>`` ``go``). Encoding uses Qwen's own split (the merges
# simply never join punctuation to a word), so an action reads the same tokens in the admissible
# list (``'take apple 1 ...'``) as in the response (``<action>take apple 1 ...``): a small model
# then copies it by matching tokens.
_TRAIN_SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\p{L}+|\p{N}|\s*[\r\n]+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+"


def _train_tokenizer(vocab_size: int, seed: int, corpus: Sequence[str] = ()):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def split(pattern: str):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = split(_TRAIN_SPLIT_PATTERN)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([*tiny_corpus(seed), *corpus], trainer=trainer)
    tok.pre_tokenizer = split(_QWEN_SPLIT_PATTERN)  # what a Qwen tokenizer.json declares
    return tok


def make_tiny_model(
    path: str | os.PathLike[str],
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    seed: int = 0,
    template: str = "qwen2.5",
    corpus: Sequence[str] = (),
    words: Sequence[str] = (),
) -> Path:
    """Write a tiny Qwen2-architecture causal LM with its tokenizer to ``path``.

    Args:
        path: output directory (created; existing model files in it are overwritten).
        vocab_size: target BPE vocabulary size (at least 300: 256 bytes + specials + merges);
            the embedding has exactly this many rows even if training learns fewer tokens.
        hidden_size: model width; ``hidden_size // num_heads`` must be at least 32 (vLLM's CPU
            attention rejects smaller head sizes).
        num_layers: decoder layers.
        num_heads: attention heads (also used as key/value heads).
        seed: seeds the corpus and the weight initialisation; same seed, same files.
        template: ``"qwen2.5"``, ``"qwen3"`` or the path of a ``.jinja`` chat template file.
        corpus: more tokenizer training text, after :func:`tiny_corpus` (e.g. the observations and
            commands of the games the model will play, so that their object and receptacle names
            become single tokens: a small model copies a name from its prompt far more easily
            when the name is one token).
        words: strings that become one token each wherever they occur (added, non-special tokens
            after the BPE vocabulary, which grows by their number), e.g. WebShop's product ids,
            which Qwen's pre-tokenizer otherwise cuts digit by digit. Non-empty, no whitespace,
            no duplicates.

    Returns:
        The model directory, loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``.
    """
    if vocab_size < 300:
        raise ValueError(f"vocab_size: expected at least 300, got {vocab_size}")
    if num_layers < 1:
        raise ValueError(f"num_layers: expected at least 1, got {num_layers}")
    if num_heads < 1 or hidden_size % num_heads:
        raise ValueError(f"num_heads: expected a positive divisor of hidden_size={hidden_size}, got {num_heads}")
    if hidden_size // num_heads < 32:
        raise ValueError(
            f"hidden_size/num_heads: expected a head size of at least 32, got "
            f"{hidden_size}/{num_heads} = {hidden_size // num_heads}"
        )
    if template in _TEMPLATES:
        chat_template = _TEMPLATES[template]
    elif os.path.isfile(template):
        chat_template = Path(template).read_text(encoding="utf-8")
    else:
        raise ValueError(f"template: expected 'qwen2.5', 'qwen3' or an existing .jinja file, got {template!r}")

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    if isinstance(corpus, str):
        raise TypeError("corpus: expected a sequence of strings, got one str")
    if isinstance(words, str):
        raise TypeError("words: expected a sequence of strings, got one str")
    words = list(words)
    bad = next((w for w in words if not isinstance(w, str) or not w or any(c.isspace() for c in w)), None)
    if bad is not None:
        raise ValueError(f"words: expected non-empty strings without whitespace, got {bad!r}")
    if len(set(words)) != len(words):
        raise ValueError("words: expected distinct strings, got duplicates")
    tok = _train_tokenizer(vocab_size, seed, corpus)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"vocab_size: trained {tok.get_vocab_size()} tokens > {vocab_size}")
    if words:
        from tokenizers import AddedToken

        # after every learned id: the BPE part stays what it would be without them
        tok.add_tokens([AddedToken(w, single_word=False, lstrip=False, rstrip=False, normalized=False) for w in words])
        vocab_size = max(vocab_size, tok.get_vocab_size())
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    # every added token (the specials, then ``words``) as tokenizer.json has it: transformers keeps
    # only the added tokens listed here
    added = {
        str(i): {
            "content": a.content,
            "lstrip": a.lstrip,
            "normalized": a.normalized,
            "rstrip": a.rstrip,
            "single_word": a.single_word,
            "special": a.special,
        }
        for i, a in sorted(tok.get_added_tokens_decoder().items())
    }
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "chat_template": chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    stale = out / "chat_template.jinja"
    if stale.exists():
        stale.unlink()

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    ).save_pretrained(out)
    return out


def synthetic_rollout_batch(
    num_groups: int = 4,
    group_size: int = 2,
    *,
    vocab_size: int = 1024,
    turns: tuple[int, int] = (1, 3),
    prompt_len: tuple[int, int] = (6, 20),
    response_len: tuple[int, int] = (1, 12),
    skill_len: int = 5,
    success_reward: float = 10.0,
    seed: int = 0,
):
    """A deterministic :class:`pcsd.rollout.loop.RolloutBatch` of random token ids (no generation):
    ``num_groups`` groups of ``group_size`` trajectories with a random number of turns, random
    prompt/response lengths, teacher prompts = ``skill_len`` extra tokens + the student prompt, and
    rewards drawn so that groups mix wins and losses; a row's anchor state is its turn (the
    trajectories of a group start alike: GiGPO's step groups), its step reward the trajectory's reward
    on its last turn. For trainer tests on a fixed batch."""
    import random as _random

    import torch

    from pcsd.rollout.loop import RolloutBatch

    if num_groups < 1 or group_size < 1:
        raise ValueError(f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}")
    rng = _random.Random(seed)
    tok = lambda n: [rng.randrange(3, vocab_size) for _ in range(n)]  # noqa: E731 (ids 0-2: specials)
    prompts, teachers, responses, lps, traj, turn = [], [], [], [], [], []
    n = num_groups * group_size
    won, length = [], []
    for t in range(n):
        k = rng.randint(*turns)
        for j in range(k):
            p = tok(rng.randint(*prompt_len))
            r = tok(rng.randint(*response_len))
            prompts.append(p)
            teachers.append(tok(skill_len) + p)
            responses.append(r)
            lps.append([-1.0] * len(r))
            traj.append(t)
            turn.append(j)
        won.append(rng.random() < 0.5)
        length.append(k)
    won_t = torch.tensor(won, dtype=torch.bool)
    traj_t = torch.tensor(traj, dtype=torch.int64)
    turn_t = torch.tensor(turn, dtype=torch.int64)
    last = turn_t == torch.tensor(length, dtype=torch.int64)[traj_t] - 1
    return RolloutBatch(
        prompt_ids=prompts,
        teacher_prompt_ids=teachers,
        response_ids=responses,
        behaviour_logprobs=lps,
        traj_id=traj_t,
        group_id=traj_t // group_size,
        turn=turn_t,
        action_valid=torch.ones(len(traj), dtype=torch.bool),
        actions=["look"] * len(traj),
        reward=won_t.to(torch.float32) * success_reward,
        won=won_t,
        length=torch.tensor(length, dtype=torch.int64),
        traj_group=torch.arange(n, dtype=torch.int64) // group_size,
        task_type=["pick_and_place_simple"] * n,
        task=["put a thing somewhere"] * n,
        anchor=turn_t.clone(),
        step_reward=torch.where(last, won_t.to(torch.float32)[traj_t] * success_reward, torch.zeros(len(traj))),
    )


def student_and_frozen(model_dir, perturb_frozen: float = 0.0, seed: int = 0):
    """``(student, frozen)``: the model of ``model_dir`` in float32 on the CPU, and a frozen copy
    (eval mode, no gradients) whose parameters are moved by ``perturb_frozen`` x N(0, 1) noise drawn
    with ``seed``, so that reference and teacher differ from the student (KL and gaps not 0)."""
    import copy

    import torch

    from pcsd.models import load_model

    student = load_model(model_dir, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(student).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in frozen.parameters():
            p.add_(perturb_frozen * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return student, frozen


def plain_logprobs(model, prompts, responses):
    """``[T]`` float32 log-probs of the packed response tokens, one unpacked sequence at a time with
    full logits and ``log_softmax`` (with the graph: differentiable): the plain reference of the
    trainer's packed, chunked scoring (:func:`pcsd.ops.scoring.score_packed`)."""
    import torch

    out = []
    for p, r in zip(prompts, responses):
        ids = torch.tensor([list(p) + list(r)])
        lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float(), -1)
        out.append(lp[torch.arange(len(p) - 1, len(p) - 1 + len(r)), torch.tensor(r)])
    return torch.cat(out)
