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
opsd                OPSD: distillation only (no policy-gradient term; the KL penalty to the
                    reference stays, as in the SDAR code's OPSD), sigmoid gate (``sdar`` rule,
                    ``algo.pcsd.beta_gate`` = 5), lambda 0.01 -- the appendix's method table
grpo+opsd           GRPO + distillation with constant weights (``uniform``: the gate at
                    beta_gate = 0 by definition, the table's 0.0; ``algo.pcsd.beta_gate`` unused)
rlsd                RLSD: GRPO with the teacher-gap advantage transform (lambda 0.5 -> 0 over
                    100 updates, 0.495 at the first, as the public code)
skill-sd            Skill-SD: GRPO (advantages unchanged) + lambda 0.001 x the token-mean of the
                    k3 self-distillation loss times the on-policy ratio (``rule=skill-sd``)
sdar                SDAR: GRPO + pointwise sigmoid-gated distillation, as the public SDAR code
sdar-norm           SDAR with normalised weights: the gates divided by their mean over each
                    response's valid tokens (the paper's reading of SDAR; ``rule=sdar-norm``)
agentopsd           AgentOPSD: GRPO with its turn-level belief multiplier on the advantage (the
                    summed gap per turn, a belief from the group's success rate, its standardised
                    change, a clipped multiplier; ``rule=agentopsd``, no distillation term)
sdpo                SDPO: the sampled-token self-distillation loss (importance weight capped at 2)
                    alone, lambda 1, the teacher given a peer's success
                    (``algo.teacher_context=group-success``); ``algo.grpo=true`` adds GRPO
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

AgentOPSD follows the public code (``verl/trainer/ppo/opsd_utils.py``: ``compute_opsd_turn_advantage``;
``run_alfworld_3b.sh``: turn granularity, ``belief_mult`` and ``signed`` on, ``mult_lambda=0.5``,
``mult_band=0.2``), SDPO the public SDPO code (``compute_self_distillation_loss`` with
``full_logit_distillation=False``, ``is_clip=2``, ``dont_reprompt_on_self_success``) and TRL's
``SDPOConfig`` (``distillation_weight=1``: distillation alone); where pcsd differs:
``docs/estimators.md``, "AgentOPSD and SDPO".

Every method sets all of ``algo.grpo``, ``algo.distill``, ``algo.student_skills``, ``eval.skills``
and ``rule`` (the method fully determines them); other keys come from the preset. ``algo.grpo``
switches the policy-gradient term only: the KL penalty (``algo.kl_beta``) applies to every
trained method, OPSD included.

The gate sharpness is one setting, ``algo.pcsd.beta_gate``, read by every gated rule (``pcsd``
and its ablations, ``sdar``, ``sdar-norm``; 5.0 in the paper's tables). :func:`unused_keys` names
the method keys that have no effect under a config (e.g. ``algo.pcsd.gamma`` under ``sdar``,
``algo.lambda_distill`` under ``grpo`` or ``rlsd``, ``algo.clip_eps`` under ``opsd``, the
``algo.gigpo.*`` keys under another ``algo.estimator``, ``rollout.max_sample_batches`` without
``rollout.dynamic_sampling``); :mod:`pcsd.train.config` warns once about each such key the user
or the preset set.

The advantage estimator (``algo.estimator``: grpo, rloo, gigpo) and the policy loss
(``algo.policy_loss``: ppo, gspo) are not part of a method: every method with a policy-gradient
term trains with any of them (``method=pcsd algo.estimator=gigpo`` is GiGPO + PCSD; under ``rlsd``
the RLSD transform applies to the chosen estimator's advantages), see ``docs/estimators.md``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "available_methods", "method_overrides", "canonical_method", "unused_keys"]

_BASE: dict[str, Any] = {
    "algo.grpo": True,
    "algo.distill": True,
    "algo.student_skills": False,
    "eval.skills": False,
    "rule": "pcsd",
}


def _m(doc: str, **kw: Any) -> dict[str, Any]:
    ov = dict(_BASE)
    ov.update({k.replace("__", "."): v for k, v in kw.items()})
    return {"doc": doc, "overrides": ov}


_TRAINED: dict[str, dict[str, Any]] = {
    "grpo": _m("GRPO alone", algo__distill=False),
    "skill-grpo": _m(
        "Skill-GRPO: the student sees the skills in training", algo__distill=False, algo__student_skills=True
    ),
    "opsd": _m(
        "OPSD: distillation only, sigmoid gate beta_gate=5", algo__grpo=False, rule="sdar", algo__lambda_distill=0.01
    ),
    "grpo+opsd": _m("GRPO + distillation with constant weights (the gate at beta_gate=0)", rule="uniform"),
    "rlsd": _m("RLSD: teacher-gap advantage transform", rule="rlsd"),
    "skill-sd": _m(
        "Skill-SD: GRPO + lambda 0.001 x token-mean k3 self-distillation loss",
        rule="skill-sd",
        algo__lambda_distill=0.001,
    ),
    "sdar": _m("SDAR: pointwise sigmoid-gated distillation", rule="sdar"),
    "sdar-norm": _m("SDAR with normalised weights: gates / their mean over the response", rule="sdar-norm"),
    "agentopsd": _m("AgentOPSD: GRPO with the turn-level belief multiplier on the advantage", rule="agentopsd"),
    "sdpo": _m(
        "SDPO: sampled-token self-distillation alone, a peer's success as the teacher's context",
        algo__grpo=False,
        rule="sdpo",
        algo__lambda_distill=1.0,
        algo__teacher_context="group-success",
    ),
    "pcsd": _m("PCSD: persistent-consistency weights", rule="pcsd"),
    "pcsd-fixed-n1": _m("PCSD ablation: fixed window N=1", rule="pcsd-fixed-n1", algo__pcsd__n_min=1),
    "pcsd-fixed-n4": _m("PCSD ablation: fixed window N=4", rule="pcsd-fixed-n4", algo__pcsd__n_min=4),
    "pcsd-no-trend": _m("PCSD ablation: no trend modulation", rule="pcsd-no-trend"),
    "pcsd-no-decay": _m("PCSD ablation: no exponential decay", rule="pcsd-no-decay", algo__pcsd__alpha=1.0),
}

METHODS: dict[str, dict[str, Any]] = {
    "vanilla": _m("no training: evaluate the base model", optim__steps=0, algo__distill=False),
    "skill-prompt": _m(
        "Skill-Prompt*: no training, skills at evaluation", optim__steps=0, algo__distill=False, eval__skills=True
    ),
    **_TRAINED,
    **{
        f"{k}-star": {
            "doc": v["doc"] + "; skills at evaluation (*)",
            "overrides": {**v["overrides"], "eval.skills": True},
        }
        for k, v in _TRAINED.items()
    },
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


def _estimator_keys(cfg) -> dict[str, str]:
    """The estimator keys without effect under a config with a policy-gradient term: ``algo.gigpo.*``
    under another estimator, ``algo.gigpo.gamma`` without the step advantage, ``algo.adv_eps`` where
    nothing is divided by a std."""
    from pcsd.ops.estimators import get_estimator

    algo = cfg.algo
    est = get_estimator(algo.estimator)
    out: dict[str, str] = {}
    for k in algo.gigpo:
        if k not in est.defaults:
            out[f"algo.gigpo.{k}"] = f"read only by algo.estimator=gigpo (the config has algo.estimator={est.name})"
    if "gamma" in est.defaults and algo.gigpo.step_weight == 0:
        out["algo.gigpo.gamma"] = "algo.gigpo.step_weight=0: no step-level advantage, no step returns"
    if not est.uses_eps or ("norm" in est.defaults and algo.gigpo.norm == "mean"):
        why = "algo.gigpo.norm=mean subtracts the mean only" if est.uses_eps else f"estimator {est.name} has no std"
        out["algo.adv_eps"] = f"{why}: nothing is divided by a std"
    return out


def unused_keys(cfg) -> dict[str, str]:
    """``{key: why}`` for the method keys that have no effect on the update under ``cfg`` (its
    ``rule``, ``algo.grpo`` and ``algo.distill``), as if it trains (``optim.steps`` is not looked at).

    ``algo.kl_beta`` always has an effect (every trained method keeps the KL penalty); a rule reads
    the ``algo.pcsd`` keys among its parameters (``pcsd.ops.weighting.WeightRule.defaults``) and
    those that define it (``pins``)."""
    from pcsd.ops.weighting import active_rule, get_rule

    algo = cfg.algo
    rule = get_rule(cfg.rule)
    active = active_rule(cfg.rule, bool(algo.distill))  # what the update runs (pcsd.ops.weighting)
    on = active is rule  # algo.distill=false turns a distillation rule off
    no_distill = "no distillation term (algo.distill=false)"
    out: dict[str, str] = {}
    if not on:
        out["rule"] = no_distill
    if not active.needs_teacher:
        out["algo.teacher"] = no_distill if not on else f"rule {rule.name} scores no teacher"
        out["algo.teacher_context"] = out["algo.teacher_context_tokens"] = out["algo.teacher"]
    elif algo.get("teacher_context", "env") != "group-success":
        out["algo.teacher_context_tokens"] = "read only with algo.teacher_context=group-success"
    if not active.distills:  # no loss term to weight with lambda
        out["algo.lambda_distill"] = (
            no_distill
            if not algo.distill
            else f"rule {rule.name} transforms the advantages instead of adding a distillation loss"
            + (" (its own lambda decays from 0.5 to 0)" if rule.name == "rlsd" else "")
        )
    warm_teacher = cfg.optim.sft_steps > 0 and cfg.optim.sft_teacher_share > 0  # the warm-up's teacher prompts
    if not (active.needs_teacher or algo.student_skills or cfg.eval.skills or warm_teacher):
        out["env.skills_dir"] = "no teacher reads skills and the student's prompts show none"
    if not algo.grpo:
        no_pg = "no policy-gradient term (algo.grpo=false)"
        for k in (
            "algo.clip_eps",
            "algo.clip_eps_high",
            "algo.adv_eps",
            "algo.estimator",
            "algo.policy_loss",
            "algo.group_stats",
        ):
            out[k] = no_pg
        out.update({f"algo.gigpo.{k}": no_pg for k in algo.gigpo})
        if not algo.kl_beta > 0:
            out["algo.loss_agg"] = "no policy-gradient term (algo.grpo=false) and no KL term (algo.kl_beta=0)"
    else:
        out.update(_estimator_keys(cfg))
    if not cfg.rollout.dynamic_sampling:
        out["rollout.max_sample_batches"] = "read only with rollout.dynamic_sampling=true"
    own = sorted(k for k in algo.pcsd if k in rule.defaults or k in rule.pins) if on else []
    for k in algo.pcsd:
        if k in own:
            continue
        if not on:
            out[f"algo.pcsd.{k}"] = no_distill
        elif rule.name == "uniform":
            out[f"algo.pcsd.{k}"] = "rule uniform is the gate at beta_gate = 0 by definition (a constant weight 0.5)"
        else:
            out[f"algo.pcsd.{k}"] = f"rule {rule.name} reads " + (
                ", ".join(f"algo.pcsd.{x}" for x in own) if own else "no algo.pcsd key"
            )
    return out
