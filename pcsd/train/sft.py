"""Supervised warm-up on expert trajectories: what makes RL start with signal on the tiny presets.

A randomly initialised model never wins a game, so GRPO would see only zero rewards. The tiny
presets therefore first imitate :class:`pcsd.envs.experts.ObservationExpert` (an expert that acts only
on what the agent has observed) on procedural games the run never evaluates on:

1. :func:`expert_episodes` plays the warm-up games with the expert;
2. :func:`game_corpus` turns those episodes into tokenizer training text, so that the generated
   model's BPE vocabulary holds every object and receptacle name as one token (a small model
   copies a one-token name from its prompt far sooner than a name split into letters);
3. :func:`sft_examples` renders every expert step as the student would see it (the appendix
   prompt with history, chat template, token ids) with the target response
   ``<think>...</think><action>...</action><|im_end|>``;
4. :func:`sft_warmup` minimises the response NLL (plus optionally ``prompt_weight`` x the prompt
   tokens' next-token NLL) with AdamW, a linear warm-up and a cosine decay of the learning rate.
"""

from __future__ import annotations

import math
import random
import re
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from pcsd.envs.experts import ExpertEpisode, expert_episodes, skill_search_first
from pcsd.ops.scoring import score_packed
from pcsd.train.optim import make_adamw

if TYPE_CHECKING:
    from pcsd.text.prompts import EnvName

__all__ = [
    "expert_episodes",
    "skill_search_first",
    "game_corpus",
    "task_parts",
    "think_for",
    "sft_examples",
    "sft_target",
    "longest_target",
    "lr_factor",
    "sft_warmup",
    "SCHEDULES",
]

#: learning-rate schedules of the warm-up
SCHEDULES = ("cosine", "constant")


def game_corpus(episodes: Sequence[ExpertEpisode], skills=None, env: Optional[EnvName] = None) -> list[str]:
    r"""Tokenizer training text from played episodes: each task, observation and action, each
    admissible list written the way the prompts of the family ``env`` list them
    (:meth:`pcsd.text.formats.TextFormat.action_list`; default: the default env kind's), and the
    skills the teacher prompts prepend (so they cost fewer tokens): the built-in skills of each
    task's key (:meth:`~pcsd.text.formats.TextFormat.skill_key`), or with ``skills``, a
    :class:`pcsd.text.prompts.SkillRepository`, every file of that folder."""
    from pcsd.envs import registry
    from pcsd.text.formats import text_format
    from pcsd.text.prompts import retrieve_skills

    env = env or registry.default().prompt
    fmt = text_format(env)

    lines: list[str] = []
    if skills is not None:
        lines += [t for t in (skills.general, *skills.task_types.values(), *skills.keywords.values()) if t]
    else:
        seen: set[str] = set()  # one block per key (ALFWorld: a task type; WebShop: a task's product category)
        for ep in episodes:
            key = fmt.skill_key(ep.task, ep.task_type)
            if key not in seen:
                seen.add(key)
                text = retrieve_skills(ep.task, env=env)
                if text not in lines:
                    lines.append(text)
    for ep in episodes:
        lines.append(f"Your task is to: {ep.task}")
        for obs, adm, action in ep.steps:
            lines.append(obs)
            lines.append(fmt.action_list(adm))
            lines.append(f"<action>{action}</action>")
    return lines


# ALFWorld's task sentences (the 12 templates of the six task types): object, then target
_TASK_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"^look at (\w+) under the (\w+)",
        r"^examine the (\w+) with the (\w+)",
        r"^(?:clean|heat|cool) some (\w+) and put it (?:in|on) (\w+)",
        r"^find two (\w+) and put them (?:in|on) (\w+)",
        r"^put (?:a|some|two) (?:(?:clean|hot|cool) )?(\w+) (?:in|on) (\w+)",
    )
)


def task_parts(task: str) -> Optional[tuple[str, str]]:
    """``(object, target)`` of an ALFWorld task sentence (``"put a hot apple in fridge."`` ->
    ``("apple", "fridge")``; look tasks: the lamp is the target), None for other text."""
    for pat in _TASK_PATTERNS:
        m = pat.match(task.strip())
        if m:
            return m.group(1), m.group(2)
    return None


def think_for(task: str, action: str, restate_task: bool = False) -> str:
    """The reasoning text of the SFT targets: the task's object and target, then the kind of the
    next step (``"apple to fridge. Next: take."``). Short on purpose: every token is generated at
    every turn of every rollout, and on a CPU generation is the larger part of the default's time.
    Naming the object and target at every step is what a small model needs: the action then copies
    them from a few tokens back instead of from the task line far up the prompt. A task that is not
    an ALFWorld sentence (WebShop, a text env) gets only the kind of step, or with
    ``restate_task`` (a text env's demonstrations) the task itself when it is one short line (at most
    :data:`RESTATED_WORDS` words: a game's whole prompt restated would cost its length in every
    response)."""
    verb = re.split(r"[\s\[]", action, maxsplit=1)[0]  # ALFWorld "take ...", WebShop "click[...]"
    parts = task_parts(task)
    if parts:
        return f"{parts[0]} to {parts[1]}. Next: {verb}."
    # a text env's short task, restated (``restate_task``): the action then copies its words from a
    # few tokens back, as the ALFWorld reasoning lets it copy the object and target
    short = "\n" not in task.strip() and len(task.split()) <= RESTATED_WORDS
    return f"{task.strip().rstrip('.')}. Next: {verb}." if restate_task and short else f"Next: {verb}."


#: the longest task (in words) the warm-up's reasoning restates
RESTATED_WORDS = 24


def sft_target(task: str, action: str, restate_task: bool = False) -> str:
    """The response a warm-up example teaches for one expert step (before the end of turn):
    ``<think>`` + :func:`think_for` + ``</think><action>`` + the action + ``</action>``."""
    return f"<think>{think_for(task, action, restate_task)}</think><action>{action}</action>"


def longest_target(builder, episodes: Sequence[ExpertEpisode]) -> tuple[int, str]:
    """``(tokens, text)`` of the longest warm-up target of ``episodes`` under ``builder``'s tokenizer,
    the end of turn included (what ``rollout.max_response_tokens`` must hold)."""
    restate = builder.env == "text"
    best = (0, "")
    for ep in episodes:
        for _, _, action in ep.steps:
            text = sft_target(ep.task, action, restate)
            n = len(builder.tokenizer.encode(text)) + 1
            if n > best[0]:
                best = (n, text)
    return best


def sft_examples(
    builder,
    episodes: Sequence[ExpertEpisode],
    eos_id: int,
    teacher_share: float = 0.0,
    seed: int = 0,
    teacher_episodes: Optional[Sequence[ExpertEpisode]] = None,
) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, response ids)`` for every expert step, the prompt built exactly as in a
    rollout (``builder``: :class:`pcsd.text.prompts.PromptBuilder`; history = the episode's earlier
    observation-action pairs), the response ``<think>…</think><action>…</action>`` + ``eos_id``.

    ``teacher_share`` (0..1): for that share of the steps (drawn with ``seed``) one more example
    with the teacher's prompt (skills prepended) and the same response, so that a generated model
    also learns to act with the skills in its context - the frozen teacher of PCSD is this model
    reading those prompts.

    ``teacher_episodes`` (optional): the teacher's-prompt examples come from these episodes
    instead (each of their steps with probability ``teacher_share``), e.g. the expert that follows
    the skills (``optim.sft_teacher_demos=skills``); the student's examples are unchanged."""
    if not 0.0 <= teacher_share <= 1.0:
        raise ValueError(f"teacher_share: expected a number in [0, 1], got {teacher_share}")
    rng = random.Random(seed)
    restate = builder.env == "text"  # the reasoning of a text env's demonstrations restates its task
    reqs, resps, with_teacher = [], [], []
    for ep in episodes:
        hist: list[tuple[str, str]] = []
        for obs, adm, action in ep.steps:
            # the task type: a text env's teacher prompt retrieves that type's skills by it
            reqs.append(
                dict(
                    task=ep.task, observation=obs, admissible=adm, history=hist, step=len(hist), task_type=ep.task_type
                )
            )
            text = sft_target(ep.task, action, restate)
            resps.append(builder.tokenizer.encode(text) + [eos_id])
            with_teacher.append(teacher_share > 0 and rng.random() < teacher_share)
            hist = hist + [(obs, action)]
    student = builder.encode_batch(reqs)
    if teacher_episodes is not None:
        t_reqs, t_resps = [], []
        for ep in teacher_episodes:
            hist = []
            for obs, adm, action in ep.steps:
                if teacher_share > 0 and rng.random() < teacher_share:
                    t_reqs.append(
                        dict(
                            task=ep.task,
                            observation=obs,
                            admissible=adm,
                            history=hist,
                            step=len(hist),
                            task_type=ep.task_type,
                        )
                    )
                    text = sft_target(ep.task, action, restate)
                    t_resps.append(builder.tokenizer.encode(text) + [eos_id])
                hist = hist + [(obs, action)]
        out = list(zip(student, resps))
        out += list(zip(builder.encode_batch(t_reqs, teacher=True), t_resps)) if t_reqs else []
        random.Random(seed + 1).shuffle(out)
        return out
    teacher = iter(builder.encode_batch([r for r, t in zip(reqs, with_teacher) if t], teacher=True))
    out = []
    for ids, resp, t in zip(student, resps, with_teacher):
        out.append((ids, resp))
        if t:
            out.append((next(teacher), resp))
    return out


def lr_factor(step: int, steps: int, schedule: str = "cosine", warmup_frac: float = 0.05) -> float:
    """Multiplier of the peak learning rate at ``step`` (0-based) of ``steps``: ``cosine`` = linear
    warm-up over the first ``warmup_frac`` of the steps, then a cosine decay towards 0 (the last
    step gets a small positive rate); ``constant`` = 1."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if schedule == "constant":
        return 1.0
    warm = max(1, int(round(warmup_frac * steps)))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1.0 + math.cos(math.pi * (step - warm + 1) / (steps - warm + 1)))


def sft_warmup(
    model,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    lr: float,
    batch_size: int = 16,
    seed: int = 0,
    prompt_weight: float = 0.0,
    schedule: str = "cosine",
    tokens_per_pass: int = 8192,
    progress: Optional[Callable[[int, int, float], object]] = None,
) -> list[float]:
    """``steps`` AdamW steps on batches of ``batch_size`` examples drawn with replacement (seeded).

    Loss: mean NLL of the response tokens + ``prompt_weight`` x mean next-token NLL of the prompt
    tokens (language modelling on the prompts themselves: they repeat the room's names -
    observation, history, admissible list - which teaches a small model to copy names from its
    context far sooner than the ~15 response tokens per example alone). Gradients clipped to 1.
    Returns the loss of every step; the model is left in eval mode."""
    if prompt_weight < 0:
        raise ValueError(f"prompt_weight: expected >= 0, got {prompt_weight}")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    if not examples:
        raise ValueError("examples is empty: the expert produced no SFT examples (no game, or env.max_steps too small)")
    lr_factor(0, max(steps, 1), schedule)  # validates the schedule name
    rng = random.Random(seed)
    opt = make_adamw(model.parameters(), lr=lr, device=next(model.parameters()).device)
    model.train()
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * lr_factor(step, steps, schedule)
        chunk = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        if prompt_weight > 0:  # score every token after the first; split prompt | response
            lps = score_packed(
                model,
                [c[0][:1] for c in chunk],
                [list(c[0][1:]) + list(c[1]) for c in chunk],
                max_tokens_per_pass=tokens_per_pass,
            )
            resp = torch.cat([lp[len(c[0]) - 1 :] for lp, c in zip(lps, chunk)])
            prompt = torch.cat([lp[: len(c[0]) - 1] for lp, c in zip(lps, chunk)])
            loss = -resp.mean() - prompt_weight * prompt.mean()
        else:
            lps = score_packed(model, [c[0] for c in chunk], [c[1] for c in chunk], max_tokens_per_pass=tokens_per_pass)
            loss = -torch.cat(lps).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(step + 1, steps, losses[-1])
    model.eval()
    return losses
