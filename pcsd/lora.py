"""LoRA through ``peft``: adapters on a causal LM, the base model with them switched off, the
merged weights, and adapter folders in peft's format.

A LoRA run (``model.lora_rank`` > 0) trains low-rank adapters ``B A`` (``[out, r] x [r, in]``,
scaled by ``alpha / r``) beside every targeted linear layer; the base weights stay frozen. The
same module then serves three roles:

* the student: the causal LM with its adapters on (what trains, and what the hf backend
  generates with);
* the teacher and the reference: :class:`AdaptersOff`, the same module inside peft's
  ``disable_adapter()`` context, which is exactly the base model: no frozen copy is loaded;
* the generation engine's weights and ``final-model/``: :func:`weight_sources`, each targeted
  weight merged as ``W + (B @ A) * alpha / r`` (:func:`merge_weight`, peft's own formula).

peft's LoRA layers are injected into the causal LM in place (``get_peft_model``), so the model
keeps transformers' layout (``model.model.layers``, ``get_output_embeddings``) that packed scoring
and FSDP2 sharding read; the :class:`peft.PeftModel` around it is kept beside it for peft's own
operations (the adapter switch, saving). Parameter names inside the model gain ``base_layer`` and
``lora_A.default`` / ``lora_B.default``; an adapter folder (``adapter_config.json`` and
``adapter_model.safetensors``) names them as peft saves them (:func:`to_peft_names`,
:func:`from_peft_names`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DEFAULT_TARGETS",
    "AdaptersOff",
    "LoraSpec",
    "WeightSource",
    "add_adapters",
    "adapter_base",
    "adapter_names",
    "adapter_parameter_count",
    "frozen_base",
    "from_peft_names",
    "has_adapters",
    "is_adapter_dir",
    "linear_targets",
    "load_merged",
    "merge_weight",
    "read_adapter_config",
    "save_adapter",
    "to_peft_names",
    "weight_sources",
]

ADAPTER_CONFIG = "adapter_config.json"
#: every linear layer of attention and MLP in the decoder layers of the Llama/Qwen family (what
#: ``model.lora_targets`` defaults to; the model's own ``nn.Linear`` modules decide, see
#: :func:`linear_targets`)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ADAPTER = "default"  # peft's adapter name; one adapter per model here
_PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the causal LM's parameter names


@dataclass(frozen=True)
class LoraSpec:
    """``model.lora_*``: rank ``r`` (0: no LoRA), ``alpha`` (the adapters' output is scaled by
    ``alpha / r``; None: ``alpha = r``), the target module names (None: every linear layer of the
    decoder layers) and the dropout on the adapters' input."""

    rank: int = 0
    alpha: Optional[float] = None
    targets: Optional[tuple[str, ...]] = None
    dropout: float = 0.0

    @property
    def on(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return float(self.alpha if self.alpha is not None else self.rank) / self.rank

    @classmethod
    def of(cls, model_cfg: Any) -> "LoraSpec":
        """The spec of a config's ``model`` section (keys absent in an older config: no LoRA)."""
        get = model_cfg.get if hasattr(model_cfg, "get") else lambda k, d=None: getattr(model_cfg, k, d)
        targets = get("lora_targets", None)
        alpha = get("lora_alpha", None)
        return cls(
            rank=int(get("lora_rank", 0) or 0),
            alpha=None if alpha is None else float(alpha),
            targets=None if targets is None else tuple(str(t) for t in targets),
            dropout=float(get("lora_dropout", 0.0) or 0.0),
        )


def _decoder_layers(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError("LoRA: expected a HF causal LM with model.model.layers (Llama/Qwen family)")
    return layers


def linear_targets(model: nn.Module) -> tuple[str, ...]:
    """The names (last component) of every ``nn.Linear`` in the decoder layers: the attention's and
    the MLP's projections (``q_proj`` ... ``down_proj`` in the Llama/Qwen family), never the lm head."""
    names = {name.rsplit(".", 1)[-1] for name, m in _decoder_layers(model).named_modules() if isinstance(m, nn.Linear)}
    return tuple(t for t in DEFAULT_TARGETS if t in names) + tuple(sorted(names - set(DEFAULT_TARGETS)))


def add_adapters(model: nn.Module, spec: LoraSpec, *, base_dtype: torch.dtype, adapter_dtype: torch.dtype):
    """Injects LoRA adapters into ``model`` (a transformers causal LM) in place and returns peft's
    :class:`peft.PeftModel` around it. The base weights (every parameter that is not an adapter)
    are frozen and cast to ``base_dtype``; the adapters are ``adapter_dtype`` (float32: master
    weights, and AdamW's state with them). ``B`` starts at zero (peft's default), so the model is
    the base model until the first update.

    peft would cast a layer's input to its adapters' dtype before them (a float32 copy of every
    bf16 activation a targeted layer reads); that cast is turned off: under autocast the adapters'
    matmuls run in the compute dtype anyway, and under FSDP2's policy they are gathered in it.
    Raises ValueError (one line) for targets the model does not have."""
    from peft import LoraConfig, get_peft_model

    if not spec.on:
        raise ValueError(f"add_adapters needs model.lora_rank > 0, got {spec.rank}")
    have = linear_targets(model)
    targets = list(spec.targets) if spec.targets is not None else list(have)
    missing = [t for t in targets if t not in have]
    if missing:
        raise ValueError(
            f"model.lora_targets: {', '.join(missing)} is not a linear layer of this model's decoder layers; "
            f"it has {', '.join(have)}"
        )
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha if spec.alpha is not None else spec.rank,
        target_modules=targets,
        lora_dropout=spec.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model.to(base_dtype)
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    for name, p in model.named_parameters():
        if _is_adapter(name):
            p.data = p.data.to(adapter_dtype)
            p.requires_grad_(True)
        else:
            p.requires_grad_(False)
    for m in model.modules():
        if hasattr(m, "cast_input_dtype_enabled") or hasattr(m, "lora_A"):
            m.cast_input_dtype_enabled = False
    return peft_model


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` holds LoRA adapters (parameters named ``...lora_A...``)."""
    return any(_is_adapter(n) for n, _ in model.named_parameters())


def adapter_names(model: nn.Module) -> list[str]:
    """The adapter parameters' names inside ``model``, in order."""
    return [n for n, _ in model.named_parameters() if _is_adapter(n)]


class AdaptersOff:
    """The base model of a LoRA-trained model: the same module, used inside peft's
    ``disable_adapter()`` context (``with base as model: ...``), where every targeted layer
    computes its base layer alone. The frozen teacher and reference of a LoRA run."""

    def __init__(self, peft_model: Any):
        self.peft = peft_model
        self.model: nn.Module = peft_model.get_base_model()

    @contextlib.contextmanager
    def _off(self) -> Iterator[nn.Module]:
        with self.peft.disable_adapter():
            yield self.model

    def __enter__(self) -> nn.Module:
        self._ctx = self._off()
        return self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> Optional[bool]:
        return self._ctx.__exit__(*exc)


def frozen_base(frozen: Any) -> contextlib.AbstractContextManager:
    """The context in which ``frozen`` (a separately held frozen copy, or :class:`AdaptersOff`)
    is the frozen base model: ``with frozen_base(frozen) as model: ...``."""
    if isinstance(frozen, AdaptersOff):
        return frozen
    return contextlib.nullcontext(frozen)


# ----------------------------------------------------------------------------- merged weights
def merge_weight(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float, dtype: torch.dtype) -> Tensor:
    """``W + (B @ A) * scaling`` in float32, cast to ``dtype`` (peft's merge: ``get_delta_weight``
    added to the base weight; one rounding to ``dtype`` instead of peft's two)."""
    delta = (lora_b.float() @ lora_a.float()) * scaling
    return (weight.float() + delta).to(dtype)


@dataclass
class WeightSource:
    """One weight of the model as the generation engine or an HF checkpoint names it: ``names``
    (a tied weight has several), the parameters it is made of (the weight alone, or the base
    weight, ``A`` and ``B`` of a LoRA layer) and the LoRA scaling (None: the weight as it is)."""

    names: list[str]
    parts: list[Tensor]
    scaling: Optional[float] = None

    @property
    def numel(self) -> int:
        return self.parts[0].numel()

    @property
    def is_floating_point(self) -> bool:
        return self.parts[0].is_floating_point()

    def make(self, dtype: torch.dtype, full=lambda t: t) -> Tensor:
        """The weight in ``dtype`` (a float one; others as they are), ``full`` applied to each part
        first (the all-gather of a sharded parameter)."""
        if self.scaling is None:
            p = self.parts[0].detach()
            return full(p.to(dtype) if p.is_floating_point() else p)
        w, a, b = (full(t.detach()) for t in self.parts)
        return merge_weight(w, a, b, self.scaling, dtype)


def weight_sources(model: nn.Module) -> list[WeightSource]:
    """Every weight of ``model`` under its HF name, each parameter once: a LoRA layer's base weight
    with its adapters (merged when made), every other parameter as it is; the adapters themselves
    are not weights of the merged model. A plain model gives its parameters."""
    params = dict(model.named_parameters(remove_duplicate=False))
    scaling: dict[str, float] = {}
    for name, m in model.named_modules():
        if hasattr(m, "lora_A") and _ADAPTER in getattr(m, "lora_A", {}):
            scaling[name] = float(m.scaling[_ADAPTER])
    out: list[WeightSource] = []
    index: dict[int, int] = {}
    for name, p in params.items():
        if _is_adapter(name):
            continue
        export = name.replace(".base_layer.", ".")
        if id(p) in index:  # a tied weight: one source, several names
            out[index[id(p)]].names.append(export)
            continue
        index[id(p)] = len(out)
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if owner is not None and owner in scaling and name.endswith(".base_layer.weight"):
            a = params[f"{owner}.lora_A.{_ADAPTER}.weight"]
            b = params[f"{owner}.lora_B.{_ADAPTER}.weight"]
            out.append(WeightSource([export], [p, a, b], scaling[owner]))
        else:
            out.append(WeightSource([export], [p]))
    return out


def adapter_parameter_count(shape_linears: Sequence[tuple[int, int]], rank: int) -> int:
    """Parameters of rank-``rank`` adapters on linear layers of these ``(in, out)`` sizes:
    ``r (in + out)`` each."""
    return sum(rank * (i + o) for i, o in shape_linears)


# ----------------------------------------------------------------------------- adapter folders
def to_peft_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Adapter tensors named as inside the model (``...q_proj.lora_A.default.weight``) -> as peft's
    ``adapter_model.safetensors`` names them (``base_model.model....q_proj.lora_A.weight``)."""
    out = {}
    for k, v in state.items():
        if _is_adapter(k):
            out[_PEFT_PREFIX + k.replace(f".{_ADAPTER}.", ".")] = v
    return out


def from_peft_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`to_peft_names`."""
    out = {}
    for k, v in state.items():
        name = k[len(_PEFT_PREFIX) :] if k.startswith(_PEFT_PREFIX) else k
        for part in (".lora_A.", ".lora_B."):
            name = name.replace(part, f"{part}{_ADAPTER}.") if f"{part}{_ADAPTER}." not in name else name
        out[name] = v
    return out


def save_adapter(
    peft_model: Any, out_dir: str | Path, base: str | Path, state: Optional[dict[str, Tensor]] = None, **kw: Any
) -> Path:
    """The adapter in peft's format (``adapter_config.json`` naming ``base`` as its base model,
    ``adapter_model.safetensors``): ``state`` (adapter tensors named as inside the model, e.g.
    gathered from FSDP2's shards) or the model's own. ``kw`` goes to peft's ``save_pretrained``."""
    cfg = peft_model.peft_config[_ADAPTER]
    cfg.base_model_name_or_path = str(base)
    sd = None if state is None else {_PEFT_PREFIX + k: v for k, v in state.items() if _is_adapter(k)}
    peft_model.save_pretrained(str(out_dir), state_dict=sd, **kw)
    return Path(out_dir)


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` is a peft adapter folder (``adapter_config.json`` with a LoRA adapter)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """The ``adapter_config.json`` of the adapter folder ``path``. Raises ValueError (one line) when
    it cannot be read or is not a JSON object (a damaged file is not a folder without a base)."""
    file = Path(path) / ADAPTER_CONFIG
    try:
        conf = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{file} is damaged: not valid JSON ({exc})") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{file} is damaged: expected a JSON object, got {type(conf).__name__}")
    return conf


def adapter_base(path: str | Path) -> Optional[str]:
    """The base model an adapter folder names (``base_model_name_or_path``), or None when it names
    none. Raises ValueError (one line) for a damaged ``adapter_config.json``."""
    base = read_adapter_config(path).get("base_model_name_or_path")
    return str(base) if base else None


def load_merged(adapter_dir: str | Path, base_model: nn.Module) -> nn.Module:
    """``base_model`` (a plain causal LM, loaded from the adapter's base) with the adapter of
    ``adapter_dir`` merged into its weights: peft's ``PeftModel.from_pretrained`` and
    ``merge_and_unload``. Raises ValueError (one line) for a damaged ``adapter_config.json``, a
    missing or damaged ``adapter_model.safetensors``, or an adapter that does not fit the model."""
    from peft import PeftModel
    from safetensors import SafetensorError

    read_adapter_config(adapter_dir)
    weights = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not weights.is_file() and not (Path(adapter_dir) / "adapter_model.bin").is_file():
        raise ValueError(f"{adapter_dir}: no {ADAPTER_WEIGHTS} (the adapter's weights) beside its {ADAPTER_CONFIG}")
    try:
        peft_model = PeftModel.from_pretrained(base_model, str(adapter_dir))
    except SafetensorError as exc:
        raise ValueError(f"{weights} is damaged: {_first_line(exc)}") from None
    except (ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise ValueError(f"{adapter_dir}: the adapter does not fit its base model ({_first_line(exc)})") from None
    return peft_model.merge_and_unload()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
