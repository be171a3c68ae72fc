"""The math of a training step, as pure functions over tensors: the segmented PCSD weights op
(:mod:`pcsd.ops.kernels`, native C++/CUDA kernels registered as a torch custom op) and its plain
PyTorch reference (:mod:`pcsd.ops.reference`), PCSD's default parameters (:mod:`pcsd.ops.defaults`),
the weighting rules chosen by name (:mod:`pcsd.ops.weighting`: pcsd, sdar, uniform, rlsd and the
ablations), GRPO's advantages and the policy losses chosen by name (:mod:`pcsd.ops.grpo`), the
distillation losses and the update's per-token loss (:mod:`pcsd.ops.losses`) and packed selective
log-probs without full logits (:mod:`pcsd.ops.scoring`).

Imports only torch and the native module: nothing of envs, text, rollout, eval or train. The op's
names below load :mod:`pcsd.ops.kernels` (and torch) on first use, so that reading
:mod:`pcsd.ops.defaults` (the config schema does) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pcsd.ops.kernels import PcsdStats, kernel_for, pcsd_weights, pcsd_weights_padded

__all__ = ["PcsdStats", "kernel_for", "pcsd_weights", "pcsd_weights_padded"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pcsd.ops import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'pcsd.ops' has no attribute {name!r}")
