"""One training update: score a rollout batch with the old policy, the frozen reference and the
frozen teacher, turn the teacher-student gaps into token weights with the configured rule, and
apply GRPO + lambda * distillation over token-budget micro-batches (the paper's Algorithm 1, steps
2-4). The per-token algebra lives in :mod:`pcsd.ops` (advantages, clipped ratio terms, the
weighting rules, the distillation loss); this module only orders it and reduces over ranks."""

from __future__ import annotations

import time
from typing import Optional

import torch
from omegaconf import DictConfig, OmegaConf

from pcsd.models import compute_context
from pcsd.ops.fused import fused_score_loss
from pcsd.ops.grpo import group_advantages, grpo_token_terms, token_coefficients
from pcsd.ops.losses import pcsd_loss
from pcsd.ops.scoring import greedy_microbatches, score_packed, uses_varlen_attention
from pcsd.ops.weighting import get_rule
from pcsd.rollout.loop import RolloutBatch
from pcsd.train import distributed as dist_utils
from pcsd.train.distributed import DistContext, single_process
from pcsd.train.fused_update import check_fused_loss, joint_scores, pair_microbatches, token_loss

__all__ = ["microbatches", "scores", "update_step"]


def microbatches(rb: RolloutBatch, budget: int) -> list[list[int]]:
    """Rows grouped greedily in order into micro-batches of at most ``budget`` prompt+response
    tokens (a longer row is a micro-batch of its own); rows without response tokens are left out."""
    return greedy_microbatches([len(p) + len(r) if r else 0 for p, r in zip(rb.prompt_ids, rb.response_ids)], budget)


_PAD_ROW = ([0], [0])  # a 2-token sequence for the padding passes of ranks with fewer micro-batches


def _mb_logprobs(model, prompts, responses, rows: Optional[list[int]]) -> torch.Tensor:
    """One packed forward pass over ``rows`` (None: a padding pass), log-probs of the responses."""
    with compute_context(model):  # bf16 autocast for an fp32 student (pcsd.train.precision)
        if rows is None:
            return torch.cat(score_packed(model, [_PAD_ROW[0]], [_PAD_ROW[1]]))
        ps, rs = [prompts[i] for i in rows], [responses[i] for i in rows]
        return torch.cat(score_packed(model, ps, rs, max_tokens_per_pass=sum(len(p) + len(r) for p, r in zip(ps, rs))))


def _device(model) -> torch.device:
    return next(model.parameters()).device  # a DTensor's device under FSDP


def scores(model, prompts, responses, mbs: list[list[int]], n_passes: int, T: int) -> torch.Tensor:
    """``[T]`` float32 log-probs of every packed response token, one forward per micro-batch,
    padded to ``n_passes`` forwards (FSDP: every rank runs the same number of passes)."""
    out = torch.zeros(T, device=_device(model))
    offsets = [0]
    for r in responses:
        offsets.append(offsets[-1] + len(r))
    with torch.no_grad():
        for k in range(n_passes):
            rows = mbs[k] if k < len(mbs) else None
            lp = _mb_logprobs(model, prompts, responses, rows).float()
            if rows is not None:
                idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(out.device)
                out[idx] = lp
    return out


def update_step(
    student,
    frozen,
    opt,
    rb: RolloutBatch,
    cfg: DictConfig,
    step: int,
    ctx: Optional[DistContext] = None,
    progress=None,
    record=None,
) -> dict:
    """Scores the batch and applies one GRPO + lambda * PCSD update (ppo_epochs passes).

    ``step`` is the RL step's 0-based index; an ``advantage`` rule (RLSD) gets the update's number
    ``step + 1`` (1 at the first update, as the public RLSD trainer's ``global_steps``).

    ``algo.grpo`` switches the policy-gradient term only: the k3 KL penalty to the frozen
    reference (``algo.kl_beta`` > 0) applies with or without it (OPSD keeps it, as the SDAR code's
    OPSD: ``pg_loss_coef=0`` with ``use_kl_loss``).

    ``progress(name, total)`` (e.g. :meth:`pcsd.progress.ProgressReporter.phase`) may return a
    ``cb(done, total)`` that is called after each scoring pass and each micro-batch.

    ``record(arrays)`` (``run.record_gaps``, see :mod:`pcsd.train.gaps`), when given, is called
    once with this rank's per-token gaps, weights, mask, log-probs and segment boundaries.

    The rule's kind decides how the teacher enters: ``weights`` rules give the tokens of the
    distillation loss :func:`pcsd.ops.losses.pcsd_loss` their weights, ``advantage`` rules
    transform GRPO's per-token advantages, ``loss`` rules (Skill-SD) add their own per-token loss
    as ``lambda`` x its token-mean over the batch.

    Distributed (``ctx`` with world_size > 1, FSDP2-sharded ``student``/``frozen``): ``rb`` holds
    this rank's whole groups; the loss normalisers (trajectory count, valid-token count) are
    summed over ranks so that the summed gradient is the one-process gradient of the whole batch.
    """
    ctx = ctx or single_process()
    algo = cfg.algo
    budget = cfg.optim.tokens_per_microbatch
    rule = get_rule(cfg.rule)
    T = rb.num_tokens()
    mbs = microbatches(rb, budget)
    n_passes = dist_utils.global_max(len(mbs), ctx)  # every rank runs as many forwards (FSDP)
    t0 = time.perf_counter()
    student.eval()
    need_ref = algo.kl_beta > 0  # the KL term, policy-gradient term or not
    use_teacher = algo.distill or rule.kind == "advantage"
    # one PPO epoch: the parameters do not change before the update's own forward pass, so that
    # pass gives log pi_old exactly (ratio 1) and a separate scoring pass of the student is skipped
    reuse_old = cfg.optim.ppo_epochs == 1
    n_score = int(not reuse_old) + int(need_ref) + int(use_teacher)
    score_cb = progress("scoring", n_score) if progress and n_score else None
    done_passes = 0
    old = None
    if not reuse_old:
        old = scores(student, rb.prompt_ids, rb.response_ids, mbs, n_passes, T)  # log pi_old, student prompt
        done_passes += 1
        score_cb and score_cb(done_passes, n_score)
    teacher_model = student if algo.teacher == "current" else frozen
    # optim.joint_frozen_pass: reference and teacher from one frozen forward per micro-batch
    jf = cfg.optim.get("joint_frozen_pass", "never")
    joint = (
        need_ref
        and use_teacher
        and teacher_model is frozen
        and (jf == "always" or (jf == "auto" and uses_varlen_attention(frozen)))
    )
    if joint:
        pair_mbs = pair_microbatches(rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, budget)
        ref, teacher = joint_scores(
            frozen,
            rb.prompt_ids,
            rb.teacher_prompt_ids,
            rb.response_ids,
            pair_mbs,
            dist_utils.global_max(len(pair_mbs), ctx),
            T,
        )
    else:
        ref = scores(frozen, rb.prompt_ids, rb.response_ids, mbs, n_passes, T) if need_ref else None
    done_passes += int(need_ref)
    score_cb and need_ref and score_cb(done_passes, n_score)
    if not joint:
        teacher = (
            scores(teacher_model, rb.teacher_prompt_ids, rb.response_ids, mbs, n_passes, T) if use_teacher else None
        )
    score_cb and use_teacher and score_cb(n_score, n_score)
    t_score = time.perf_counter() - t0

    dev = _device(student)  # every per-token tensor lives beside the model
    tok_traj = rb.token_traj_ids().to(dev)
    adv_traj = group_advantages(rb.reward.to(dev), rb.traj_group.to(dev), eps=algo.adv_eps)
    tok_adv_all = adv_traj[tok_traj].float()
    mask_all = torch.ones(T, dtype=torch.bool, device=dev)
    coef = token_coefficients(mask_all, tok_traj, rb.num_trajectories, algo.loss_agg)
    # global normalisers: the aggregation's denominator (trajectories with tokens, or tokens) and
    # PCSD's M are counts over the whole batch, i.e. over every rank
    n_seq = int((torch.bincount(tok_traj, minlength=rb.num_trajectories) > 0).sum()) if T else 0
    local_norm = T if algo.loss_agg == "token-mean" else n_seq
    g_norm, T_all = dist_utils.global_sum([local_norm, T], ctx)
    coef = (coef * (local_norm / max(g_norm, 1.0))).float()
    T_all = max(T_all, 1.0)
    pcsd_params = {k: v for k, v in OmegaConf.to_container(algo.pcsd).items() if k in rule.defaults}
    lengths = [len(r) for r in rb.response_ids]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)

    def token_terms(rows: list[int], idx: torch.Tensor, old_mb: torch.Tensor):
        """Advantages, PCSD weights and gaps of a micro-batch's tokens. Its rows are whole response
        turns and the weights' windows never cross a turn, so per micro-batch equals the whole batch."""
        mask = mask_all[idx]
        gap = (teacher[idx] - old_mb) if teacher is not None else torch.zeros_like(old_mb)
        tok_adv = tok_adv_all[idx]
        weights = torch.zeros_like(old_mb)
        if rule.kind == "advantage":
            tok_adv = rule(tok_adv, gap, mask, step + 1)
        elif algo.distill and rule.kind == "weights":
            cu = torch.tensor([0] + [lengths[i] for i in rows], device=dev).cumsum(0)
            weights = rule(gap, cu, mask, **pcsd_params)
        return tok_adv, weights, gap, mask

    fused = cfg.optim.get("fused_lm_head", False)
    n_valid = {}  # micro-batch -> its valid-token count M_mb (pcsd_loss's normaliser)

    def chunk_loss(k: int, rows: list[int], idx: torch.Tensor, lp: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Per-token loss of micro-batch ``k``'s tokens ``lo:hi`` (whole turns) for the fused lm-head."""
        cu = [0]
        for i in rows:
            cu.append(cu[-1] + lengths[i])
        sub = [i for i, a in zip(rows, cu) if lo <= a < hi]
        sub_idx = idx[lo:hi]
        old_c = lp.detach() if old is None else old[sub_idx]
        tok_adv, w, _gap, mask = token_terms(sub, sub_idx, old_c)
        distill = algo.distill and rule.kind == "weights"
        scale = len(idx) / T_all / max(n_valid[k], 1.0)
        out = token_loss(
            lp,
            old_c,
            None if ref is None else ref[sub_idx],
            tok_adv,
            coef[sub_idx],
            teacher[sub_idx] if distill else None,
            w,
            mask,
            algo,
            scale,
        )
        if algo.distill and rule.kind == "loss":  # Skill-SD's auxiliary term, token-mean over the batch
            out = out + algo.lambda_distill * rule(lp, teacher[sub_idx], old_c, mask, **pcsd_params) / T_all
        return out

    gscale = dist_utils.grad_scale(ctx)
    student.train()
    stats = dict(loss=0.0, pg=0.0, kl=0.0, pcsd=0.0, clip_frac=0.0, grad_norm=0.0)
    tok_sums = dict(gap=0.0, w=0.0, gate=0.0, nll=0.0)  # over the batch's tokens (first epoch)
    t0 = time.perf_counter()
    n_mb = len(mbs) * cfg.optim.ppo_epochs
    update_cb = progress("update", n_mb) if progress else None
    cached: dict[int, tuple] = {}  # micro-batch -> its token terms (computed once)
    for _epoch in range(cfg.optim.ppo_epochs):
        opt.zero_grad(set_to_none=True)
        for k in range(n_passes):
            rows = mbs[k] if k < len(mbs) else None
            fused_loss = None
            if fused and rows is not None:  # lm-head + per-token loss in one pass; lp is detached
                idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(dev)
                n_valid[k] = float(mask_all[idx].sum())
                with compute_context(student):  # the student's forward in the compute dtype, as below
                    fused_loss, lp = fused_score_loss(
                        student,
                        [rb.prompt_ids[i] for i in rows],
                        [rb.response_ids[i] for i in rows],
                        lambda lp_c, lo, hi: chunk_loss(k, rows, idx, lp_c, lo, hi),
                    )
            else:
                lp = _mb_logprobs(student, rb.prompt_ids, rb.response_ids, rows)
            if rows is None:  # padding pass: joins the collectives, adds nothing
                (lp.sum() * 0.0).backward()
                continue
            idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(dev)
            if k not in cached:
                old_mb = lp.detach().float() if old is None else old[idx]
                cached[k] = (old_mb, *token_terms(rows, idx, old_mb))
                _, _, w_mb, gap_mb, _ = cached[k]
                tok_sums["gap"] += float(gap_mb.sum())
                tok_sums["w"] += float(w_mb.sum())
                tok_sums["gate"] += float((w_mb > 0.5).float().sum())
                tok_sums["nll"] += float(-old_mb.sum())
            old_mb, tok_adv, w_mb, _gap, mask = cached[k]
            loss = lp.sum() * 0.0
            if algo.grpo or ref is not None:
                pg, kl, clipped = grpo_token_terms(
                    lp, old_mb, None if ref is None else ref[idx], tok_adv, algo.clip_eps
                )
                c = coef[idx]
                if algo.grpo:
                    pg_l = (c * pg).sum()
                    loss = loss + pg_l
                    stats["pg"] += float(pg_l.detach())
                    stats["clip_frac"] += float(clipped.float().sum()) / T_all
                kl_l = (c * kl).sum()  # 0 without a reference
                loss = loss + algo.kl_beta * kl_l
                stats["kl"] += float(kl_l.detach())
            if algo.distill and rule.kind == "weights":
                # sum over this micro-batch of m w (T - S) / M, M = all valid tokens of the batch
                d = pcsd_loss(lp, teacher[idx], w_mb, mask) * (len(idx) / T_all)
                loss = loss + algo.lambda_distill * d
                stats["pcsd"] += float(d.detach())
            if algo.distill and rule.kind == "loss":
                # token-mean over all valid tokens of the batch: this micro-batch's sum / M
                d = rule(lp, teacher[idx], old_mb, mask, **pcsd_params).sum() / T_all
                loss = loss + algo.lambda_distill * d
                stats["pcsd"] += float(d.detach())
            if fused_loss is not None:  # the stats above came from the same loss on lp (no graph)
                check_fused_loss(fused_loss, loss)
                loss = fused_loss
            (loss * gscale).backward()  # FSDP averages over ranks; the global loss is their sum
            stats["loss"] += float(loss.detach())
            update_cb and update_cb(_epoch * len(mbs) + k + 1, n_mb)
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
        stats["grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        opt.step()
    student.eval()
    if record is not None:
        record(_record_arrays(cached, mbs, offsets, teacher, T, rb))
    sums = dist_utils.global_sum(
        [
            stats["loss"],
            stats["pg"],
            stats["kl"],
            stats["pcsd"],
            stats["clip_frac"],
            tok_sums["gap"],
            tok_sums["w"],
            tok_sums["gate"],
            tok_sums["nll"],
        ],
        ctx,
    )
    for key, v in zip(("loss", "pg", "kl", "pcsd", "clip_frac"), sums[:5]):
        stats[key] = v
    stats.update(
        score_seconds=t_score,
        update_seconds=time.perf_counter() - t0,
        tokens=int(T_all),
        gap_mean=sums[5] / T_all if teacher is not None else 0.0,
        weight_mean=sums[6] / T_all,
        gate_activation=sums[7] / T_all,
        entropy_proxy=sums[8] / T_all,
    )
    return stats


def _record_arrays(cached: dict, mbs: list[list[int]], offsets: list[int], teacher, T: int, rb: RolloutBatch) -> dict:
    """The batch's per-token terms as numpy arrays (``run.record_gaps``): gap, weight, mask,
    log pi_old, log pi_teacher ``[T]``; ``cu_seqlens`` ``[R+1]`` (one segment per response turn),
    each row's trajectory and turn, each trajectory's reward."""
    import numpy as np

    gap, w, old = (np.zeros(T, dtype=np.float32) for _ in range(3))
    mask = np.zeros(T, dtype=bool)
    for k, rows in enumerate(mbs):
        if k not in cached:
            continue
        idx = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in rows])
        old_mb, _adv, w_mb, gap_mb, m_mb = cached[k]
        gap[idx] = gap_mb.detach().float().cpu().numpy()
        w[idx] = w_mb.detach().float().cpu().numpy()
        old[idx] = old_mb.detach().float().cpu().numpy()
        mask[idx] = m_mb.detach().cpu().numpy().astype(bool)
    return dict(
        gap=gap,
        weights=w,
        mask=mask,
        student_logp=old,
        teacher_logp=(teacher.detach().float().cpu().numpy() if teacher is not None else np.zeros(T, dtype=np.float32)),
        cu_seqlens=np.asarray(offsets, dtype=np.int64),
        row_traj=rb.traj_id.cpu().numpy(),
        row_turn=rb.turn.cpu().numpy(),
        traj_reward=rb.reward.float().cpu().numpy(),
    )
