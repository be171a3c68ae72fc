"""The optimizer, made in one place for the trainer, the warm-up and the benchmarks.

AdamW's implementation follows the device the parameters train on:

* CUDA: ``fused=True``, one kernel per parameter group that updates weights and both moments in
  place. torch's default there, ``foreach``, computes ``sqrt`` of the second moments for every
  parameter at once (``torch._foreach_sqrt``): a parameter-sized float32 temporary at the step,
  11.5 GiB at 3 B parameters, which the memory plan (:mod:`pcsd.train.plan`) then has to count.
* elsewhere: torch's default (``foreach`` on other accelerators, the per-parameter loop on CPU),
  so CPU runs, their checkpoints and their tests are exactly what they were.

The choice belongs to the machine, not to a checkpoint: loading an optimizer state (a resume, a
checkpoint written on another device) keeps this optimizer's implementation, and torch then puts
each ``step`` counter where that implementation wants it (fused: a float32 tensor on the
parameter's device).
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

import torch

__all__ = ["AdamWKind", "adamw_kind", "make_adamw", "plan_adamw_kind"]

AdamWKind = Literal["fused", "foreach"]


def adamw_kind(device: torch.device | str) -> AdamWKind:
    """``"fused"`` for parameters on a CUDA device, else ``"foreach"`` (torch's default, which is
    the per-parameter loop on CPU and needs no temporary beyond one parameter there)."""
    return "fused" if torch.device(device).type == "cuda" else "foreach"


def plan_adamw_kind() -> AdamWKind:
    """The implementation a run on GPUs uses: what the memory plan counts."""
    return adamw_kind("cuda")


def _keep_implementation(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """Load pre-hook: the saved groups take this optimizer's ``fused``/``foreach`` flags."""
    flags = [{k: g.get(k) for k in ("fused", "foreach")} for g in opt.param_groups]
    groups = [{**saved, **flags[min(i, len(flags) - 1)]} for i, saved in enumerate(state_dict["param_groups"])]
    return {**state_dict, "param_groups": groups}


def make_adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, device: torch.device | str, **kwargs: Any
) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, lr=lr, **kwargs)`` with the implementation of
    :func:`adamw_kind` for ``device`` (the device the parameters train on), kept across
    ``load_state_dict``."""
    if adamw_kind(device) == "fused":
        kwargs = {**kwargs, "fused": True}
    opt = torch.optim.AdamW(params, lr=lr, **kwargs)
    opt.register_load_state_dict_pre_hook(_keep_implementation)
    return opt
