"""One training update (the paper's Algorithm 1, steps 2-4), in four phases:

1. **score** (:func:`score`): the packed ``[T]`` log-probs of every response token under the old
   policy (skipped with one PPO epoch: the update's own forward gives them), the frozen reference
   and the teacher (the frozen copy, or the student with ``algo.teacher=current``);
2. **per-token terms** (:class:`Terms`): the advantages (:func:`estimate_advantages`, the one call
   that gives them), the aggregation coefficients and normalisers over every rank, and per
   micro-batch a :class:`pcsd.ops.losses.TokenTerms` with the weighting rule's contribution
   (:meth:`pcsd.ops.weighting.WeightRule.terms`: advantages, weights, a loss term);
3. **loss** (:func:`micro_batch_loss`): per micro-batch the student's forward and the one per-token
   loss :func:`pcsd.ops.losses.update_token_loss` (policy term chosen by name, k3 KL, the rule's
   term), summed with autograd, or inside the fused lm-head (``optim.fused_lm_head``);
4. **step** (:func:`train_epochs`): ``optim.ppo_epochs`` passes over the micro-batches, each ended
   by gradient clipping and the optimizer's step; the statistics summed over ranks
   (:func:`finish_stats`).

The per-token algebra lives in :mod:`pcsd.ops`; this module only orders it and reduces over ranks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from pcsd.lora import frozen_base
from pcsd.models import compute_context
from pcsd.ops.estimators import AdvantageInputs, get_estimator
from pcsd.ops.fused import fused_score_loss
from pcsd.ops.grpo import token_coefficients
from pcsd.ops.losses import LossParts, LossSpec, TokenTerms, update_token_loss
from pcsd.ops.policy_losses import get_policy_loss
from pcsd.ops.scoring import greedy_microbatches, score_packed, uses_varlen_attention
from pcsd.ops.weighting import RowBatch, WeightRule, active_rule
from pcsd.rollout.loop import RolloutBatch
from pcsd.train import distributed as dist_utils
from pcsd.train.distributed import DistContext, single_process
from pcsd.train.fused_update import joint_scores, pair_microbatches
from pcsd.train.metrics import UpdateStats

__all__ = ["NonFiniteUpdate", "microbatches", "scores", "estimate_advantages", "update_step"]


def microbatches(rb: RolloutBatch, budget: int) -> list[list[int]]:
    """Rows grouped greedily in order into micro-batches of at most ``budget`` prompt+response
    tokens (a longer row is a micro-batch of its own); rows without response tokens are left out."""
    return greedy_microbatches([len(p) + len(r) if r else 0 for p, r in zip(rb.prompt_ids, rb.response_ids)], budget)


_PAD_ROW = ([0], [0])  # a 2-token sequence for the padding passes of ranks with fewer micro-batches


def _mb_logprobs(model, prompts, responses, rows: Optional[list[int]]) -> Tensor:
    """One packed forward pass over ``rows`` (None: a padding pass), log-probs of the responses."""
    with compute_context(model):  # bf16 autocast for an fp32 student (pcsd.train.precision)
        if rows is None:
            return torch.cat(score_packed(model, [_PAD_ROW[0]], [_PAD_ROW[1]]))
        ps, rs = [prompts[i] for i in rows], [responses[i] for i in rows]
        return torch.cat(score_packed(model, ps, rs, max_tokens_per_pass=sum(len(p) + len(r) for p, r in zip(ps, rs))))


def _device(model) -> torch.device:
    return next(model.parameters()).device  # a DTensor's device under FSDP


def scores(model, prompts, responses, mbs: list[list[int]], n_passes: int, T: int) -> Tensor:
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


@dataclass
class Layout:
    """Where each row's response tokens sit in the packed ``[T]`` arrays, and the micro-batches."""

    mbs: list[list[int]]  # rows per micro-batch: whole response turns, optim.tokens_per_microbatch
    n_passes: int  # forwards per epoch on every rank (FSDP: the most any rank needs)
    offsets: list[int]  # [R+1]: row r's tokens are offsets[r]:offsets[r+1]
    dev: torch.device  # where every per-token tensor lives (beside the model)

    @property
    def T(self) -> int:
        return self.offsets[-1]

    def rows(self, k: int) -> Optional[list[int]]:
        """Micro-batch ``k``'s rows; None for a padding pass."""
        return self.mbs[k] if k < len(self.mbs) else None

    def index(self, rows: list[int]) -> Tensor:
        """``[n]`` the packed positions of ``rows``' tokens, in order."""
        return torch.cat([torch.arange(self.offsets[i], self.offsets[i + 1]) for i in rows]).to(self.dev)

    def segments(self, rows: list[int]) -> tuple[int, ...]:
        """Offsets ``[0, ..., n]`` of ``rows``' turns within their tokens (their ``cu_seqlens``)."""
        cu = [0]
        for i in rows:
            cu.append(cu[-1] + self.offsets[i + 1] - self.offsets[i])
        return tuple(cu)

    def sub_rows(self, rows: list[int], lo: int, hi: int) -> list[int]:
        """The rows of ``rows`` that start within their tokens ``lo:hi`` (whole turns)."""
        return [i for i, a in zip(rows, self.segments(rows)) if lo <= a < hi]


def plan_layout(rb: RolloutBatch, cfg: DictConfig, ctx: DistContext, dev: torch.device) -> Layout:
    mbs = microbatches(rb, cfg.optim.tokens_per_microbatch)
    offsets = [0]
    for r in rb.response_ids:
        offsets.append(offsets[-1] + len(r))
    return Layout(mbs, dist_utils.global_max(len(mbs), ctx), offsets, dev)  # every rank: as many forwards


# ----------------------------------------------------------------------------- 1. score
class Scores(NamedTuple):
    """The scoring phase's packed ``[T]`` float32 log-probs."""

    old: Optional[Tensor]  # log pi_old; None: taken from the update's own pass (one PPO epoch)
    ref: Optional[Tensor]  # log pi_ref on the student prompts; None without the KL term (algo.kl_beta = 0)
    teacher: Optional[Tensor]  # log pi_teacher on the teacher prompts; None when the rule reads no teacher
    seconds: float


def score(
    student, frozen, rb: RolloutBatch, cfg: DictConfig, layout: Layout, ctx, rule: WeightRule, progress
) -> Scores:
    """Phase 1: the old policy's, the reference's and the teacher's log-probs (:class:`Scores`).
    ``progress("scoring", n)`` may return a ``cb(done, n)`` called after each of the n scorings."""
    need_ref = cfg.algo.kl_beta > 0  # the KL term, policy-gradient term or not
    # one epoch: the update's own forward pass gives log pi_old exactly, unless the rule reads the
    # whole batch's gaps before the first micro-batch (WeightRule.needs_old)
    need_old = cfg.optim.ppo_epochs > 1 or rule.needs_old
    n = int(need_old) + int(need_ref) + int(rule.needs_teacher)
    cb: Callable[[int, int], object] = (progress("scoring", n) if progress and n else None) or (lambda d, t: None)
    t0 = time.perf_counter()
    student.eval()
    old = None
    if need_old:
        old = scores(student, rb.prompt_ids, rb.response_ids, layout.mbs, layout.n_passes, layout.T)
        cb(1, n)
    ref, teacher = _frozen_scores(student, frozen, rb, cfg, layout, ctx, need_ref, rule.needs_teacher, cb, n)
    return Scores(old, ref, teacher, time.perf_counter() - t0)


def _frozen_scores(student, frozen, rb, cfg, layout: Layout, ctx, need_ref: bool, use_teacher: bool, cb, n: int):
    """``(ref, teacher)``: two passes, or one frozen forward per micro-batch with both contexts of
    each row side by side (``optim.joint_frozen_pass``). ``frozen`` is the frozen base: a copy, or
    a LoRA run's student with its adapters off (:class:`pcsd.lora.AdaptersOff`), switched off
    for these passes only (:func:`pcsd.lora.frozen_base`)."""
    current = cfg.algo.teacher == "current"  # the teacher is the student itself (adapters on)
    jf = cfg.optim.get("joint_frozen_pass", "never")
    args = (rb.response_ids, layout.mbs, layout.n_passes, layout.T)
    ref: Optional[Tensor] = None
    teacher: Optional[Tensor] = None
    with frozen_base(frozen) as base:
        joint = (
            need_ref
            and use_teacher
            and not current
            and (jf == "always" or (jf == "auto" and uses_varlen_attention(base)))
        )
        if joint:
            pairs = pair_microbatches(
                rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, cfg.optim.tokens_per_microbatch
            )
            n_pairs = dist_utils.global_max(len(pairs), ctx)
            ref, teacher = joint_scores(
                base, rb.prompt_ids, rb.teacher_prompt_ids, rb.response_ids, pairs, n_pairs, layout.T
            )
        else:
            ref = scores(base, rb.prompt_ids, *args) if need_ref else None
        if need_ref:
            cb(n - int(use_teacher), n)
        if use_teacher and not joint and not current:
            teacher = scores(base, rb.teacher_prompt_ids, *args)
    if use_teacher and current:
        teacher = scores(student, rb.teacher_prompt_ids, *args)
    if use_teacher:
        cb(n, n)
    return ref, teacher


# ----------------------------------------------------------------------------- 2. per-token terms
def estimate_advantages(rb: RolloutBatch, cfg: DictConfig, tok_traj: Tensor) -> Tensor:
    """``[T]`` float32 per-token advantages of this rank's rows: the one call the update takes them
    from. The estimator ``algo.estimator`` names (:mod:`pcsd.ops.estimators`: grpo, rloo, gigpo)
    with its parameters from ``algo.<estimator>`` (``algo.gigpo.*``) and ``algo.adv_eps`` gives one
    advantage per response turn, spread over the turn's tokens (``tok_traj`` ``[T]``: each token's
    trajectory, for the device). ``rb`` holds whole groups on every rank, so no collective is
    needed (GiGPO's anchor groups lie within a task group)."""
    dev = tok_traj.device
    est = get_estimator(cfg.algo.get("estimator", "grpo"))
    section = cfg.algo.get(est.name) if est.defaults else None  # e.g. algo.gigpo (grpo reads none)
    params = {k: section[k] for k in est.defaults if k in section} if section is not None else {}
    if est.needs_anchor and rb.anchor is None:
        raise ValueError(
            f"algo.estimator={est.name} needs each row's anchor state (RolloutBatch.anchor), and this batch has "
            "none (it was not made by pcsd.rollout.loop.collect_rollouts)"
        )
    rows = AdvantageInputs(
        reward=rb.reward.to(dev),
        traj_group=rb.traj_group.to(dev),
        row_traj=rb.traj_id.to(dev),
        row_turn=rb.turn.to(dev),
        step_reward=rb.row_step_rewards().to(dev),
        anchor=(rb.anchor if rb.anchor is not None else torch.zeros_like(rb.traj_id)).to(dev),
    )
    adv = est(rows, eps=cfg.algo.adv_eps, group_stats=cfg.algo.get("group_stats", "trajectory"), **params)
    lengths = torch.tensor([len(r) for r in rb.response_ids], dtype=torch.int64, device=dev)
    return torch.repeat_interleave(adv, lengths)


def teacher_token_mask(rb: RolloutBatch, layout: Layout) -> Optional[Tensor]:
    """``[T]`` bool: each token's turn has a teacher context (``RolloutBatch.teacher_context``,
    ``algo.teacher_context=group-success``); None where every turn has one."""
    if rb.teacher_context is None:
        return None
    lengths = torch.tensor([len(r) for r in rb.response_ids], dtype=torch.int64)
    return torch.repeat_interleave(rb.teacher_context.bool(), lengths).to(layout.dev)


def gap_noise(offsets, sigma: float, rho: float, seed: int) -> Tensor:
    """``experiment.gap_noise``: Gaussian noise ``[T]`` of standard deviation ``sigma`` for every token
    of the packed responses (``offsets``: each row's first token, and T last), AR(1) with correlation
    ``rho`` along each response (``rho=0``: i.i.d.): ``e_0 = z_0``, ``e_t = rho e_(t-1) +
    sqrt(1 - rho^2) z_t``, so every token's noise has variance ``sigma^2``; a response never carries
    its noise into the next. Drawn on the CPU from ``seed`` (the same noise on every device)."""
    offs = [int(o) for o in offsets]
    T = offs[-1] if offs else 0
    gen = torch.Generator().manual_seed(int(seed))
    z = torch.randn(T, generator=gen, dtype=torch.float64)
    if rho != 0.0 and T:
        e = z.tolist()
        c = math.sqrt(1.0 - rho * rho)
        first = set(offs[:-1])
        for t in range(1, T):  # a sequential recurrence over the batch's response tokens (plain floats)
            if t not in first:
                e[t] = rho * e[t - 1] + c * e[t]
        z = torch.tensor(e, dtype=torch.float64)
    return (sigma * z).float()


def experiment_teacher(teacher: Tensor, old: Tensor, noise: Optional[Tensor], idx: Tensor, negate: bool) -> Tensor:
    """The teacher log-probs every rule reads, under the experiment settings: ``noise[idx]`` added (so
    the gap ``teacher - old`` carries it) and, with ``negate`` (the negative control), the gap's sign
    reversed (``old - gap``). Without either, ``teacher`` itself."""
    if noise is not None:
        teacher = teacher + noise[idx]
    if negate:
        teacher = 2.0 * old - teacher  # gap -> -gap
    return teacher


class Terms:
    """Phase 2: the per-token terms. The batch's (advantages, aggregation coefficients, the
    normalisers summed over ranks) at construction; a micro-batch's :class:`TokenTerms`, the rule
    applied, by :meth:`micro`, kept for the later PPO epochs and the statistics."""

    def __init__(self, rb: RolloutBatch, cfg: DictConfig, layout: Layout, sc: Scores, rule: WeightRule, step: int, ctx):
        T, dev, algo = layout.T, layout.dev, cfg.algo
        self.layout, self.scores, self.rule = layout, sc, rule
        self.params = rule.params_from(algo.pcsd)
        self.step = step + 1  # the update's number: 1 at the first (the public RLSD trainer's global_steps)
        self.traj = rb.token_traj_ids().to(dev)
        self.mask = torch.ones(T, dtype=torch.bool, device=dev)
        exp = cfg.get("experiment")
        # the experiment settings (never a preset's): the one place every rule's gap comes from
        self.negate_gap = bool(exp is not None and exp.negate_gap)
        self.gap_noise: Optional[Tensor] = None
        if exp is not None and exp.gap_noise > 0 and sc.teacher is not None:
            seed = (int(cfg.run.seed) * 1_000_003 + self.step * 7919 + ctx.rank) % 2**62
            noise = gap_noise(layout.offsets, float(exp.gap_noise), float(exp.gap_noise_rho), seed)
            self.gap_noise = noise.to(device=dev, dtype=sc.teacher.dtype)
        self.teacher_mask = teacher_token_mask(rb, layout)
        self.advantages = self._batch_advantages(rb, estimate_advantages(rb, cfg, self.traj))
        coef = token_coefficients(self.mask, self.traj, rb.num_trajectories, algo.loss_agg)
        # global normalisers: the aggregation's denominator (trajectories with tokens, or tokens)
        # and the distillation's M are counts over the whole batch, i.e. over every rank
        n_seq = int((torch.bincount(self.traj, minlength=rb.num_trajectories) > 0).sum()) if T else 0
        local_norm = T if algo.loss_agg == "token-mean" else n_seq
        g_norm, T_all = dist_utils.global_sum([local_norm, T], ctx)
        self.coef = (coef * (local_norm / max(g_norm, 1.0))).float()
        self.tokens = max(T_all, 1.0)  # valid tokens over every rank (every response token is valid)
        self.cache: dict[int, TokenTerms] = {}  # micro-batch -> its terms (computed once)
        self.sums = dict(gap=0.0, w=0.0, gate=0.0, nll=0.0)  # over the batch's tokens
        self.valid: dict[int, float] = {}  # micro-batch -> its valid-token count M_mb

    def _batch_advantages(self, rb: RolloutBatch, adv: Tensor) -> Tensor:
        """The rule's advantages of the whole batch (:meth:`WeightRule.batch_advantages`: a ``batch``
        rule's, from every turn's gaps; the estimator's ``adv`` for the others)."""
        if not self.rule.needs_old:
            return adv
        sc, dev = self.scores, self.layout.dev
        gap = torch.zeros_like(adv)
        if sc.teacher is not None and sc.old is not None:
            every = torch.arange(sc.teacher.shape[0], device=sc.teacher.device)
            gap = experiment_teacher(sc.teacher, sc.old, self.gap_noise, every, self.negate_gap) - sc.old
            if self.teacher_mask is not None:
                gap = torch.where(self.teacher_mask, gap, torch.zeros_like(gap))
        rows = RowBatch(
            advantages=adv,
            gap=gap,
            offsets=torch.tensor(self.layout.offsets, dtype=torch.int64, device=dev),
            row_traj=rb.traj_id.to(dev),
            row_turn=rb.turn.to(dev),
            traj_group=rb.traj_group.to(dev),
            won=rb.won.to(dev),
        )
        return self.rule.batch_advantages(rows, self.step, **self.params).float()

    def micro(self, rows: list[int], idx: Tensor, old: Tensor) -> TokenTerms:
        """The terms of the whole turns ``rows`` (packed positions ``idx``) given their log pi_old
        ``old``. Windows never cross a turn, so per micro-batch (or chunk) equals the whole batch."""
        sc = self.scores
        teacher = None if sc.teacher is None else sc.teacher[idx]
        if teacher is not None:
            teacher = experiment_teacher(teacher, old, self.gap_noise, idx, self.negate_gap)
        tmask = None if self.teacher_mask is None or teacher is None else self.teacher_mask[idx]
        gap = torch.zeros_like(old) if teacher is None else teacher - old
        if tmask is not None:  # a turn without a teacher context: no gap
            gap = torch.where(tmask, gap, torch.zeros_like(gap))
        t = TokenTerms(
            old_logp=old,
            advantages=self.advantages[idx],
            coef=self.coef[idx],
            mask=self.mask[idx],
            traj_ids=self.traj[idx],
            segments=self.layout.segments(rows),
            gap=gap,
            ref_logp=None if sc.ref is None else sc.ref[idx],
            teacher_logp=teacher,
            teacher_mask=tmask,
        )
        r = self.rule.terms(t, self.step, **self.params)
        return replace(t, advantages=r.advantages, weights=r.weights, rule_loss=r.loss)

    def known(self, k: int, rows: list[int], idx: Tensor) -> Optional[TokenTerms]:
        """Micro-batch ``k``'s terms if they can be had before its forward pass (None when log pi_old
        comes from that pass)."""
        if k in self.cache or self.scores.old is None:
            return self.cache.get(k)
        return self.of(k, rows, idx, self.scores.old[idx])

    def of(self, k: int, rows: list[int], idx: Tensor, old: Tensor) -> TokenTerms:
        """Micro-batch ``k``'s terms, computed once (with its share of the token statistics)."""
        if k not in self.cache:
            t = self.cache[k] = self.micro(rows, idx, old)
            w = torch.zeros_like(old) if t.weights is None else t.weights
            vals = torch.stack([t.gap.sum(), w.sum(), (w > 0.5).float().sum(), -old.sum(), t.mask.sum()]).tolist()
            for key, v in zip(("gap", "w", "gate", "nll"), vals):
                self.sums[key] += v
            self.valid[k] = vals[-1]
        return self.cache[k]

    def distill(self, k: int, parts: LossParts) -> Tensor:
        """Micro-batch ``k``'s share of the rule's token-mean over the batch: its own token-mean
        times its share of the batch's valid tokens (``sum / M``, rounded as pcsd_loss rounds it)."""
        m_mb = self.valid[k]
        return (parts.distill.sum() / max(m_mb, 1.0)) * (m_mb / self.tokens)


def loss_spec(cfg: DictConfig, terms: Terms) -> LossSpec:
    """The update's per-token loss constants: the policy loss chosen by name (``ppo``: GRPO's
    clipped ratio; none without ``algo.grpo``), the KL and rule coefficients, the rule's normaliser."""
    algo = cfg.algo
    policy = get_policy_loss(algo.get("policy_loss", "ppo")) if algo.grpo else None
    return LossSpec(policy, algo, float(algo.kl_beta), float(algo.lambda_distill), terms.tokens)


# ----------------------------------------------------------------------------- 3. loss
def micro_batch_loss(student, rb: RolloutBatch, terms: Terms, spec: LossSpec, k: int, rows: list[int], fused: bool):
    """Phase 3: micro-batch ``k``'s loss (0-dim, with the graph to the student's parameters) and its
    :class:`pcsd.ops.losses.LossParts` (detached, for the statistics). The plain path sums
    :func:`update_token_loss` of the forward's log-probs; the fused path hands the same function to
    the fused lm-head, chunk by chunk of whole turns."""
    layout = terms.layout
    idx = layout.index(rows)
    t = terms.known(k, rows, idx)
    if not fused:
        lp = _mb_logprobs(student, rb.prompt_ids, rb.response_ids, rows)
        t = terms.of(k, rows, idx, lp.detach().float()) if t is None else t
        parts = update_token_loss(lp, t, spec)
        # the sum of parts.total, added up term by term (each term's sum is also its statistic)
        loss = parts.pg.sum() + spec.kl_beta * parts.kl.sum() + spec.lambda_distill * terms.distill(k, parts)
        return loss, LossParts(*(x.detach() for x in parts))
    known = t

    def chunk_loss(lp_c: Tensor, lo: int, hi: int) -> Tensor:
        if known is not None:
            tc = known.slice(lo, hi)
        else:  # log pi_old is this pass's (one PPO epoch): the chunk's terms from its own log-probs
            tc = terms.micro(layout.sub_rows(rows, lo, hi), idx[lo:hi], lp_c.detach())
        return update_token_loss(lp_c, tc, spec).total

    with compute_context(student):  # the student's forward in the compute dtype, as the plain path's
        loss, lp = fused_score_loss(
            student, [rb.prompt_ids[i] for i in rows], [rb.response_ids[i] for i in rows], chunk_loss
        )
    t = terms.of(k, rows, idx, lp.detach().float()) if t is None else t
    with torch.no_grad():  # the statistics: the same per-token loss on the pass's log-probs
        return loss, update_token_loss(lp.detach(), t, spec)


# ----------------------------------------------------------------------------- 4. step
STAT_KEYS = ("loss", "pg", "kl", "pcsd", "clip_frac")


class NonFiniteUpdate(RuntimeError):
    """The run stops: an update made a parameter non-finite (it cannot be undone), or
    ``optim.max_nonfinite_updates`` updates in a row were not applied (:func:`train_epochs`)."""


def params_finite(model, ctx) -> bool:
    """Whether every trained parameter of ``model`` is finite, on every rank (under FSDP2 each rank
    checks its shards; the answer is agreed, so every rank takes the same branch)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]
    ok = bool(torch.stack([torch.isfinite(t).all() for t in local]).all()) if local else True
    return agreed(ok, ctx)


def agreed(ok: bool, ctx) -> bool:
    """``ok`` on every rank (one collective under FSDP2; the identity on one process)."""
    return dist_utils.global_sum([0.0 if ok else 1.0], ctx)[0] == 0.0


def train_epochs(student, opt, rb: RolloutBatch, cfg: DictConfig, terms: Terms, spec: LossSpec, ctx, progress) -> dict:
    """Phase 4: ``optim.ppo_epochs`` passes over the micro-batches (padding passes where this rank
    has fewer than another), each ended by gradient clipping and ``opt.step()``. Returns this
    rank's sums of :data:`STAT_KEYS`, the last pass's gradient norm and ``nonfinite_updates``.

    A pass whose loss (on any rank) or gradient norm is not finite is never applied: its gradients
    are dropped, it and the step's remaining passes are counted in ``nonfinite_updates`` (every rank
    agrees: :func:`agreed`), the passes before it stand. A parameter that an applied pass made
    non-finite stops the run (:class:`NonFiniteUpdate`: nothing to undo it with, nothing written)."""
    layout, epochs = terms.layout, cfg.optim.ppo_epochs
    fused = cfg.optim.get("fused_lm_head", False)
    gscale = dist_utils.grad_scale(ctx)  # FSDP averages over ranks; the global loss is their sum
    stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0.0)
    stats["nonfinite_updates"] = 0
    n_mb = len(layout.mbs) * epochs
    cb = progress("update", n_mb) if progress else None
    student.train()
    for epoch in range(epochs):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0  # this pass's loss on this rank
        for k in range(layout.n_passes):
            rows = layout.rows(k)
            if rows is None:  # padding pass: joins the collectives, adds nothing
                (_mb_logprobs(student, rb.prompt_ids, rb.response_ids, None).sum() * 0.0).backward()
                continue
            loss, parts = micro_batch_loss(student, rb, terms, spec, k, rows, fused)
            (loss * gscale).backward()
            sums = (loss.detach(), parts.pg.sum(), parts.kl.sum(), terms.distill(k, parts), parts.clipped.sum())
            vals = torch.stack([v.to(torch.float64) for v in sums]).tolist()  # one host sync
            vals[-1] /= terms.tokens  # clip_frac: a share of the batch's tokens
            loss_sum += vals[0]
            for key, v in zip(STAT_KEYS, vals):
                stats[key] += v
            cb and cb(epoch * len(layout.mbs) + k + 1, n_mb)
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
        stats["grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)  # the same on every rank
        if not agreed(math.isfinite(loss_sum) and math.isfinite(stats["grad_norm"]), ctx):
            opt.zero_grad(set_to_none=True)  # never applied
            stats["nonfinite_updates"] = epochs - epoch
            break
        opt.step()
        if not params_finite(student, ctx):
            raise NonFiniteUpdate(
                f"an update with a finite loss and gradient norm ({stats['grad_norm']:.3g}) made a parameter "
                f"non-finite (optim.lr={cfg.optim.lr}): stopped, no checkpoint of it written"
            )
    student.eval()
    return stats


def finish_stats(stats: dict, terms: Terms, ctx, t_update: float) -> UpdateStats:
    """The statistics summed over ranks, the token statistics as means over the batch's tokens."""
    sums = dist_utils.global_sum(
        [stats[k] for k in STAT_KEYS] + [terms.sums[k] for k in ("gap", "w", "gate", "nll")], ctx
    )
    loss, pg, kl, pcsd, clip_frac = sums[: len(STAT_KEYS)]
    gap, w, gate, nll = sums[len(STAT_KEYS) :]
    n = terms.tokens
    return UpdateStats(
        loss=loss,
        pg=pg,
        kl=kl,
        pcsd=pcsd,
        clip_frac=clip_frac,
        grad_norm=stats["grad_norm"],
        score_seconds=terms.scores.seconds,
        update_seconds=t_update,
        tokens=int(n),
        gap_mean=gap / n if terms.scores.teacher is not None else 0.0,
        weight_mean=w / n,
        gate_activation=gate / n,
        entropy_proxy=nll / n,
        nonfinite_updates=int(stats["nonfinite_updates"]),
    )


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
) -> UpdateStats:
    """Scores the batch and applies one GRPO + lambda * distillation update (``optim.ppo_epochs``
    passes): the four phases of the module docstring.

    ``step`` is the RL step's 0-based index; the rule gets the update's number ``step + 1`` (1 at
    the first update, as the public RLSD trainer's ``global_steps``).

    ``algo.grpo`` switches the policy-gradient term only: the k3 KL penalty to the frozen
    reference (``algo.kl_beta`` > 0) applies with or without it (OPSD keeps it, as the SDAR code's
    OPSD: ``pg_loss_coef=0`` with ``use_kl_loss``). ``algo.distill=false`` turns a distillation
    rule off (:func:`pcsd.ops.weighting.active_rule`).

    ``progress(name, total)`` (e.g. :meth:`pcsd.progress.ProgressReporter.phase`) may return a
    ``cb(done, total)`` that is called after each scoring pass and each micro-batch.

    ``record(arrays)`` (``run.record_gaps``, see :mod:`pcsd.train.gaps`), when given, is called
    once with this rank's per-token gaps, weights, mask, log-probs and segment boundaries.

    Distributed (``ctx`` with world_size > 1, FSDP2-sharded ``student``/``frozen``): ``rb`` holds
    this rank's whole groups; the loss normalisers (trajectory count, valid-token count) are
    summed over ranks so that the summed gradient is the one-process gradient of the whole batch.
    """
    ctx = ctx or single_process()
    rule = active_rule(cfg.rule, cfg.algo.distill)
    layout = plan_layout(rb, cfg, ctx, _device(student))
    sc = score(student, frozen, rb, cfg, layout, ctx, rule, progress)
    terms = Terms(rb, cfg, layout, sc, rule, step, ctx)
    t0 = time.perf_counter()
    stats = train_epochs(student, opt, rb, cfg, terms, loss_spec(cfg, terms), ctx, progress)
    if record is not None:
        record(_record_arrays(terms, rb))
    return finish_stats(stats, terms, ctx, time.perf_counter() - t0)


def _record_arrays(terms: Terms, rb: RolloutBatch) -> dict:
    """The batch's per-token terms as numpy arrays (``run.record_gaps``): gap, weight, mask,
    log pi_old, log pi_teacher ``[T]``; ``cu_seqlens`` ``[R+1]`` (one segment per response turn),
    each row's trajectory and turn, each trajectory's reward."""
    import numpy as np

    layout, T = terms.layout, terms.layout.T
    gap, w, old = (np.zeros(T, dtype=np.float32) for _ in range(3))
    mask = np.zeros(T, dtype=bool)
    for k, rows in enumerate(layout.mbs):
        t = terms.cache.get(k)
        if t is None:
            continue
        idx = np.concatenate([np.arange(layout.offsets[i], layout.offsets[i + 1]) for i in rows])
        gap[idx] = t.gap.detach().float().cpu().numpy()
        if t.weights is not None:
            w[idx] = t.weights.detach().float().cpu().numpy()
        old[idx] = t.old_logp.detach().float().cpu().numpy()
        mask[idx] = t.mask.detach().cpu().numpy().astype(bool)
    teacher = terms.scores.teacher
    if teacher is not None and (terms.gap_noise is not None or terms.negate_gap):
        t_lp = np.zeros(T, dtype=np.float32)  # the teacher log-probs the rules read (pcsd.train.update.Terms)
        t_lp[mask] = (gap + old)[mask]
        teacher = torch.from_numpy(t_lp)
    return dict(
        gap=gap,
        weights=w,
        mask=mask,
        student_logp=old,
        teacher_logp=(teacher.detach().float().cpu().numpy() if teacher is not None else np.zeros(T, dtype=np.float32)),
        cu_seqlens=np.asarray(layout.offsets, dtype=np.int64),
        row_traj=rb.traj_id.cpu().numpy(),
        row_turn=rb.turn.cpu().numpy(),
        traj_reward=rb.reward.float().cpu().numpy(),
    )
