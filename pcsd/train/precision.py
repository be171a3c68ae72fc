"""Mixed precision for training: fp32 master weights, bf16 compute, a bf16 frozen copy.

What mixed-precision trainers do (verl keeps its actor in fp32 for the reason below):

* the trainable student holds ``model.param_dtype`` parameters (float32: "master weights") and
  AdamW keeps its moments in the same dtype; gradients are clipped and applied there;
* forward and backward run in ``model.compute_dtype``: on one device under
  :func:`torch.autocast` (:func:`pcsd.models.compute_context`), under FSDP2 through
  ``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=float32)`` (:func:`fsdp_policy`);
* the frozen teacher/reference copy (no optimizer, so no master copy needed) is cast to
  ``model.teacher_dtype`` when it is made (:func:`frozen_copy`: no second fp32 copy); a LoRA run
  has no copy: its base weights are frozen in the compute dtype and are the teacher with the
  adapters off, the adapters alone in the parameter dtype (:func:`prepare_lora_student`);
* the generation engine gets its own dtype at every sync, cast (and gathered under FSDP2) a
  bounded bucket at a time (:func:`pcsd.train.distributed.iter_weights`);
* checkpoints keep the master weights and the optimizer state (resume is exact); ``final-model/``
  is written in ``model.export_dtype`` (:func:`export_model`).

Why float32 parameters: AdamW's first steps move each element by about ``lr`` (``lr * m / sqrt(v)``
with ``m / sqrt(v)`` ~ 1). A bfloat16 number has 8 significant bits, so the spacing of representable
values near a weight ``w`` is ``|w| * 2**-7`` (about 1.2e-4 at ``|w| = 0.02``). An update of 1e-6
(the paper's lr) is far below half that spacing and rounds back to ``w``: almost nothing trains.
:func:`check` refuses such a config unless ``optim.allow_low_precision_params=true``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

DTYPES = ("float32", "bfloat16")

__all__ = [
    "DTYPES",
    "Precision",
    "precision_of",
    "check",
    "torch_dtype",
    "prepare_student",
    "prepare_lora_student",
    "frozen_copy",
    "fsdp_policy",
    "export_model",
    "rounding_note",
]


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run (names from :data:`DTYPES`)."""

    param: str = "float32"  # the trained student's parameters and AdamW state
    compute: str = "float32"  # forward/backward (autocast / FSDP param_dtype)
    teacher: str = "float32"  # the frozen teacher/reference copy
    export: str = "float32"  # final-model/

    @property
    def mixed(self) -> bool:
        return self.compute != self.param


def precision_of(cfg: Any) -> Precision:
    m = cfg.model
    return Precision(param=m.param_dtype, compute=m.compute_dtype, teacher=m.teacher_dtype, export=m.export_dtype)


def torch_dtype(name: str):
    import torch

    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def rounding_note(lr: float, w: float = 0.02) -> str:
    spacing = w * 2.0**-7
    return (
        f"a bfloat16 weight of magnitude {w} has a spacing of {spacing:.1e} between representable values, "
        f"so an AdamW update of about lr={lr:g} per element (< half that spacing) rounds back to the old "
        f"weight and almost nothing trains"
    )


def check(cfg: Any) -> Optional[str]:
    """The config's precision problem as one sentence, or None. Pure string checks (no torch)."""
    m = cfg.model
    for key in ("param_dtype", "compute_dtype", "teacher_dtype", "export_dtype"):
        if m[key] not in DTYPES:
            return f"model.{key}={m[key]!r} is not valid; choose one of {', '.join(DTYPES)}"
    trains = cfg.optim.steps > 0 or cfg.optim.sft_steps > 0
    if m.param_dtype != "float32" and trains and not cfg.optim.allow_low_precision_params:
        return (
            f"model.param_dtype={m.param_dtype} with an optimizer: {rounding_note(cfg.optim.lr)}. "
            f"Keep model.param_dtype=float32 (master weights) and set model.compute_dtype=bfloat16 for "
            f"bf16 speed, or set optim.allow_low_precision_params=true to train bf16 weights anyway"
        )
    if m.param_dtype == "bfloat16" and m.compute_dtype == "float32":
        return (
            "model.compute_dtype=float32 with model.param_dtype=bfloat16 computes from bf16 weights in fp32, "
            "which gains no precision; use model.param_dtype=float32 or model.compute_dtype=bfloat16"
        )
    return None


def prepare_student(model, prec: Precision, distributed: bool):
    """Casts the trained model to the parameter dtype and, on one device with a lower compute
    dtype, marks it for autocast (:func:`pcsd.models.compute_context`). Under FSDP2 the cast to
    the compute dtype is :func:`fsdp_policy`'s job instead."""
    from pcsd.models import set_compute_dtype

    model.to(torch_dtype(prec.param))
    set_compute_dtype(model, torch_dtype(prec.compute) if prec.mixed and not distributed else None)
    return model


def prepare_lora_student(model, prec: Precision, spec, distributed: bool):
    """A LoRA run's student (``spec``: a :class:`pcsd.lora.LoraSpec`): adapters injected into
    ``model`` in ``prec.param`` (float32: master weights, AdamW state with them), every other
    weight frozen in the compute dtype (no master copy: it never changes); on one device with a
    compute dtype below the adapters', marked for autocast as :func:`prepare_student` does.
    Returns peft's model around it (:func:`pcsd.lora.add_adapters`)."""
    from pcsd.lora import add_adapters
    from pcsd.models import set_compute_dtype

    peft_model = add_adapters(model, spec, base_dtype=torch_dtype(prec.compute), adapter_dtype=torch_dtype(prec.param))
    set_compute_dtype(model, torch_dtype(prec.compute) if prec.mixed and not distributed else None)
    return peft_model


def frozen_copy(model, dtype: str):
    """A frozen (eval, no grad) copy of ``model`` whose floating parameters are ``dtype``; each
    parameter is cast on its own, so the full copy is never held in the source dtype. Tied
    parameters stay tied; buffers (e.g. rotary frequencies) are copied as they are."""
    import torch

    from pcsd.models import set_compute_dtype

    dt = torch_dtype(dtype)
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            data = p.detach().to(dt) if p.is_floating_point() else p.detach().clone()
            if data.data_ptr() == p.data_ptr():
                data = data.clone()
            memo[id(p)] = torch.nn.Parameter(data, requires_grad=False)
    frozen = copy.deepcopy(model, memo)
    set_compute_dtype(frozen, None)
    return frozen.eval()


def fsdp_policy(prec: Precision):
    """FSDP2's mixed-precision policy: gather parameters in the compute dtype, reduce gradients in
    float32 (the sharded parameters and the optimizer stay in ``prec.param``). None when the
    compute dtype is the parameter dtype."""
    if not prec.mixed:
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch_dtype(prec.compute), reduce_dtype=torch.float32)


def export_model(model, out_dir: Path, dtype: str, state_dict: Optional[dict] = None) -> Path:
    """``model.save_pretrained(out_dir)`` with the weights (``state_dict`` or the model's own) in
    ``dtype``, and config.json saying so."""
    dt = torch_dtype(dtype)
    sd = state_dict if state_dict is not None else model.state_dict()
    sd = {k: (v.detach().to("cpu", dt) if v.is_floating_point() else v.detach().cpu()) for k, v in sd.items()}
    model.save_pretrained(out_dir, state_dict=sd)
    cfg_path = Path(out_dir) / "config.json"
    conf = json.loads(cfg_path.read_text())
    for key in ("torch_dtype", "dtype"):
        if key in conf or key == "torch_dtype":
            conf[key] = dtype
    cfg_path.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    return Path(out_dir)
