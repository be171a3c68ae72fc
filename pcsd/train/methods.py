"""The methods of the paper's Table 1 (and its ablation table), each a set of config overrides.

``python -m pcsd.train preset=alfworld-qwen2.5-3b method=sdar`` applies the preset, then the
method's overrides, then the remaining command-line overrides (so ``method=pcsd
algo.lambda_distill=0.005`` is the lambda ablation). The resolved config records ``method``.

==================  ==========================================================================
method              what it sets
==================  ==========================================================================
vanilla             no training (``optim.steps=0``): evaluate the base model, no skills
skill-prompt        Skill-Prompt*: vanilla with the skills in the prompt at evaluation
grpo                GRPO alone (no teacher scoring)
skill-grpo          Skill-GRPO: GRPO with the skills in the *student's* training prompts
opsd                OPSD: distillation only (no GRPO term), sigmoid gate beta_gate = 5 (``sdar``
                    rule), lambda 0.01 -- the appendix's method table
grpo+opsd           GRPO + distillation with constant weights (``uniform``: the gate at beta = 0)
rlsd                RLSD: GRPO with the teacher-gap advantage transform (lambda 0.5 -> 0)
skill-sd            Skill-SD: GRPO (advantages unchanged) + lambda 0.001 x the token-mean of the
                    k3 self-distillation loss times the on-policy ratio (``rule=skill-sd``)
sdar                SDAR: GRPO + pointwise sigmoid-gated distillation
pcsd                PCSD (the paper): GRPO + persistent-consistency weights, lambda 0.01
pcsd-fixed-n1       ablation: fixed window N = 1 (``algo.pcsd.n_min=1``)
pcsd-fixed-n4       ablation: fixed window N = 4 (``algo.pcsd.n_min=4``)
pcsd-no-trend       ablation: no trend modulation (eta = 1)
pcsd-no-decay       ablation: uniform weights inside the windows (``algo.pcsd.alpha=1``)
NAME-star           every trained method above with the skills at evaluation too (the starred
                    variants, e.g. ``skill-grpo-star`` = Skill-GRPO*); ``NAME*`` is accepted
==================  ==========================================================================

Skill-SD follows the public SDAR code (``verl/trainer/ppo/skillsd_utils.py``: ``compute_sdl_loss``;
``examples/skillsd_trainer``: ``sdl_lambda=0.001``, ``warmdown_steps=-1`` i.e. a constant lambda,
``loss_agg_mode=token-mean``, keyword-retrieved skills of the task's type). The SDAR code has no
starred Skill-SD: ``skill-sd-star`` is this project's convention (the skills at evaluation, like
every ``NAME-star``). One difference is kept on purpose: SDAR's trainers score the teacher with
the *current* actor (its RLSD, Skill-SD and SDAR alike); here every method uses the preset's
``algo.teacher`` (``frozen``, as the paper states), and ``algo.teacher=current`` reproduces SDAR.

Every method sets all of ``algo.grpo``, ``algo.distill``, ``algo.student_skills``, ``eval.skills``
and ``rule`` (the method fully determines them); other keys come from the preset.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "available_methods", "method_overrides", "canonical_method"]

_BASE: dict[str, Any] = {"algo.grpo": True, "algo.distill": True, "algo.student_skills": False,
                         "eval.skills": False, "rule": "pcsd"}


def _m(doc: str, **kw: Any) -> dict[str, Any]:
    ov = dict(_BASE)
    ov.update({k.replace("__", "."): v for k, v in kw.items()})
    return {"doc": doc, "overrides": ov}


_TRAINED: dict[str, dict[str, Any]] = {
    "grpo": _m("GRPO alone", algo__distill=False),
    "skill-grpo": _m("Skill-GRPO: the student sees the skills in training", algo__distill=False,
                     algo__student_skills=True),
    "opsd": _m("OPSD: distillation only, sigmoid gate beta_gate=5", algo__grpo=False, rule="sdar",
               algo__lambda_distill=0.01),
    "grpo+opsd": _m("GRPO + distillation with constant weights", rule="uniform"),
    "rlsd": _m("RLSD: teacher-gap advantage transform", rule="rlsd"),
    "skill-sd": _m("Skill-SD: GRPO + lambda 0.001 x token-mean k3 self-distillation loss", rule="skill-sd",
                   algo__lambda_distill=0.001),
    "sdar": _m("SDAR: pointwise sigmoid-gated distillation", rule="sdar"),
    "pcsd": _m("PCSD: persistent-consistency weights", rule="pcsd"),
    "pcsd-fixed-n1": _m("PCSD ablation: fixed window N=1", rule="pcsd-fixed-n1", algo__pcsd__n_min=1),
    "pcsd-fixed-n4": _m("PCSD ablation: fixed window N=4", rule="pcsd-fixed-n4", algo__pcsd__n_min=4),
    "pcsd-no-trend": _m("PCSD ablation: no trend modulation", rule="pcsd-no-trend"),
    "pcsd-no-decay": _m("PCSD ablation: no exponential decay", rule="pcsd-no-decay", algo__pcsd__alpha=1.0),
}

METHODS: dict[str, dict[str, Any]] = {
    "vanilla": _m("no training: evaluate the base model", optim__steps=0, algo__distill=False),
    "skill-prompt": _m("Skill-Prompt*: no training, skills at evaluation", optim__steps=0,
                       algo__distill=False, eval__skills=True),
    **_TRAINED,
    **{f"{k}-star": {"doc": v["doc"] + "; skills at evaluation (*)",
                     "overrides": {**v["overrides"], "eval.skills": True}} for k, v in _TRAINED.items()},
}


def available_methods() -> list[str]:
    return list(METHODS)


def canonical_method(name: str) -> str:
    """``NAME*`` -> ``NAME-star``; ValueError listing the valid names for an unknown one."""
    key = name[:-1] + "-star" if name.endswith("*") else name
    if key not in METHODS:
        raise ValueError(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")
    return key


def method_overrides(name: str) -> dict[str, Any]:
    """The dotted-key overrides of a method (a copy)."""
    return dict(METHODS[canonical_method(name)]["overrides"])
