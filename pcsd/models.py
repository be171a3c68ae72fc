"""Loading the models a job works with: the device, a Hugging Face causal LM from a checkpoint
directory, and the end-of-turn token of a ChatML tokenizer. Shared by training, evaluation and the
benchmarks; imports nothing of pcsd's upper layers."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["compute_context", "eos_id", "load_model", "resolve_device", "set_compute_dtype"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_model(path: str | Path, device: torch.device, dtype: str = "auto"):
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    if dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model.path={p}: no config.json there (expected a HF checkpoint directory)")
    cfg = AutoConfig.from_pretrained(p)
    if not any(a.endswith("ForCausalLM") for a in (cfg.architectures or [])):
        raise ValueError(f"model.path={p} is not a causal LM (architectures: {cfg.architectures})")
    torch_dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    kwargs = {}
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            # varlen flash attention over packed sequences (position ids restart per sequence)
            kwargs["attn_implementation"] = "flash_attention_2"
    return AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, **kwargs).to(device)


def set_compute_dtype(model, dtype) -> None:
    """Marks ``model`` to run its forward (and so its backward) under ``torch.autocast(dtype)``
    (None: in its parameters' dtype). Read by :func:`compute_context`."""
    model.pcsd_compute_dtype = dtype


def compute_context(model):
    """``torch.autocast`` in the compute dtype set by :func:`set_compute_dtype` on the model's
    device, or a no-op context. Wrap forward passes of the model (gradients follow autocast)."""
    import contextlib

    dtype = getattr(model, "pcsd_compute_dtype", None)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def eos_id(builder) -> int:
    ids = builder.tokenizer.encode("<|im_end|>")
    if len(ids) != 1:
        raise ValueError("the tokenizer has no single <|im_end|> token (ChatML models only)")
    return ids[0]
