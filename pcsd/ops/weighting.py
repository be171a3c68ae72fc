"""Weighting rules compared in the paper, in one registry chosen by name.

A rule gives the update what it needs through one method, :meth:`WeightRule.terms`: it reads the
packed per-token terms of whole response turns (:class:`pcsd.ops.losses.TokenTerms`: the gaps,
old/teacher log-probs, mask, ``cu_seqlens``, trajectory ids and the estimator's advantages) and
the update's number, and returns a :class:`RuleTerms`: the advantages the policy-gradient term
uses, per-token distillation weights (recorded, and read by its loss term) and a per-token loss
term of the student's log-probs, which the update adds as ``algo.lambda_distill`` x its token-mean
over the batch's valid tokens. The update never asks what a rule is.

A rule is registered with :func:`register_rule` as one of four kinds, each a way of writing
``terms`` (so the trainer picks any method with ``rule=<name>``):

* ``weights`` rules map packed gaps to per-token distillation weights ``w`` ``[T]``, whose loss
  term is the paper's ``m w (sg(teacher) - student)`` (:func:`pcsd.ops.losses.pcsd_loss`):
  ``pcsd`` (default) and its ablations ``pcsd-fixed-n1``, ``pcsd-fixed-n4``, ``pcsd-no-trend``,
  ``pcsd-no-decay``; ``uniform`` (GRPO+OPSD: the gate with beta_gate = 0, a constant for every
  valid token); ``sdar`` (pointwise ``sigmoid(beta_gate sg(delta))``, as the public SDAR code);
  ``sdar-norm`` (the same gates divided by their mean over each response's valid tokens:
  normalised weights that compete within a response).
* ``advantage`` rules transform the GRPO advantage per token instead: ``rlsd``,
  ``A_t = A ((1 - lam) + lam clip(exp(sign(A) delta_t), 0.8, 1.2))`` with lam decaying linearly
  from 0.5 to 0 over 100 updates (:func:`rlsd_lambda`, the public code's schedule).
* ``loss`` rules replace the weighted distillation loss by their own per-token loss, added as
  ``lambda * token-mean``: ``skill-sd`` (Skill-SD, as the public SDAR code defines it: the k3
  estimator of KL(student || teacher) times the on-policy ratio, :func:`pcsd.ops.losses.skill_sd_token_loss`;
  GRPO's advantages are left unchanged).
* ``terms`` rules are the method itself: ``fn(terms, step, **params) -> RuleTerms``.
* ``batch`` rules set the advantages from the whole batch before any micro-batch (a turn's
  advantage reads its trajectory's other turns and its group): ``fn(rows, step, **params) -> [T]``
  with ``rows`` a :class:`RowBatch`; the update calls :meth:`WeightRule.batch_advantages` once
  (with log pi_old scored before the update, ``needs_old``) and the micro-batches' terms keep
  those advantages. ``agentopsd`` (AgentOPSD's turn-level belief multiplier,
  :func:`agentopsd_advantages`).

A ``loss`` rule ``sdpo`` is SDPO's sampled-token self-distillation loss with its importance-weight
cap (:func:`pcsd.ops.losses.sdpo_token_loss`).

Where a turn has no teacher context (``TokenTerms.teacher_mask``: ``algo.teacher_context=group-success``
and a group without another success, no skills), its gaps are 0 and a rule's weights and loss
term are 0 on its tokens (``TokenTerms.distill_mask``).

``algo.distill=false`` turns a distillation rule (``distills``: every kind but ``advantage``)
off: the update then runs :func:`active_rule`'s rule that changes nothing and scores no teacher.

Every gated rule (``pcsd`` and its ablations, ``sdar``, ``sdar-norm``) takes its sharpness as
the one parameter ``beta_gate`` (the config's ``algo.pcsd.beta_gate``). A rule's ``pins`` are the
parameter values that define it (``pcsd-fixed-n4``: ``n_min=4``, ``pcsd-no-decay``: ``alpha=1``): a
config that sets them otherwise does not run that rule, and :mod:`pcsd.train.config` refuses it.
A rule's ``defaults`` name exactly the parameters it reads (``uniform``, the gate at beta_gate = 0
by definition, reads none of the gate's).

OPSD alone (distillation and the KL penalty without the policy-gradient term) and Skill-GRPO (the student sees the skills
during training) are trainer settings, not weighting rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Literal, Mapping, NamedTuple, Optional

import torch
from torch import Tensor

from pcsd.ops.defaults import PCSD_DEFAULTS
from pcsd.ops.kernels import pcsd_weights
from pcsd.ops.losses import RuleLoss, TokenTerms, pcsd_token_loss, sdpo_token_loss, skill_sd_token_loss
from pcsd.ops.segments import segment_sum

__all__ = [
    "WeightRule",
    "RuleTerms",
    "register_rule",
    "get_rule",
    "active_rule",
    "uses_teacher",
    "NO_RULE",
    "available_rules",
    "rlsd_advantages",
    "RowBatch",
    "agentopsd_advantages",
]

RuleKind = Literal["weights", "advantage", "loss", "terms", "batch"]


class RowBatch(NamedTuple):
    """The whole batch as a ``batch`` rule reads it: T packed response tokens in R rows (response
    turns), N trajectories."""

    advantages: Tensor  # [T] the estimator's per-token advantages
    gap: Tensor  # [T] log pi_teacher - log pi_old (0 where the turn has no teacher context)
    offsets: Tensor  # [R+1] int64 row r's tokens are offsets[r]:offsets[r+1]
    row_traj: Tensor  # [R] int64 each row's trajectory, in [0, N)
    row_turn: Tensor  # [R] int64 each row's turn within its trajectory
    traj_group: Tensor  # [N] int64 each trajectory's group
    won: Tensor  # [N] bool each trajectory's success


class RuleTerms(NamedTuple):
    """What a rule gives the update for ``n`` packed tokens."""

    advantages: Tensor  # [n] the advantages of the policy-gradient term (the estimator's, or transformed)
    weights: Optional[Tensor] = None  # [n] distillation weights, 0 at masked positions (None: none)
    loss: Optional[RuleLoss] = None  # per-token loss term of the student's log-probs (None: none)


@dataclass(frozen=True)
class WeightRule:
    """A named rule. ``fn`` takes ``(gap, cu_seqlens, mask, **params)`` for ``weights`` rules,
    ``(advantages, gap, mask, step, **params)`` for ``advantage`` rules, ``(student_logp,
    teacher_logp, old_logp, mask, **params)`` for ``loss`` rules (the per-token loss ``[T]``, 0 at
    masked positions) and ``(terms, step, **params)`` for ``terms`` rules; calling the rule calls
    ``fn`` with its defaults. :meth:`terms` is what the update calls, whatever the kind."""

    name: str
    kind: RuleKind
    fn: Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)  # the parameters it reads, with defaults
    doc: str = ""
    pins: dict[str, Any] = field(default_factory=dict)  # parameter values that define the rule
    needs_teacher: bool = True  # the update scores the teacher (gaps, teacher log-probs) for it
    distills: bool = True  # algo.distill=false turns it off (see active_rule)

    @property
    def needs_old(self) -> bool:
        """The update scores log pi_old before its passes (a ``batch`` rule reads every turn's gaps first)."""
        return self.kind == "batch"

    def batch_advantages(self, rows: RowBatch, step: int, **params: Any) -> Tensor:
        """``[T]`` the advantages of the whole batch: a ``batch`` rule's, ``rows.advantages`` for
        every other kind (their advantages are per micro-batch, :meth:`terms`)."""
        if self.kind != "batch":
            return rows.advantages
        return self.fn(rows, step, **self._params(params))

    def _params(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(overrides) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"rule {self.name!r} has no parameter(s) {sorted(unknown)}; valid: {sorted(self.defaults)}"
            )
        return {**self.defaults, **overrides}

    def __call__(self, *args: Any, **overrides: Any) -> Any:
        return self.fn(*args, **self._params(overrides))

    def params_from(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters this rule reads, taken from ``settings`` (the config's ``algo.pcsd``)."""
        return {k: settings[k] for k in self.defaults if k in settings}

    def terms(self, t: TokenTerms, step: int, **params: Any) -> RuleTerms:
        """The rule's contribution for the packed per-token terms ``t`` of whole response turns
        (:class:`pcsd.ops.losses.TokenTerms`; ``t.advantages`` the estimator's) at update number
        ``step`` (1 at the first update): see :class:`RuleTerms`."""
        return _TERMS[self.kind](self.fn, t, step, self._params(params))


def _weighted_loss(lp: Tensor, t: TokenTerms) -> Tensor:
    """The ``weights`` rules' loss term: ``m w (sg(teacher) - student)`` per token."""
    if t.teacher_logp is None or t.weights is None:
        raise ValueError("a weights rule's loss term needs the teacher's log-probs and the weights")
    return pcsd_token_loss(lp, t.teacher_logp, t.weights, t.mask)


def _loss_kind_term(fn: Callable[..., Tensor], p: dict[str, Any], lp: Tensor, t: TokenTerms) -> Tensor:
    if t.teacher_logp is None:
        raise ValueError("a loss rule's term needs the teacher's log-probs")
    return fn(lp, t.teacher_logp, t.old_logp, t.distill_mask, **p)


#: kind -> ``(fn, terms, step, params) -> RuleTerms``: how a rule of that kind gives its terms
_TERMS: dict[str, Callable[[Callable[..., Any], TokenTerms, int, dict[str, Any]], RuleTerms]] = {
    "weights": lambda fn, t, step, p: RuleTerms(
        t.advantages, fn(t.gap, t.cu_seqlens, t.distill_mask, **p), _weighted_loss
    ),
    "advantage": lambda fn, t, step, p: RuleTerms(fn(t.advantages, t.gap, t.mask, step, **p)),
    "loss": lambda fn, t, step, p: RuleTerms(t.advantages, None, partial(_loss_kind_term, fn, p)),
    "terms": lambda fn, t, step, p: fn(t, step, **p),
    "batch": lambda fn, t, step, p: RuleTerms(t.advantages),  # set for the whole batch (batch_advantages)
}

_RULES: dict[str, WeightRule] = {}


def register_rule(
    name: str,
    kind: RuleKind,
    doc: str = "",
    pins: Optional[dict[str, Any]] = None,
    *,
    needs_teacher: bool = True,
    distills: Optional[bool] = None,
    **defaults: Any,
) -> Callable:
    """Decorator registering ``fn`` under ``name`` with default parameters (the ones it reads) and
    ``pins``, the parameter values that define it. ``distills`` defaults to ``kind`` not ``advantage``
    or ``batch`` (advantage transforms stay on under ``algo.distill=false``)."""
    if kind not in _TERMS:
        raise ValueError(f"kind must be one of {sorted(_TERMS)}, got {kind!r}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _RULES:
            raise ValueError(f"weighting rule {name!r} is already registered")
        _RULES[name] = WeightRule(
            name,
            kind,
            fn,
            dict(defaults),
            doc or (fn.__doc__ or ""),
            dict(pins or {}),
            needs_teacher,
            kind not in ("advantage", "batch") if distills is None else distills,
        )
        return fn

    return deco


def get_rule(name: str) -> WeightRule:
    """The rule registered as ``name``; ValueError listing the valid names otherwise."""
    try:
        return _RULES[name]
    except KeyError:
        raise ValueError(f"unknown weighting rule {name!r}; valid: {available_rules()}") from None


def available_rules(kind: Optional[RuleKind] = None) -> list[str]:
    return sorted(n for n, r in _RULES.items() if kind is None or r.kind == kind)


#: what an update runs when algo.distill=false turns its rule off: the advantages as they are,
#: no weights, no loss term, no teacher scored (GRPO alone). Not a registered name.
NO_RULE = WeightRule(
    "none",
    "terms",
    lambda t, step: RuleTerms(t.advantages),
    doc="no distillation: the advantages as they are",
    needs_teacher=False,
    distills=False,
)


def active_rule(name: str, distill: bool) -> WeightRule:
    """The rule an update with ``rule=name`` and ``algo.distill=distill`` runs: the named rule, or
    :data:`NO_RULE` where ``distill`` is false and the rule ``distills`` (an advantage transform such
    as ``rlsd`` stays on)."""
    rule = get_rule(name)
    return rule if distill or not rule.distills else NO_RULE


def uses_teacher(cfg: Any) -> bool:
    """Whether a run with config ``cfg`` (its ``rule`` and ``algo.distill``) scores a teacher: the
    rule :func:`active_rule` picks needs one (distillation, RLSD). Without one the rule, the gap and
    the gate mean nothing: the console, the metrics and the episode log leave them out."""
    return active_rule(str(cfg.rule), bool(cfg.algo.distill)).needs_teacher


def _pcsd_variant(name: str, doc: str, adaptive: bool = True, trend: bool = True, **pins: Any) -> None:
    """A PCSD variant reading the parameters its mechanisms use (a fixed window has no variance
    interpolation, so no tau_low / tau_high; no trend, no gamma), ``pins`` fixed at their values."""
    unread = ({"tau_low", "tau_high"} if not adaptive else set()) | ({"gamma"} if not trend else set())

    def fn(gap: Tensor, cu_seqlens: Tensor, mask: Optional[Tensor] = None, **p: Any) -> Tensor:
        w = pcsd_weights(gap, cu_seqlens, mask, adaptive=adaptive, trend=trend, **p)
        assert isinstance(w, Tensor)  # the weights alone (return_stats is not a rule parameter)
        return w

    defaults = {k: v for k, v in {**PCSD_DEFAULTS.as_dict(), **pins}.items() if k not in unread}
    register_rule(name, "weights", doc, pins=pins, **defaults)(fn)


_pcsd_variant("pcsd", "PCSD: adaptive decayed aggregation, one-sided trend, sigmoid gate.")
_pcsd_variant(
    "pcsd-fixed-n1", "Ablation: decayed mean over a fixed window N=1 (pointwise), trend kept.", adaptive=False, n_min=1
)
_pcsd_variant("pcsd-fixed-n4", "Ablation: decayed mean over a fixed window N=4, trend kept.", adaptive=False, n_min=4)
_pcsd_variant("pcsd-no-trend", "Ablation: eta = 1.", trend=False)
_pcsd_variant("pcsd-no-decay", "Ablation: uniform weights inside the windows (alpha = 1).", alpha=1.0)


def _check_gap_mask(gap: Tensor, mask: Optional[Tensor]) -> Tensor:
    if not isinstance(gap, Tensor) or not gap.dtype.is_floating_point:
        raise ValueError(f"gap must be a floating tensor, got {getattr(gap, 'dtype', type(gap))}")
    if mask is None:
        return torch.ones_like(gap)
    if not isinstance(mask, Tensor) or mask.shape != gap.shape:
        raise ValueError(f"mask must be a tensor of gap's shape {tuple(gap.shape)}")
    return mask.to(gap.dtype)


@register_rule("uniform", "weights", constant=0.5)
def _uniform(gap: Tensor, cu_seqlens: Tensor, mask: Optional[Tensor] = None, *, constant: float) -> Tensor:
    """GRPO+OPSD: the gate with beta_gate = 0, i.e. ``constant`` (0.5) for every valid token."""
    if not 0.0 <= constant:
        raise ValueError(f"constant must be >= 0, got {constant!r}")
    return _check_gap_mask(gap, mask) * constant


def _sdar_gates(gap: Tensor, mask: Optional[Tensor], beta_gate: float) -> tuple[Tensor, Tensor]:
    """``(sigmoid(beta_gate sg(delta)) m, m)``: the SDAR gates, 0 at masked positions."""
    if not beta_gate >= 0:
        raise ValueError(f"beta_gate must be >= 0, got {beta_gate!r}")
    m = _check_gap_mask(gap, mask)
    g = torch.where(m > 0, gap.detach(), torch.zeros_like(gap))
    return torch.sigmoid(beta_gate * g) * m, m


@register_rule("sdar", "weights", beta_gate=PCSD_DEFAULTS.beta_gate)
def _sdar(gap: Tensor, cu_seqlens: Tensor, mask: Optional[Tensor] = None, *, beta_gate: float) -> Tensor:
    """SDAR: pointwise ``w = sigmoid(beta_gate sg(delta))`` on valid tokens (beta_gate = 5), as the
    public SDAR code's ``compute_sdar_loss`` (no normalisation)."""
    return _sdar_gates(gap, mask, beta_gate)[0]


@register_rule("sdar-norm", "weights", beta_gate=PCSD_DEFAULTS.beta_gate)
def _sdar_norm(gap: Tensor, cu_seqlens: Tensor, mask: Optional[Tensor] = None, *, beta_gate: float) -> Tensor:
    """SDAR with normalised weights: ``w_t = g_t / mean_s g_s``, ``g = sigmoid(beta_gate sg(delta))``,
    the mean over the valid tokens of ``t``'s response (its ``cu_seqlens`` segment). A response's
    weights average 1, so its tokens compete: raising one token's gate lowers every other
    token's weight. 0 at masked positions and in a response without valid tokens."""
    g, m = _sdar_gates(gap, mask, beta_gate)
    cu = cu_seqlens.to(device=gap.device, dtype=torch.int64)
    if cu.dim() != 1 or cu.numel() < 1 or int(cu[0]) != 0 or int(cu[-1]) != gap.numel() or bool((cu.diff() < 0).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to T={gap.numel()}, got {cu.tolist()[:8]}")
    # per-response float64 sums, deterministic on every device (no atomics) and without the
    # cancellation of prefix-sum differences (a response of tiny gates after large ones)
    lens = cu.diff()
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=g.device), lens, output_size=gap.numel())
    gsum, cnt = (segment_sum(x.double(), seg, lens.numel()) for x in (g, m))
    mean = torch.where(cnt > 0, gsum / cnt.clamp_min(1.0), torch.ones_like(gsum))
    return g / mean[seg].to(g.dtype)


def rlsd_lambda(step: int, lam0: float = 0.5, decay_steps: int = 100) -> float:
    """RLSD mixing coefficient at update number ``step``: ``lam0 (1 - step / decay_steps)``, 0 from
    ``decay_steps`` on. ``step`` counts updates from 1, as the public RLSD trainer's
    ``global_steps`` (``_get_rlsd_lambda``): the first update mixes with ``0.5 x 0.99 = 0.495``, the
    100th and later with 0; ``step = 0`` (no update yet) gives ``lam0``."""
    if decay_steps <= 0:
        raise ValueError(f"decay_steps must be > 0, got {decay_steps!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    return lam0 * max(0.0, 1.0 - step / decay_steps)


@register_rule("rlsd", "advantage", lam0=0.5, decay_steps=100, clip_low=0.8, clip_high=1.2)
def rlsd_advantages(
    advantages: Tensor,
    gap: Tensor,
    mask: Optional[Tensor] = None,
    step: int = 0,
    *,
    lam0: float = 0.5,
    decay_steps: int = 100,
    clip_low: float = 0.8,
    clip_high: float = 1.2,
) -> Tensor:
    """RLSD: ``A_t = A ((1 - lam) + lam clip(exp(sign(A) sg(delta_t)), clip_low, clip_high))``.

    ``advantages`` and ``gap`` are per token (same shape); ``lam = rlsd_lambda(step)`` with
    ``step`` the update's number, 1 for the first (:func:`pcsd.train.update.update_step` passes
    its 0-based step + 1). Masked positions return 0.
    """
    if not isinstance(advantages, Tensor) or advantages.shape != gap.shape:
        raise ValueError(f"advantages must be a tensor of gap's shape {tuple(gap.shape)}")
    if not clip_low <= clip_high:
        raise ValueError(f"clip_low must be <= clip_high, got {clip_low!r} > {clip_high!r}")
    m = _check_gap_mask(gap, mask)
    lam = rlsd_lambda(step, lam0, decay_steps)
    g = torch.where(m > 0, gap.detach(), torch.zeros_like(gap))
    factor = torch.exp(torch.sign(advantages) * g).clamp(clip_low, clip_high)
    return advantages * ((1.0 - lam) + lam * factor) * m


@register_rule("skill-sd", "loss", neg_clamp=20.0, ratio_clamp=10.0)
def _skill_sd(
    student_logp: Tensor,
    teacher_logp: Tensor,
    old_logp: Tensor,
    mask: Optional[Tensor] = None,
    *,
    neg_clamp: float,
    ratio_clamp: float,
) -> Tensor:
    """Skill-SD: per token ``exp(min(log pi - log pi_old, 10)) (exp(min(-l, 20)) - 1 + l)``,
    ``l = log pi - sg(log pi_teacher)``; the trainer adds ``lambda`` x its token-mean."""
    m = _check_gap_mask(student_logp.detach(), mask)
    return skill_sd_token_loss(student_logp, teacher_logp, old_logp, neg_clamp=neg_clamp, ratio_clamp=ratio_clamp) * m


@register_rule("sdpo", "loss", is_clip=2.0)
def _sdpo(
    student_logp: Tensor, teacher_logp: Tensor, old_logp: Tensor, mask: Optional[Tensor] = None, *, is_clip: float
) -> Tensor:
    """SDPO: per token ``min(rho, is_clip) sg(log pi - log pi_teacher) log pi`` (``rho`` the on-policy
    ratio, detached; is_clip 2, the SDPO code's and TRL's default); the trainer adds ``lambda`` x
    its token-mean."""
    m = _check_gap_mask(student_logp.detach(), mask)
    return sdpo_token_loss(student_logp, teacher_logp, old_logp, is_clip=is_clip) * m


@register_rule(
    "agentopsd",
    "batch",
    distills=False,
    mult_lambda=0.5,
    mult_band=0.2,
    eps=1e-6,
    prior_clip=1e-4,
)
def agentopsd_advantages(
    rows: RowBatch,
    step: int = 0,
    *,
    mult_lambda: float = 0.5,
    mult_band: float = 0.2,
    eps: float = 1e-6,
    prior_clip: float = 1e-4,
) -> Tensor:
    """AgentOPSD's turn-level advantage (the public code's ``compute_opsd_turn_advantage`` with
    ``belief_mult``, ``signed``, ``belief_gate`` and ``mult_signed`` on, as its ALFWorld script).

    Per trajectory, turns in order: ``d_k`` the turn's summed gap, the belief
    ``V_k = clamp(sigmoid(logit V_0 + sum_{j <= k} d_j), eps, 1 - eps)`` with the prior ``V_0`` the
    group's success rate clamped to ``[prior_clip, 1 - prior_clip]``, its change
    ``q_k = V_k - V_{k-1}`` (``V_{-1} = V_0``) standardised over the trajectory's turns
    ``z_k = (q_k - mean q) / (std q + eps)`` (population std; one turn: 0), the multiplier
    ``m_k = clamp(1 + mult_band sign(A_k) z_k, 1 - mult_band, 1 + mult_band)`` and the turn's
    advantage ``A_k ((1 - mult_lambda) + mult_lambda m_k)``, ``A_k`` the estimator's. ``[T]``."""
    if not 0.0 <= mult_band < 1.0:
        raise ValueError(f"mult_band must be in [0, 1), got {mult_band!r}")
    if not 0.0 < prior_clip < 0.5:
        raise ValueError(f"prior_clip must be in (0, 0.5), got {prior_clip!r}")
    adv, dev = rows.advantages, rows.advantages.device
    off = rows.offsets.to(device=dev, dtype=torch.int64)
    R = off.numel() - 1
    if R == 0 or adv.numel() == 0:
        return adv
    lens = off.diff()
    tok_row = torch.repeat_interleave(torch.arange(R, device=dev), lens, output_size=adv.numel())
    d = segment_sum(rows.gap.detach().to(torch.float64), tok_row, R)  # [R] summed gap per turn
    a = torch.where(lens > 0, adv.to(torch.float64)[off[:-1].clamp_max(adv.numel() - 1)], 0.0)
    traj = rows.row_traj.to(dev)
    # the prior: each trajectory's group success rate
    _, gid = torch.unique(rows.traj_group.to(dev), return_inverse=True)
    G = int(gid.max()) + 1
    won = rows.won.to(device=dev, dtype=torch.float64)
    rate = segment_sum(won, gid, G) / segment_sum(torch.ones_like(won), gid, G)
    v0 = rate[gid].clamp(prior_clip, 1.0 - prior_clip)[traj]  # [R]
    # rows in (trajectory, turn) order; a segment per trajectory
    order = torch.argsort(traj * (int(rows.row_turn.max()) + 1) + rows.row_turn.to(dev))
    t_s, d_s, a_s, v0_s = traj[order], d[order], a[order], v0[order]
    first = torch.ones(R, dtype=torch.bool, device=dev)
    first[1:] = t_s[1:] != t_s[:-1]
    seg = torch.cumsum(first.long(), 0) - 1
    n_seg = int(seg[-1]) + 1
    csum = torch.cumsum(d_s, 0)
    start = csum[first] - d_s[first]  # the sum before each trajectory's first turn
    cum = csum - start[seg]
    v = torch.sigmoid(torch.log(v0_s / (1.0 - v0_s)) + cum).clamp(eps, 1.0 - eps)
    v_prev = torch.where(first, v0_s, torch.roll(v, 1))
    q = v - v_prev
    cnt = segment_sum(torch.ones_like(q), seg, n_seg)
    mean = segment_sum(q, seg, n_seg) / cnt
    std = (segment_sum((q - mean[seg]) ** 2, seg, n_seg) / cnt).sqrt()
    z = (q - mean[seg]) / (std[seg] + eps)
    m = (1.0 + mult_band * torch.sign(a_s) * z).clamp(1.0 - mult_band, 1.0 + mult_band)
    out_s = a_s * ((1.0 - mult_lambda) + mult_lambda * m)
    out = torch.empty_like(out_s)
    out[order] = out_s
    return torch.repeat_interleave(out, lens, output_size=adv.numel()).to(adv.dtype)
