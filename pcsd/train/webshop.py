"""WebShop in the trainer (``env.name=webshop``): the config checks, the two shops and the goals.

How the GiGPO / verl-agent (ZJU-REAL/SDAR) setup draws its goals, and how pcsd maps it onto one
native shop per split (``docs/webshop.md``):

* verl-agent runs one WebShop process per environment. Training worker ``i`` is built with seed
  ``env.seed + i // group_n`` and validation worker ``i`` with ``env.seed + 1000 + i``; the seed
  fixes the worker's goal order and its price draws. At every reset the environment manager draws
  ``RandomState(manager seed).choice(idxs, env_num, replace=False)`` (one persistent generator;
  manager seed ``env.seed`` for training, ``env.seed + 1000`` for validation) from
  ``idxs = range(500, 6910)`` (training) or ``range(500)`` (validation), and worker ``i`` plays its
  own goal list's entry ``idx[i]``.
* pcsd loads ONE shop per split: training ``WebShop.load(seed=s, variant="verl")`` and validation
  ``WebShop.load(seed=s + 1000, variant="verl")``, and takes the same index draws
  (:func:`pcsd.envs.webshop.draw_goals`): step ``t`` plays draw ``t`` of ``RandomState(s)`` over
  ``range(500, 6910)``; validation ``v`` plays draw ``v`` of ``RandomState(s + 1000)`` over
  ``range(500)`` (``eval.protocol=paper``) or always draw 0 (``eval.protocol=full``: 128 fixed
  goals, the same before and after RL). Group / validation env 0 thus plays exactly verl-agent's
  goal; the others play the same index in the split's one goal list instead of in a list shuffled
  with their own worker seed: the same goal distribution (every goal list is a seeded permutation
  of the same 6,910 goals) without 16 + 128 loaded shops.
* Reward: ``algo.success_reward`` (10) when the episode ends with score 1 (``won``), else 0, minus
  ``rollout.invalid_action_penalty`` per invalid response (verl-agent's WebShop scripts: 0.1).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["check_webshop_config", "load_shops", "train_goals", "webshop_data_dir"]

#: ALFWorld-only keys that must stay unset for WebShop
_ALFWORLD_ONLY = ("env.receptacles", "env.distractors", "env.task_types", "env.rooms")


def webshop_data_dir(cfg: Any) -> str:
    """``env.webshop_data`` or ``$WEBSHOP_DATA``, checked (ValueError naming env.webshop_data)."""
    from pcsd.envs.webshop import resolve_data_dir

    return resolve_data_dir(cfg.env.get("webshop_data"), "env.webshop_data")


def check_webshop_config(cfg: Any) -> Optional[str]:
    """What is wrong with a config for ``env.name=webshop`` (None when nothing is)."""
    from omegaconf import OmegaConf

    from pcsd.envs.webshop import VALIDATION_GOALS

    for key in _ALFWORLD_ONLY:
        if OmegaConf.select(cfg, key) is not None:
            return f"{key} is a procedural ALFWorld setting; env.name=webshop has none (leave it null)"
    if cfg.env.get("usual_place", 0.0):
        return (
            f"env.usual_place={cfg.env.usual_place} is a procedural ALFWorld setting; env.name=webshop has "
            "none (leave it 0)"
        )
    if cfg.optim.get("sft_teacher_demos", "same") == "skills":
        return (
            "optim.sft_teacher_demos=skills uses the ALFWorld expert that follows the skills; "
            "env.name=webshop has only the plain expert (expected optim.sft_teacher_demos=same)"
        )
    try:
        webshop_data_dir(cfg)
    except ValueError as exc:
        return str(exc)
    if cfg.eval.episodes > len(VALIDATION_GOALS):
        return (
            f"eval.episodes={cfg.eval.episodes}: WebShop validates on distinct goals drawn from the "
            f"{len(VALIDATION_GOALS)} validation goals; expected at most {len(VALIDATION_GOALS)} (0 = 128)"
        )
    return None


def load_shops(cfg: Any) -> tuple[Any, Any]:
    """The training shop (seed ``run.seed``) and the validation shop (seed ``run.seed + 1000``)."""
    from pcsd.envs.webshop import VALIDATION_SEED_OFFSET, WebShop

    root = webshop_data_dir(cfg)
    seed = int(cfg.run.seed)
    variant = str(cfg.env.webshop_variant)
    return (
        WebShop.load(root, goals="synthetic", seed=seed, variant=variant),
        WebShop.load(root, goals="synthetic", seed=seed + VALIDATION_SEED_OFFSET, variant=variant),
    )


def train_goals(cfg: Any, shop: Any, step: int) -> list[int]:
    """The ``rollout.tasks_per_step`` goal indices RL step ``step`` plays (draw ``step`` of
    ``RandomState(run.seed)`` over the training goals)."""
    from pcsd.envs.webshop import draw_goals, train_goal_indices

    return draw_goals(train_goal_indices(shop.num_goals), int(cfg.rollout.tasks_per_step), int(cfg.run.seed), step)
