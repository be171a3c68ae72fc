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
    from pcsd.ops.losses import pcsd_loss, sdpo_token_loss, skill_sd_loss
    from pcsd.ops.weighting import get_rule

    rule = get_rule(cfg.rule)
    mask = torch.ones_like(lp, dtype=torch.bool)
    traj = rb.token_traj_ids()
    adv = group_advantages(rb.reward, rb.traj_group)[traj].float()
    w = torch.zeros_like(lp)
    if rule.kind == "advantage":
        adv = rule(adv, teacher - old, mask, step + 1)
    elif rule.kind == "batch":  # AgentOPSD: a loop over trajectories
        adv = plain_agentopsd(rb, adv, teacher - old)
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
    if rule.name == "skill-sd":  # Skill-SD: token-mean of its per-token loss over the whole batch
        total = total + cfg.algo.lambda_distill * skill_sd_loss(lp, teacher, old, mask)
    if rule.name == "sdpo":  # SDPO: token-mean of its sampled-token loss, the importance weight capped at 2
        total = total + cfg.algo.lambda_distill * sdpo_token_loss(lp, teacher, old, is_clip=2.0).mean()
    return total


def plain_agentopsd(rb, adv, gap, lam: float = 0.5, band: float = 0.2, eps: float = 1e-6):
    """AgentOPSD's turn advantage (``compute_opsd_turn_advantage``, belief_mult + signed) as a loop
    over trajectories: the prior the group's success rate, per turn the summed gap, the belief, its
    standardised change, the clipped multiplier of the turn's advantage. ``[T]`` per token."""
    import math

    offsets = [0]
    for r in rb.response_ids:
        offsets.append(offsets[-1] + len(r))
    rate = {}
    for g in set(rb.traj_group.tolist()):
        won = [bool(w) for w, tg in zip(rb.won.tolist(), rb.traj_group.tolist()) if tg == g]
        rate[g] = sum(won) / len(won)
    out = adv.clone()
    for t in set(rb.traj_id.tolist()):
        rows = sorted((k for k in range(rb.num_rows) if int(rb.traj_id[k]) == t), key=lambda k: int(rb.turn[k]))
        v0 = min(max(rate[int(rb.traj_group[t])], 1e-4), 1 - 1e-4)
        logit, v_prev, q = math.log(v0 / (1 - v0)), v0, []
        for k in rows:
            logit += float(gap[offsets[k] : offsets[k + 1]].double().sum())
            v = min(max(1 / (1 + math.exp(-logit)), eps), 1 - eps)
            q.append(v - v_prev)
            v_prev = v
        mean = sum(q) / len(q)
        std = math.sqrt(sum((x - mean) ** 2 for x in q) / len(q))
        for k, qk in zip(rows, q):
            a = float(adv[offsets[k]])
            sign = (a > 0) - (a < 0)
            m = min(max(1 + band * sign * (qk - mean) / (std + eps), 1 - band), 1 + band)
            out[offsets[k] : offsets[k + 1]] = a * ((1 - lam) + lam * m)
    return out
