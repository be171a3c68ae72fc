"""One update per method on a fixed batch, recorded: the numbers :func:`pcsd.train.update.update_step`
gave before the update was reshaped into phases (issue 27 part 6), which it must keep giving.

``tests/test_update_golden.py`` runs every case and compares with ``tests/fixtures/update_golden.json``.
A case is a method of the method table and a few switches of the update (the fused lm-head, two
PPO epochs, the joint frozen pass, token-mean aggregation, the current model as teacher, no KL).
Recorded per case: the update's statistics, each parameter's gradient norm after the update (the
last epoch's, clipped as applied) and each parameter's distance moved (SGD: every epoch's step).

Regenerate (only when a change of the numbers is intended, and say why in the commit)::

    PYTHONPATH=. python tests/update_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "update_golden.json"

#: the statistics of update_step compared (timings are not)
STATS = (
    "loss",
    "pg",
    "kl",
    "pcsd",
    "clip_frac",
    "grad_norm",
    "tokens",
    "gap_mean",
    "weight_mean",
    "gate_activation",
    "entropy_proxy",
)

METHODS = (
    "grpo",
    "skill-grpo",
    "opsd",
    "grpo+opsd",
    "rlsd",
    "skill-sd",
    "sdar",
    "sdar-norm",
    "pcsd",
    "pcsd-fixed-n1",
    "pcsd-fixed-n4",
    "pcsd-no-trend",
    "pcsd-no-decay",
)

#: switch name -> config overrides
VARIANTS = {
    "fused": [],
    "unfused": ["optim.fused_lm_head=false"],
    "epochs2": ["optim.ppo_epochs=2"],
    "epochs2-unfused": ["optim.ppo_epochs=2", "optim.fused_lm_head=false"],
}
#: a few more switches, each for a few methods
EXTRA = {
    "joint": (["optim.joint_frozen_pass=always"], ("pcsd", "rlsd", "skill-sd", "opsd")),
    "joint-epochs2": (["optim.joint_frozen_pass=always", "optim.ppo_epochs=2"], ("pcsd", "sdar")),
    "token-mean": (["algo.loss_agg=token-mean"], ("pcsd", "sdar", "skill-sd", "grpo")),
    "seq-token-sum": (["algo.loss_agg=seq-mean-token-sum", "optim.ppo_epochs=2"], ("pcsd", "rlsd")),
    "current-teacher": (["algo.teacher=current", "optim.ppo_epochs=2"], ("pcsd", "rlsd", "skill-sd")),
    "no-kl": (["algo.kl_beta=0"], ("pcsd", "opsd", "grpo")),
}


def cases() -> list[tuple[str, str, list[str]]]:
    """``[(case id, method, overrides)]``."""
    out = [(f"{m}/{v}", m, ov) for m in METHODS for v, ov in VARIANTS.items()]
    for v, (ov, methods) in EXTRA.items():
        out += [(f"{m}/{v}", m, ov) for m in methods]
    return out


def _models():
    from pcsd.bench.step import make_models

    return make_models("tiny", seed=0)  # float32, the frozen copy perturbed (KL and gaps not 0)


def run_case(method: str, overrides: list[str], models=None) -> dict:
    """One update_step of ``method`` with ``overrides`` on the fixed batch: its statistics, each
    parameter's gradient norm and distance moved."""
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.config import load_config
    from pcsd.train.update import update_step

    student, frozen = models if models is not None else _models()
    student = __import__("copy").deepcopy(student)
    cfg = load_config(
        [
            f"method={method}",
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=64",
            "rollout.max_prompt_tokens=40",
            "rollout.max_response_tokens=20",
            "optim.grad_clip=1e9",
            "algo.lambda_distill=0.5",
            "algo.kl_beta=0.1",
        ]
        + overrides
    )
    rb = synthetic_rollout_batch(num_groups=3, group_size=3, seed=5, turns=(1, 3), prompt_len=(6, 18))
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    opt = torch.optim.SGD(student.parameters(), lr=2.0)  # moves the ratios of a second epoch off 1
    rec: dict = {}
    stats = update_step(student, frozen, opt, rb, cfg, step=3, record=rec.update)
    return dict(
        stats={k: float(stats[k]) for k in STATS},
        grad={n: float(p.grad.double().norm()) for n, p in student.named_parameters() if p.grad is not None},
        moved={n: float((p.detach() - before[n]).double().norm()) for n, p in student.named_parameters()},
        record={k: float(torch.as_tensor(rec[k]).double().sum()) for k in ("gap", "weights", "student_logp")},
    )


def run_all() -> dict:
    models = _models()
    return {cid: run_case(m, ov, models) for cid, m, ov in cases()}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(run_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
