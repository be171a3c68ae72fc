"""PCSD's default parameters, written once (the paper's Method section and its hyperparameter table).

Every place that needs a default reads it from here: the op's wrapper
(:func:`pcsd.ops.kernels.pcsd_weights`), the plain references (:mod:`pcsd.ops.reference`), the
weighting rules (:mod:`pcsd.ops.weighting`), the config schema (``algo.pcsd``,
:mod:`pcsd.train.config`) and the op's benchmark cases (:mod:`pcsd.bench.op_cases`). The native
kernels' contract ``csrc/pcsd_kernels.h`` (``struct PcsdParams``) repeats them for C++ callers;
``tests/test_ops.py`` parses the header and checks that its defaults equal these.

This module imports nothing (not even torch), so the config schema can read it cheaply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["PcsdDefaults", "PCSD_DEFAULTS"]


@dataclass(frozen=True)
class PcsdDefaults:
    """The segmented PCSD weights' parameters (see :mod:`pcsd.ops.kernels` for the math)."""

    n_min: int = 1  # the short window (tokens)
    n_max: int = 8  # the long window (tokens)
    alpha: float = 0.8  # decay inside a window, in (0, 1]
    tau_low: float = 0.05  # variance below which the short window alone is used
    tau_high: float = 0.5  # variance above which the long window alone is used
    gamma: float = 0.3  # strength of the one-sided (negative) trend modulation
    beta_gate: float = 5.0  # sharpness of the sigmoid gate (every gated rule reads it)
    eps_slope: float = 1e-6  # stabiliser of the windowed slope's denominator
    eps_scale: float = 1e-6  # stabiliser of the response-level gap scale

    def as_dict(self) -> dict[str, int | float]:
        """``{name: value}`` of all nine parameters, in the op's argument order."""
        return asdict(self)


PCSD_DEFAULTS = PcsdDefaults()
