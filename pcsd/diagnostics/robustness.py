"""Rank robustness of token weights under isolated gap spikes (the appendix's first diagnostic).

Gap sequences (:class:`GapSet`: packed ``[T]`` gaps, a valid-token mask and the response turns'
``cu_seqlens``) come from a run's recorded gaps (:func:`gapset_from_records`), from scoring expert
trajectories with a model (:mod:`pcsd.diagnostics.alignment`) or from :func:`synthetic_gaps`.
:func:`inject_spikes` adds spikes of magnitude 3.0 (random sign by default) to a given fraction of
the valid positions; every rule is evaluated on the *same* perturbed sequences.
:func:`rank_robustness` reports, per rule and fraction, the Spearman correlation (scipy) between
the rule's token weights on the original and on the perturbed gaps over all valid tokens, over
seeded repeats (mean, standard deviation, min, max).

Every rule of :mod:`pcsd.ops.weighting` has a per-token weight (:func:`token_weights`): a
``weights`` rule's own weights; an ``advantage`` rule's factor on a positive advantage (RLSD at
step 0: ``0.5 + 0.5 clip(exp(delta), 0.8, 1.2)``); a ``loss`` rule's pull on the token's
log-prob, ``-dL_t / d log pi`` at ``pi = pi_old`` (for the weighted loss of the ``weights`` rules
this is exactly ``w``; for Skill-SD it is the signed gap itself); a ``batch`` rule's factor on a
positive advantage with the segments taken as the turns of one episode in a group of two, one won
(AgentOPSD: ``0.5 + 0.5 m_k``, constant over a turn's tokens).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from pcsd.ops.weighting import RowBatch, available_rules, get_rule

__all__ = [
    "GapSet",
    "synthetic_gaps",
    "gapset_from_records",
    "inject_spikes",
    "token_weights",
    "spearman",
    "rank_robustness",
    "FRACTIONS",
    "PAPER_RANK_ROBUSTNESS",
]

FRACTIONS = (0.01, 0.05, 0.10)
#: the paper's Figure "rank preservation" (mean Spearman at 1 / 5 / 10 %)
PAPER_RANK_ROBUSTNESS = {"pcsd": (0.985, 0.934, 0.887), "sdar": (0.986, 0.929, 0.864)}


@dataclass
class GapSet:
    """Packed gap sequences: ``gap`` ``[T]`` float32, ``mask`` ``[T]`` bool, ``cu_seqlens``
    ``[S+1]`` int64 (one segment per response turn)."""

    gap: np.ndarray
    mask: np.ndarray
    cu_seqlens: np.ndarray
    source: str = ""

    def __post_init__(self):
        self.gap = np.asarray(self.gap, dtype=np.float32)
        self.mask = np.asarray(self.mask, dtype=bool)
        self.cu_seqlens = np.asarray(self.cu_seqlens, dtype=np.int64)
        if self.gap.ndim != 1 or self.mask.shape != self.gap.shape:
            raise ValueError(f"gap and mask must be 1-D of one shape, got {self.gap.shape} and {self.mask.shape}")
        cu = self.cu_seqlens
        if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or cu[-1] != self.gap.size or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens must rise from 0 to T={self.gap.size}, got {cu[:5]}...{cu[-3:]}")

    @property
    def num_valid(self) -> int:
        return int(self.mask.sum())


def synthetic_gaps(
    num_segments: int = 256,
    min_len: int = 8,
    max_len: int = 64,
    seed: int = 0,
    phi: float = 0.7,
    noise: float = 0.5,
    masked_share: float = 0.05,
) -> GapSet:
    """Synthetic teacher-student gaps with local persistence: per response turn a level drawn from
    N(-0.3, 0.5) (the teacher mostly slightly below the student, as measured on the tiny default)
    plus a stationary AR(1) process (coefficient ``phi``, marginal std ``noise``), so neighbouring
    tokens agree; lengths uniform in ``[min_len, max_len]``; ``masked_share`` of the tokens masked
    (invalid) at random."""
    if not 0 <= phi < 1 or noise < 0 or not 1 <= min_len <= max_len or num_segments < 1:
        raise ValueError("synthetic_gaps: need 0 <= phi < 1, noise >= 0, 1 <= min_len <= max_len, num_segments >= 1")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_segments)
    parts = []
    innov = noise * math.sqrt(1 - phi * phi)
    for n in lengths:
        level = rng.normal(-0.3, 0.5)
        x = np.empty(n)
        x[0] = rng.normal(0, noise)
        for t in range(1, n):
            x[t] = phi * x[t - 1] + rng.normal(0, innov)
        parts.append(level + x)
    gap = np.concatenate(parts).astype(np.float32)
    mask = rng.random(gap.size) >= masked_share
    cu = np.concatenate([[0], np.cumsum(lengths)])
    return GapSet(gap, mask, cu, source=f"synthetic(seed={seed}, segments={num_segments})")


def gapset_from_records(records: Sequence, max_tokens: int = 0) -> GapSet:
    """One :class:`GapSet` of recorded steps (:func:`pcsd.train.gaps.load_gap_records`) back to
    back; ``max_tokens`` > 0 keeps whole steps up to that many tokens (at least one step)."""
    if not records:
        raise ValueError("no gap records")
    gaps, masks, cus, off, kept = [], [], [], 0, 0
    for r in records:
        if max_tokens and kept and off + r.num_tokens > max_tokens:
            break
        gaps.append(r.gap)
        masks.append(r.mask)
        cus.append(np.asarray(r.cu_seqlens[1:], dtype=np.int64) + off)
        off += r.num_tokens
        kept += 1
    steps = [int(r.step) for r in records[:kept]]
    return GapSet(
        np.concatenate(gaps),
        np.concatenate(masks),
        np.concatenate([[0]] + cus),
        source=f"recorded steps {steps[0]}..{steps[-1]} ({kept} records, rule {records[0].rule})",
    )


def inject_spikes(
    gs: GapSet, fraction: float, magnitude: float = 3.0, seed: int = 0, sign: str = "both"
) -> tuple[np.ndarray, np.ndarray]:
    """``(perturbed gap, positions)``: ``round(fraction * valid)`` distinct valid positions drawn
    with ``seed`` get ``+magnitude`` (``sign="positive"``), ``-magnitude`` (``"negative"``) or
    either with probability 1/2 (``"both"``) added. Masked positions are never touched."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if sign not in ("both", "positive", "negative"):
        raise ValueError(f"sign must be both, positive or negative, got {sign!r}")
    rng = np.random.default_rng(seed)
    valid = np.flatnonzero(gs.mask)
    k = int(round(fraction * valid.size))
    pos = np.sort(rng.choice(valid, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
    if sign == "both":
        s = rng.choice(np.array([-1.0, 1.0]), size=k)
    else:
        s = np.full(k, 1.0 if sign == "positive" else -1.0)
    out = gs.gap.copy()
    out[pos] += (magnitude * s).astype(np.float32)
    return out, pos


def token_weights(rule_name: str, gap: np.ndarray, mask: np.ndarray, cu_seqlens: np.ndarray, **params) -> np.ndarray:
    """``[T]`` float64 per-token weights of a registered rule (see the module docstring)."""
    rule = get_rule(rule_name) if isinstance(rule_name, str) else rule_name
    g = torch.as_tensor(np.asarray(gap, dtype=np.float32))
    m = torch.as_tensor(np.asarray(mask, dtype=bool))
    cu = torch.as_tensor(np.asarray(cu_seqlens, dtype=np.int64))
    if rule.kind == "weights":
        w = rule(g, cu, m, **params)
    elif rule.kind == "advantage":
        w = rule(torch.ones_like(g), g, m, 0, **params)
    elif rule.kind == "batch":  # the multiplier of a unit advantage: the segments the turns of one episode, prior 0.5
        R = cu.numel() - 1
        one = torch.zeros(R, dtype=torch.int64)
        rows = RowBatch(
            torch.ones_like(g),
            g * m,
            cu,
            one,
            torch.arange(R),
            torch.zeros(2, dtype=torch.int64),
            torch.tensor([True, False]),
        )
        w = rule.batch_advantages(rows, 0, **params)
    else:  # loss: -dL_t/dlogp at logp = logp_old, teacher = student + gap
        lp = torch.zeros_like(g, requires_grad=True)
        per = rule(lp, g, torch.zeros_like(g), m, **params)
        (grad,) = torch.autograd.grad(per.sum(), lp)
        w = -grad
    return (w.detach().double() * m.double()).numpy()


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``). Two identical constant vectors (a
    rule whose weights do not depend on the gap, e.g. ``uniform``) keep their ranking: 1.0;
    otherwise a constant input gives NaN."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size < 2:
        return float("nan")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 1.0 if np.array_equal(a, b) else float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(a, b).statistic)


def rank_robustness(
    gs: GapSet,
    rules: Optional[Iterable[str]] = None,
    fractions: Sequence[float] = FRACTIONS,
    repeats: int = 10,
    magnitude: float = 3.0,
    seed: int = 0,
    sign: str = "both",
    rule_params: Optional[dict] = None,
) -> dict:
    """Per rule and fraction: Spearman(original weights, perturbed weights) over the valid tokens,
    for ``repeats`` seeded draws of spike positions (the same draws for every rule). Returns
    ``{"rules": {rule: {fraction: {"mean", "std", "min", "max", "values"}}}, "num_tokens", ...}``
    (fractions as strings, e.g. ``"0.05"``)."""
    rules = list(rules) if rules is not None else available_rules()
    rule_params = rule_params or {}
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    valid = gs.mask
    base = {r: token_weights(r, gs.gap, gs.mask, gs.cu_seqlens, **rule_params.get(r, {}))[valid] for r in rules}
    out: dict = {r: {} for r in rules}
    for frac in fractions:
        vals: dict[str, list[float]] = {r: [] for r in rules}
        for k in range(repeats):
            pert, _pos = inject_spikes(gs, frac, magnitude, seed=seed * 1_000_003 + k, sign=sign)
            for r in rules:
                w = token_weights(r, pert, gs.mask, gs.cu_seqlens, **rule_params.get(r, {}))[valid]
                vals[r].append(spearman(base[r], w))
        for r in rules:
            v = np.asarray(vals[r], dtype=np.float64)
            ok = v[~np.isnan(v)]
            out[r][f"{frac:g}"] = dict(
                mean=float(ok.mean()) if ok.size else float("nan"),
                std=float(ok.std(ddof=1)) if ok.size > 1 else 0.0,
                min=float(ok.min()) if ok.size else float("nan"),
                max=float(ok.max()) if ok.size else float("nan"),
                values=[float(x) for x in v],
            )
    return dict(
        rules=out,
        fractions=[f"{f:g}" for f in fractions],
        repeats=repeats,
        magnitude=magnitude,
        sign=sign,
        seed=seed,
        num_tokens=int(gs.gap.size),
        num_valid=gs.num_valid,
        num_segments=int(gs.cu_seqlens.size - 1),
        source=gs.source,
        gap_mean=float(gs.gap[gs.mask].mean()) if gs.num_valid else float("nan"),
        gap_std=float(gs.gap[gs.mask].std()) if gs.num_valid else float("nan"),
        kinds={r: get_rule(r).kind for r in rules},
    )
