"""Teacher-quality alignment of token weights (the appendix's second diagnostic).

On expert trajectories (the native :class:`pcsd.envs.experts.ObservationExpert` on procedural
games, or recorded episodes from a file) every state-action pair is scored by one model in four
contexts: the student prompt (no skills), the teacher prompt (the task type's retrieved skills),
and two perturbed teacher prompts: skills *removed* (the student prompt) and a *shuffled* skill
(the skill block of another task type, drawn with a seed). The response is the warm-up's target
for the expert action, ``<think>…</think><action>ACTION</action>`` + end of turn
(:func:`pcsd.train.sft.think_for`).

Per pair and context: ``Q`` = the teacher's mean per-token probability of the expert action's
tokens (the ``ACTION`` text), ``W`` = a rule's mean weight on those tokens, the rule applied to
the gaps ``log pi_teacher - log pi_student`` of the whole response (its windows span the
response, as in training). Per rule and perturbation the result is Spearman's correlation
(scipy) of ``dQ = Q_perturbed - Q_original`` against ``dW = W_perturbed - W_original`` over the
pairs, and the least-squares line of dW on dQ. A rule whose weight follows the teacher's quality
gives a non-negative correlation (paper: PCSD 0.174 / 0.052, SDAR -0.489 / -0.208).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from pcsd.diagnostics.robustness import GapSet, spearman, token_weights
from pcsd.ops.weighting import available_rules, get_rule

__all__ = [
    "ExpertPair",
    "TASK_TYPE_EXAMPLES",
    "expert_pairs",
    "load_episodes",
    "score_contexts",
    "quality_alignment",
    "PERTURBATIONS",
    "PAPER_QUALITY_ALIGNMENT",
]

PERTURBATIONS = ("removed", "shuffled")
#: the paper's Figure "quality alignment" (Spearman of dQ vs dW: skills removed / shuffled)
PAPER_QUALITY_ALIGNMENT = {"pcsd": (0.174, 0.052), "sdar": (-0.489, -0.208)}

#: one task sentence per ALFWorld task type: what the shuffled-skill perturbation retrieves with
TASK_TYPE_EXAMPLES = {
    "pick_and_place_simple": "put a mug in desk.",
    "look_at_obj_in_light": "look at book under the desklamp.",
    "pick_clean_then_place_in_recep": "clean some apple and put it in fridge.",
    "pick_heat_then_place_in_recep": "heat some egg and put it in countertop.",
    "pick_cool_then_place_in_recep": "cool some tomato and put it in fridge.",
    "pick_two_obj_and_place": "find two pencil and put them in drawer.",
}


@dataclass
class ExpertPair:
    """One state-action pair of an expert episode, as prompt requests and response pieces."""

    request: dict  # task, observation, admissible, history, step (a PromptBuilder request)
    task_type: str
    action: str
    episode: int


def load_episodes(path: str | Path) -> list:
    """Recorded episodes: a JSON list or JSON lines of ``{"task", "task_type", "steps": [[obs,
    admissible, action], ...]}`` (:class:`pcsd.envs.experts.ExpertEpisode`'s fields)."""
    from pcsd.envs.experts import ExpertEpisode

    text = Path(path).read_text()
    items = (
        json.loads(text)
        if text.lstrip().startswith("[")
        else [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    )
    out = []
    for i, it in enumerate(items):
        try:
            out.append(
                ExpertEpisode(
                    task=it["task"],
                    task_type=it.get("task_type", ""),
                    steps=[(s[0], list(s[1]), s[2]) for s in it["steps"]],
                    won=bool(it.get("won", False)),
                )
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(
                f"{path}: episode {i} is not {{task, task_type, steps: [[obs, admissible, action]]}}: {exc}"
            ) from None
    return out


def expert_pairs(episodes: Sequence, max_pairs: int = 0) -> list[ExpertPair]:
    """Every step of the episodes as an :class:`ExpertPair` (history = the episode's earlier
    observation-action pairs), at most ``max_pairs`` (0: all)."""
    from pcsd.text.prompts import classify_alfworld_task

    pairs = []
    for e, ep in enumerate(episodes):
        tt = ep.task_type or classify_alfworld_task(ep.task) or ""  # "": no task type matched
        hist: list[tuple[str, str]] = []
        for obs, adm, action in ep.steps:
            pairs.append(
                ExpertPair(
                    dict(
                        task=ep.task,
                        observation=obs,
                        admissible=list(adm),
                        history=list(hist),
                        step=len(hist),
                        task_type=tt,  # a text env's skills are retrieved by its reported type
                    ),
                    tt,
                    action,
                    e,
                )
            )
            hist.append((obs, action))
            if max_pairs and len(pairs) >= max_pairs:
                return pairs
    return pairs


def _skill_prefix(builder, task: str, req: dict) -> str:
    """The text the teacher prompt puts before the student prompt for ``task``'s type."""
    args = (req["observation"], req["admissible"], req["history"], req["step"])
    s = builder.build(task, *args)
    t = builder.build_teacher(task, *args)
    if not t.endswith(s):
        raise RuntimeError("the teacher prompt does not end with the student prompt")
    return t[: len(t) - len(s)]


@dataclass
class Scored:
    """Per context: ``[T]`` log-probs of the packed responses; ``cu_seqlens`` and the action spans."""

    logp: dict  # context -> np.ndarray [T]
    cu_seqlens: np.ndarray
    action_mask: np.ndarray  # [T] bool: the tokens of the expert action text
    task_types: list = field(default_factory=list)
    shuffled_types: list = field(default_factory=list)


def score_contexts(
    model, builder, pairs: Sequence[ExpertPair], eos: int, seed: int = 0, tokens_per_pass: int = 8192
) -> Scored:
    """Scores every pair's response under the contexts ``student``, ``teacher``, ``removed``
    (= the student prompt) and ``shuffled`` (another task type's skills, drawn with ``seed``; with
    a builder that reads a skills folder, the folder's skills of another task of the pairs whose
    retrieved skills differ, and ``shuffled_types`` holds that task)."""
    from pcsd.ops.scoring import score_packed
    from pcsd.train.sft import think_for

    if not pairs:
        raise ValueError("no expert pairs to score")
    rng = random.Random(seed)
    reqs = [p.request for p in pairs]
    student = builder.encode_batch(reqs)
    teacher = builder.encode_batch(reqs, teacher=True)
    shuffled_texts, shuffled_types = [], []
    types = sorted(TASK_TYPE_EXAMPLES)
    repo = getattr(builder, "skills", None)  # a user's skill folder (env.skills_dir), else the built-in skills
    tasks = sorted({(p.request["task"], p.task_type) for p in pairs})
    for p in pairs:
        r = p.request
        s = builder.build(r["task"], r["observation"], r["admissible"], r["history"], r["step"])
        if repo is None:  # another task type's skills
            other = rng.choice([t for t in types if t != p.task_type])
            shuffled_types.append(other)
            shuffled_texts.append(_skill_prefix(builder, TASK_TYPE_EXAMPLES[other], r) + s)
        else:  # the skills the folder retrieves for another task of the episodes, when they differ
            own = repo.retrieve(r["task"], p.task_type)
            others = [t for t in tasks if repo.retrieve(*t) != own]
            if not others:
                raise ValueError(
                    f"skills folder {str(repo.folder)!r} retrieves the same skills for every task "
                    "of these episodes: nothing to shuffle"
                )
            other = rng.choice(others)
            shuffled_types.append(other[1] if builder.env == "text" else other[0])
            shuffled_texts.append(repo.block(*other) + s)
    shuffled = builder.encode_chat(shuffled_texts)
    tok = builder.tokenizer
    responses, spans = [], []
    for p in pairs:
        think = think_for(p.request["task"], p.action, builder.env == "text")  # as the warm-up's targets
        head = tok.encode(f"<think>{think}</think><action>")
        act = tok.encode(p.action)
        tail = tok.encode("</action>") + [eos]
        responses.append(head + act + tail)
        spans.append((len(head), len(head) + len(act)))
    logp = {}
    with torch.no_grad():
        for name, prompts in (("student", student), ("teacher", teacher), ("shuffled", shuffled)):
            lps = score_packed(model, prompts, responses, max_tokens_per_pass=tokens_per_pass)
            logp[name] = torch.cat(lps).float().cpu().numpy()
    logp["removed"] = logp["student"].copy()  # the teacher without skills sees the student prompt
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    amask = np.zeros(int(cu[-1]), dtype=bool)
    for i, (a, b) in enumerate(spans):
        amask[cu[i] + a : cu[i] + b] = True
    return Scored(logp, cu, amask, [p.task_type for p in pairs], shuffled_types)


def teacher_gapset(sc: Scored) -> GapSet:
    """The teacher-with-skills minus student gaps of the scored responses (every token valid)."""
    gap = sc.logp["teacher"] - sc.logp["student"]
    return GapSet(gap, np.ones_like(gap, dtype=bool), sc.cu_seqlens, source="expert trajectories scored with skills")


def _span_means(x: np.ndarray, cu: np.ndarray, amask: np.ndarray) -> np.ndarray:
    seg = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    s = np.bincount(seg[amask], weights=x[amask], minlength=cu.size - 1)
    c = np.bincount(seg[amask], minlength=cu.size - 1)
    return s / np.maximum(c, 1)


def quality_alignment(sc: Scored, rules: Optional[Iterable[str]] = None) -> dict:
    """dQ, dW, Spearman and the linear fit per rule and perturbation (see the module docstring).
    Returns ``{"rules": {rule: {perturbation: {"spearman", "slope", "intercept", "dW": [...]}}},
    "dQ": {perturbation: [...]}, "Q": {context: mean}, ...}``."""
    rules = list(rules) if rules is not None else available_rules()
    cu, am = sc.cu_seqlens, sc.action_mask
    valid = np.ones_like(sc.logp["student"], dtype=bool)
    Q = {c: _span_means(np.exp(sc.logp[c]), cu, am) for c in ("student", "teacher", "removed", "shuffled")}
    dQ = {p: Q[p] - Q["teacher"] for p in PERTURBATIONS}
    out: dict = {}
    for r in rules:
        W = {}
        for c in ("teacher",) + PERTURBATIONS:
            gap = sc.logp[c] - sc.logp["student"]
            W[c] = _span_means(token_weights(r, gap, valid, cu), cu, am)
        out[r] = {}
        for p in PERTURBATIONS:
            dW = W[p] - W["teacher"]
            rho = spearman(dQ[p], dW)
            if np.ptp(dQ[p]) > 0 and np.ptp(dW) > 0:
                slope, intercept = (float(v) for v in np.polyfit(dQ[p], dW, 1))
            else:
                slope, intercept = float("nan"), float("nan")
            out[r][p] = dict(
                spearman=rho,
                slope=slope,
                intercept=intercept,
                dW=[float(v) for v in dW],
                dW_mean=float(dW.mean()),
                W_original_mean=float(W["teacher"].mean()),
            )
    gap = sc.logp["teacher"] - sc.logp["student"]
    return dict(
        rules=out,
        dQ={p: [float(v) for v in dQ[p]] for p in PERTURBATIONS},
        Q_mean={c: float(v.mean()) for c, v in Q.items()},
        num_pairs=int(cu.size - 1),
        num_tokens=int(cu[-1]),
        gap_mean=float(gap.mean()),
        gap_action_mean=float(gap[am].mean()) if am.any() else float("nan"),
        kinds={r: get_rule(r).kind for r in rules},
    )
