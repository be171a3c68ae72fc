"""The update's loss written out plainly: the reference the trainer's update is compared with
(tests/test_train.py, tests/test_lora.py)."""

from __future__ import annotations


def plain_update_loss(cfg, rb, lp, old, ref, teacher, step: int):
    """The update's loss written out plainly, for the methods of the paper's table with the GRPO
    estimator and the PPO policy loss: ``L_GRPO`` (or OPSD's KL term alone) + ``lambda`` x the
    rule's distillation term (or the rule's advantages), from packed ``[T]`` log-probs of the
    policy ``lp`` (with the graph), the old policy, the reference and the teacher. ``step``: the
    RL step's 0-based index (the rule's schedule gets ``step + 1``)."""
    import torch

    from pcsd.ops.grpo import group_advantages, grpo_loss
    from pcsd.ops.losses import pcsd_loss, skill_sd_loss
    from pcsd.ops.weighting import get_rule

    rule = get_rule(cfg.rule)
    mask = torch.ones_like(lp, dtype=torch.bool)
    traj = rb.token_traj_ids()
    adv = group_advantages(rb.reward, rb.traj_group)[traj].float()
    w = torch.zeros_like(lp)
    if rule.kind == "advantage":
        adv = rule(adv, teacher - old, mask, step + 1)
    elif rule.kind == "weights":
        params = {k: v for k, v in dict(cfg.algo.pcsd).items() if k in rule.defaults}
        w = rule(teacher - old, rb.cu_seqlens(), mask, **params)
    terms = grpo_loss(
        lp,
        old,
        ref,
        adv,
        mask,
        traj,
        rb.num_trajectories,
        clip_eps=cfg.algo.clip_eps,
        kl_beta=cfg.algo.kl_beta,
        agg=cfg.algo.loss_agg,
    )
    # OPSD (algo.grpo=false): no policy-gradient term, the KL penalty stays (the SDAR code's OPSD)
    total = terms.loss if cfg.algo.grpo else cfg.algo.kl_beta * terms.kl
    if rule.kind == "weights":
        total = total + cfg.algo.lambda_distill * pcsd_loss(lp, teacher, w, mask)
    if rule.kind == "loss":  # Skill-SD: token-mean of its per-token loss over the whole batch
        total = total + cfg.algo.lambda_distill * skill_sd_loss(lp, teacher, old, mask)
    return total
