"""The math of a training step, as pure functions over tensors: the segmented PCSD weights op
(:mod:`pcsd.ops.kernels`, native C++/CUDA kernels registered as a torch custom op) and its plain
PyTorch reference (:mod:`pcsd.ops.reference`), the weighting rules chosen by name
(:mod:`pcsd.ops.weighting`: pcsd, sdar, uniform, rlsd and the ablations), GRPO's advantages and
per-token terms (:mod:`pcsd.ops.grpo`), the distillation losses (:mod:`pcsd.ops.losses`) and packed
selective log-probs without full logits (:mod:`pcsd.ops.scoring`).

Imports only torch and the native module: nothing of envs, text, rollout, eval or train.
"""

from pcsd.ops.kernels import PcsdStats, kernel_for, pcsd_weights, pcsd_weights_padded

__all__ = ["PcsdStats", "kernel_for", "pcsd_weights", "pcsd_weights_padded"]
