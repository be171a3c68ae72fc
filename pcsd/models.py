"""Loading the models a job works with: the device, where a model is (a folder or a Hugging Face
model id), a Hugging Face causal LM from a checkpoint directory, and the end-of-turn token of a
ChatML tokenizer. Shared by training, evaluation, the diagnostics and the benchmarks; imports
nothing of pcsd's upper layers.

``model.path`` (and every ``--model`` of the commands) takes a local checkpoint folder or a
Hugging Face model id (``Qwen/Qwen2.5-3B-Instruct``). An id resolves as ``transformers`` resolves
it: to its snapshot in the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), downloaded there
first unless ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``); ``HF_ENDPOINT`` names a mirror.
What the model is loaded from is always that local folder: the native prompt builder and vLLM read
its files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional

import torch

__all__ = [
    "ATTN_IMPLS",
    "MODEL_FILES",
    "ModelLoadError",
    "ModelNotFound",
    "attention_choice",
    "attention_implementation",
    "check_model_dir",
    "check_model_spec",
    "compute_context",
    "eos_id",
    "flex_problem",
    "hub_kwargs",
    "is_model_id",
    "load_model",
    "load_on_device",
    "model_config_file",
    "resolve_device",
    "resolve_model_path",
    "set_compute_dtype",
]

#: the files of a model snapshot a job reads: config, tokenizer, chat template, safetensors weights
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelNotFound(FileNotFoundError):
    """``model.path`` names no usable model; the message is one line naming the key."""


def is_model_id(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` has the shape of a Hugging Face model id (``org/name``) and is no local path."""
    s = os.fspath(spec)
    return bool(_MODEL_ID.match(s)) and not Path(s).exists() and not s.startswith((".", "~"))


def _offline() -> bool:
    truthy = ("1", "true", "yes", "on")
    return any(os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_kwargs() -> dict:
    """The hub endpoint and cache as the environment says now (``HF_ENDPOINT``, ``HF_HUB_CACHE``,
    ``HF_HOME``): huggingface_hub reads them once at import, a job may set them later."""
    kw: dict = {}
    if os.environ.get("HF_ENDPOINT"):
        kw["endpoint"] = os.environ["HF_ENDPOINT"].rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None
    )
    if cache:
        kw["cache_dir"] = cache
    return kw


def _hub_error(spec: str, key: str, exc: BaseException) -> ModelNotFound:
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        why = "a gated model: accept its licence on the Hub and log in (hf auth login, or HF_TOKEN)"
    elif isinstance(exc, RepositoryNotFoundError):
        why = "no such model on the Hub (or a private one: log in)"
    elif isinstance(exc, RevisionNotFoundError):
        why = "no such revision on the Hub"
    elif isinstance(exc, LocalEntryNotFoundError):
        why = (
            "not in the Hugging Face cache and the Hub cannot be reached"
            if not _offline()
            else "not in the Hugging Face cache, and HF_HUB_OFFLINE is set"
        )
    else:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return ModelNotFound(
        f"{key}={spec}: not a folder, and as a Hugging Face model id: {why} "
        f"(pcsd-data model {spec} fetches it into a folder)"
    )


def _local_folder(spec: str, key: str) -> Optional[Path]:
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{key}={p}: no config.json there (expected a Hugging Face checkpoint folder)")
        return p
    if p.exists():
        raise ModelNotFound(
            f"{key}={p}: a file, not a folder (expected a Hugging Face checkpoint folder or a model id)"
        )
    if not is_model_id(spec):
        raise ModelNotFound(f"{key}={p}: no such folder, and not a Hugging Face model id (org/name) either")
    return None


def _has_weights(folder: Path) -> bool:
    """Whether a snapshot holds its weights: every shard its index names, else a safetensors file."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((folder / s).is_file() for s in shards)
    return any(folder.glob("*.safetensors"))


def resolve_model_path(
    spec: str | os.PathLike[str], key: str = "model.path", *, revision: Optional[str] = None, download: bool = True
) -> Path:
    """The local folder of ``spec``: the folder itself, or a model id's snapshot in the Hugging
    Face cache (downloaded there first when it is not cached, unless offline or ``download`` is
    False). Raises :class:`ModelNotFound` with one line naming ``key``."""
    spec = os.fspath(spec)
    local = _local_folder(spec, key)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    kw = hub_kwargs()
    try:
        path = Path(snapshot_download(spec, revision=revision, allow_patterns=MODEL_FILES, local_files_only=True, **kw))
        if not _has_weights(path):  # e.g. only the config.json that --plan fetched
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError(f"{path} holds no weights")
    except Exception as exc:  # not cached (whole): fetch it unless offline
        if _offline() or not download:
            raise _hub_error(spec, key, exc) from None
        try:
            path = Path(snapshot_download(spec, revision=revision, allow_patterns=MODEL_FILES, **kw))
        except Exception as exc2:
            raise _hub_error(spec, key, exc2) from None
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{key}={spec}: its snapshot {path} has no config.json (not a transformers model)")
    return path


def model_config_file(spec: str | os.PathLike[str], key: str = "model.path") -> Path:
    """The ``config.json`` of ``spec`` alone (a folder's, or a model id's from the cache or the
    Hub): what ``--plan`` reads, without fetching weights."""
    spec = os.fspath(spec)
    local = _local_folder(spec, key)
    if local is not None:
        return local / "config.json"
    from huggingface_hub import hf_hub_download

    kw = hub_kwargs()
    try:
        return Path(hf_hub_download(spec, "config.json", local_files_only=_offline(), **kw))
    except Exception as exc:
        raise _hub_error(spec, key, exc) from None


def check_model_spec(spec: str | os.PathLike[str], key: str = "model.path") -> None:
    """Checks ``spec`` when a config is read, before anything is loaded: a checkpoint folder, or a
    model id that is cached or can be fetched (offline, it must be cached). Nothing is downloaded."""
    spec = os.fspath(spec)
    if _local_folder(spec, key) is not None or not _offline():
        return
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(spec, "config.json", cache_dir=hub_kwargs().get("cache_dir"))
    if not isinstance(hit, str):
        raise ModelNotFound(
            f"{key}={spec}: not a folder, and as a Hugging Face model id: not in the Hugging Face "
            f"cache, and HF_HUB_OFFLINE is set (pcsd-data model {spec} fetches it into a folder)"
        )


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


#: ``model.attn_impl``: how the scoring and update passes attend (docs/configuration.md). ``flash`` and
#: ``flex`` score packed rows (position ids restarting per sequence, no padding); ``sdpa-padded``
#: right-pads each micro-batch to its longest row; ``auto`` takes the first of them that can run.
ATTN_IMPLS = ("auto", "flash", "flex", "sdpa-padded")


def _flash_problem(device: torch.device) -> Optional[str]:
    """Why flash-attention cannot run on ``device`` (None: it can)."""
    import importlib.util

    if device.type != "cuda":
        return f"flash-attention runs on CUDA only (the device is {device.type})"
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed"
    return None


def flex_problem(device: torch.device, config=None) -> Optional[str]:
    """Why FlexAttention cannot run the update on ``device`` for a model of ``config`` (None: it
    can): it needs CUDA (torch has no FlexAttention backward on CPU), torch.compile's GPU backend
    (triton) and a model class transformers runs with ``attn_implementation="flex_attention"``."""
    import importlib.util

    if device.type != "cuda":
        return f"torch {torch.__version__} has no FlexAttention backward on {device.type}, only on CUDA"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention (torch >= 2.5 has it)"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (torch.compile's GPU backend, which FlexAttention is compiled with)"
    if config is not None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        try:
            cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        except KeyError:
            cls = None
        if cls is not None and not getattr(cls, "_supports_flex_attn", False):
            return f"transformers runs {cls.__name__} without FlexAttention"
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return "the model has sliding-window layers, which the packed rows' document mask does not model"
    return None


def attention_choice(requested: str, device: torch.device, config=None) -> tuple[str, str]:
    """``model.attn_impl=requested`` on ``device`` for a model of ``config`` (a transformers config;
    None: not checked): transformers' ``attn_implementation`` and one line saying which path the
    passes take and why. ``flash`` / ``flex`` that cannot run raise ValueError naming the key."""
    if requested not in ATTN_IMPLS:
        raise ValueError(f"model.attn_impl={requested!r} is not valid; choose one of {', '.join(ATTN_IMPLS)}")
    if requested == "sdpa-padded":
        return "sdpa", "attention: padded micro-batches (sdpa), as model.attn_impl=sdpa-padded asks"
    flash = _flash_problem(device)
    if requested == "flash" and flash:
        raise ValueError(f"model.attn_impl=flash: {flash}")
    if flash is None and requested in ("auto", "flash"):
        return "flash_attention_2", "attention: packed rows, flash-attention varlen (no padding)"
    flex = flex_problem(device, config)
    if requested == "flex" and flex:
        raise ValueError(f"model.attn_impl=flex: {flex}; model.attn_impl=sdpa-padded pads instead")
    if flex is None:
        why = "" if requested == "flex" else f" ({flash})"
        return "flex_attention", f"attention: packed rows, FlexAttention with a document mask (no padding){why}"
    return "sdpa", f"attention: padded micro-batches (sdpa): {flash}, and {flex}"


def attention_implementation(model, impl: str):
    """A context in which ``model`` attends with transformers' ``impl`` (e.g. ``sdpa`` for
    generation by a model that trains with FlexAttention: its masks would be rebuilt and its
    kernel recompiled at every new length of a decode); a no-op when it already does."""
    import contextlib

    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if before is None or before == impl:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def switched():
        model.set_attn_implementation(impl)
        try:
            yield
        finally:
            model.set_attn_implementation(before)

    return switched()


def load_model(path: str | Path, device: torch.device, dtype: str = "auto", attn_impl: str = "auto"):
    """The causal LM at ``path`` (a folder or a Hugging Face model id, see
    :func:`resolve_model_path`) on ``device``, attending as ``attn_impl`` (``model.attn_impl``, see
    :func:`attention_choice`) asks; ``model.pcsd_attention`` is the line saying which path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    p = resolve_model_path(path)
    problem = check_model_dir(p)
    if problem:
        raise ModelLoadError(problem)
    try:
        cfg = AutoConfig.from_pretrained(p)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{p}: cannot read its config ({str(exc).splitlines()[0]})") from None
    if not any(a.endswith("ForCausalLM") for a in (cfg.architectures or [])):
        raise ValueError(f"model.path={p} is not a causal LM (architectures: {cfg.architectures})")
    torch_dtype = {
        "auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
    }[dtype]
    try:
        impl, line = attention_choice(attn_impl, device, cfg)
    except ValueError as exc:  # e.g. model.attn_impl=flex for a model class transformers runs without it
        raise ModelLoadError(f"{p}: {exc}") from None
    kwargs = {"attn_implementation": impl}
    from safetensors import SafetensorError

    try:
        model = None
        if device.type != "cpu":  # straight onto the device: never the whole model in host memory
            model = load_on_device(p, cfg, device, torch_dtype, **kwargs)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, **kwargs).to(device)
    except (OSError, SafetensorError) as exc:  # a damaged file the header check above cannot see
        raise ModelLoadError(
            f"{p}: cannot load the weights ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    model.pcsd_attention = line
    return model


def _weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: every shard its index names, else ``*.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def load_on_device(path: Path, config, device: torch.device, dtype: torch.dtype, **kwargs):
    """The causal LM of checkpoint folder ``path`` built on ``device`` and filled there from its
    safetensors files, a tensor at a time; None when the checkpoint needs transformers' own
    loading (no safetensors, or names that are not the model's parameters: a renamed or
    converted layout), which :func:`load_model` then does on the CPU.

    Every parameter is created on ``device`` (``from_config`` under ``torch.device``: buffers such
    as the rotary frequencies are computed there, as transformers does with a ``device_map``), then
    overwritten by ``copy_`` from the checkpoint (cast to ``dtype`` on the device); host memory
    holds one tensor of the file at a time, never the model. What ``from_pretrained`` adds is kept:
    the folder's ``generation_config.json``, the name, eval mode, tied weights. No ``accelerate``
    needed (transformers wants it for a ``device_map``)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GenerationConfig

    files = _weight_files(path)
    if not files:
        return None
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    if getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None):
        return None  # per-module dtypes: from_pretrained's business
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers())
    filled: set[str] = set()
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                names = list(fh.keys())
                if any(n not in params and n not in buffers for n in names):
                    return None  # a layout transformers converts while loading
                for name in names:
                    (params.get(name) if name in params else buffers[name]).copy_(fh.get_tensor(name))
                    filled.add(name)
    tied = {id(p) for n, p in params.items() if n in filled}
    missing = [n for n, p in params.items() if n not in filled and id(p) not in tied]
    if missing:
        return None
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model.config._name_or_path = str(path)
    model.name_or_path = str(path)
    return model.eval()


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
