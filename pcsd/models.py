"""Loading the models a job works with: the device, a Hugging Face causal LM from a checkpoint
directory, and the end-of-turn token of a ChatML tokenizer. Shared by training, evaluation and the
benchmarks; imports nothing of pcsd's upper layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

__all__ = ["ModelLoadError", "check_model_dir", "compute_context", "eos_id", "load_model", "resolve_device",
           "set_compute_dtype"]


class ModelLoadError(ValueError):
    """A model folder that cannot be loaded (corrupt ``config.json``, truncated or missing weights);
    the message names the folder or file and what is wrong, in one line."""


def check_model_dir(path: str | Path, weights: bool = True) -> Optional[str]:
    """What is wrong with a Hugging Face checkpoint folder, read without loading a tensor, or None:
    ``config.json`` missing or not JSON, no weights (with ``weights``; ``--plan`` needs only the
    config), a weight file of the index missing, a ``*.safetensors`` file shorter than its own header
    says (truncated) or with a header that is not JSON. The message names the file."""
    p = Path(path)
    cfg = p / "config.json"
    if not cfg.is_file():
        return f"{p}: no config.json there (expected a Hugging Face checkpoint directory)"
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{cfg}: not valid JSON ({str(exc).splitlines()[0]})"
    index = p / "model.safetensors.index.json"
    files = sorted(p.glob("*.safetensors"))
    if index.is_file():
        try:
            named = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            return f"{index}: not a weight index ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        missing = [f for f in named if not (p / f).is_file()]
        if missing:
            return f"{index}: names weight files that are missing: {', '.join(missing[:4])}"
        files = [p / f for f in named]
    if weights and not files and not any(p.glob("*.bin")) and not any(p.glob("*.pt")):
        return f"{p}: no weights (*.safetensors, *.bin) in the folder"
    for f in files:
        problem = _safetensors_problem(f)
        if problem:
            return f"{f}: {problem}"
    return None


def _safetensors_problem(f: Path) -> Optional[str]:
    """A safetensors file is an 8-byte little-endian header length, a JSON header giving every
    tensor's byte range, then the data: a file shorter than the largest range is truncated."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, not even a safetensors header)"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"truncated ({size} bytes; its header alone needs {8 + n})"
        try:
            meta = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "not a safetensors file (its header is not valid)"
    if 8 + n + end > size:
        return f"truncated ({size} bytes; its tensors need {8 + n + end})"
    return None


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
    problem = check_model_dir(p)
    if problem:
        raise ModelLoadError(problem)
    try:
        cfg = AutoConfig.from_pretrained(p)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{p}: cannot read its config ({str(exc).splitlines()[0]})") from None
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
    from safetensors import SafetensorError

    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, **kwargs)
    except (OSError, SafetensorError) as exc:  # a damaged file the header check above cannot see
        raise ModelLoadError(f"{p}: cannot load the weights ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return model.to(device)


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
