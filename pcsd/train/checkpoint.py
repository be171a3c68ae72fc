"""Training checkpoints: written atomically, found again by ``--resume``.

Layout of one checkpoint, ``<run_dir>/checkpoints/step-<NNNNNNNN>/``::

    model/            HF format: save_pretrained weights + config, tokenizer and chat-template files;
                      a LoRA run (model.lora_rank > 0): the adapter alone in peft's format
                      (adapter_config.json naming the base model, adapter_model.safetensors)
    optimizer.pt      the optimizer's state_dict (full, unsharded; a LoRA run's: the adapters')
    rng.pt            every RNG state: python random, numpy, torch CPU, CUDA (when present) and the
                      trainer's own random.Random states (game sampling), by name
    state.json        step, trainer state (summary so far, ...), torch thread count, torch version
    config.yaml       the resolved run configuration
    checksums.json    every file above: its size and CRC-32, recorded when the checkpoint completes
    COMPLETE          written last; a directory without it is never loaded

Atomicity: everything is written into ``checkpoints/.tmp-step-<N>-<pid>`` (same parent, so the
final rename never crosses a file system), every file and the directory are fsync'ed, ``COMPLETE``
is written and fsync'ed, then the directory is renamed into place with :func:`os.replace` and the
parent directory is fsync'ed. A crash at any point leaves either no ``step-<N>`` directory or a
complete one; stale ``.tmp-*`` directories are removed by the next save. :func:`latest_checkpoint`
only returns directories holding ``COMPLETE`` (and whose files all exist), so a half-copied
checkpoint is skipped rather than loaded.

Damage after the fact (a truncated ``.safetensors`` or ``optimizer.pt``, a flipped bit): resuming
from a run folder (:func:`load_checkpoint` of the run dir) checks every file against
``checksums.json`` and falls back to the newest intact checkpoint, with a one-line warning per
damaged one; a checkpoint without its ``checksums.json`` cannot be checked and counts as damaged
(a flipped byte would pass unseen).
The warm-up's model (``sft-model/``, :func:`save_model_dir`) is written and checked the same way.
Checking costs one read of the files (CRC-32: 0.66 GB/s on one core of a busy 2-core EPYC; files
are hashed in parallel).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

__all__ = [
    "Checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "capture_rng",
    "restore_rng",
    "CheckpointError",
    "COMPLETE_MARKER",
    "CHECKSUMS",
    "write_checksums",
    "verify_checksums",
    "save_model_dir",
    "load_model_dir_state",
    "apply_model_state",
    "check_trainable_state",
    "copy_tokenizer_files",
]

COMPLETE_MARKER = "COMPLETE"
CHECKSUMS = "checksums.json"
_STEP_RE = re.compile(r"^step-(\d{8})$")
_REQUIRED = ("model", "optimizer.pt", "rng.pt", "state.json", "config.yaml", COMPLETE_MARKER)


class CheckpointError(ValueError):
    """A checkpoint directory or its arguments are not valid."""


@dataclass
class Checkpoint:
    """A loaded checkpoint. ``model_state`` is a full (unsharded) state dict on CPU."""

    path: Path
    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    rng: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)  # trainer state saved beside the step
    config_yaml: str = ""


# ----------------------------------------------------------------------------- RNG
def capture_rng(named: Optional[Mapping[str, random.Random]] = None) -> dict[str, Any]:
    """Every global RNG state plus the states of the trainer's own ``random.Random`` objects."""
    out: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "named": {k: v.getstate() for k, v in (named or {}).items()},
    }
    return out


def restore_rng(rng: Mapping[str, Any], named: Optional[Mapping[str, random.Random]] = None) -> None:
    """Inverse of :func:`capture_rng`: restores the global states and each named generator."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch_cpu"])
    if rng.get("torch_cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["torch_cuda"])
    saved = rng.get("named", {})
    for k, gen in (named or {}).items():
        if k not in saved:
            raise CheckpointError(f"the checkpoint holds no RNG state named {k!r} (it has {sorted(saved)})")
        gen.setstate(saved[k])


# ----------------------------------------------------------------------------- helpers
def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            _fsync_file(Path(dirpath) / f)
        _fsync_dir(Path(dirpath))


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            crc = zlib.crc32(chunk, crc)  # releases the GIL on large buffers: files hash in parallel
    return crc


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (CHECKSUMS, COMPLETE_MARKER))


def _crcs(paths: list[Path]) -> list[int]:
    from concurrent.futures import ThreadPoolExecutor

    if len(paths) < 2:
        return [_crc32(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 8)) as ex:
        return list(ex.map(_crc32, paths))


def write_checksums(root: str | os.PathLike[str]) -> Path:
    """Records the size and CRC-32 of every file below ``root`` in ``root/checksums.json``."""
    root = Path(root)
    files = _files(root)
    table = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "crc32": c} for p, c in zip(files, _crcs(files))
    }
    out = root / CHECKSUMS
    out.write_text(json.dumps({"algorithm": "crc32", "files": table}, indent=1))
    return out


def verify_checksums(root: str | os.PathLike[str]) -> Optional[str]:
    """What differs from ``root/checksums.json`` (a file missing, of another size or CRC-32), or
    None when every recorded file is intact. Sizes are compared first (a truncated file costs no
    read); a folder without ``checksums.json`` cannot be checked: that is its problem."""
    root = Path(root)
    path = root / CHECKSUMS
    if not path.is_file():
        return f"{CHECKSUMS} is missing (its files cannot be checked)"
    try:
        table = json.loads(path.read_text())["files"]
        expected = {name: (int(v["size"]), int(v["crc32"])) for name, v in table.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{path} is damaged"
    files = []
    for name, (size, _) in sorted(expected.items()):
        f = root / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, {size} when written (truncated)"
        files.append(f)
    for f, crc in zip(files, _crcs(files)):
        if crc != expected[f.relative_to(root).as_posix()][1]:
            return f"{f.relative_to(root).as_posix()} differs from what was written (checksum)"
    return None


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, ``(step, path)`` sorted by step."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and all((p / r).exists() for r in _REQUIRED):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Optional[Path]:
    """The newest complete checkpoint of ``run_dir``, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


# ----------------------------------------------------------------------------- save / load
TOKENIZER_FILES = ("*token*", "chat_template*", "vocab*", "merges*", "special_tokens_map*")


def copy_tokenizer_files(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copies the tokenizer and chat-template files of folder ``src`` (:data:`TOKENIZER_FILES`)
    into ``dst``, so that a model folder loads on its own."""
    for pat in TOKENIZER_FILES:
        for f in Path(src).glob(pat):
            if f.is_file():
                shutil.copyfile(f, Path(dst) / f.name)


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model,
    optimizer_state: Mapping[str, Any],
    rng: Mapping[str, Any],
    *,
    config_yaml: str,
    state: Optional[Mapping[str, Any]] = None,
    model_state: Optional[Mapping[str, torch.Tensor]] = None,
    tokenizer_dir: Optional[str | os.PathLike[str]] = None,
    keep_last: int = 0,
) -> Path:
    """Writes the checkpoint of ``step`` atomically and returns its directory.

    Args:
        model: a transformers ``PreTrainedModel`` (its ``save_pretrained`` writes the HF files).
            Under FSDP pass the gathered full ``model_state`` too; it is what gets written.
        optimizer_state: the optimizer's full state dict.
        rng: :func:`capture_rng`'s output.
        config_yaml: the resolved configuration as YAML text.
        state: JSON-serialisable trainer state (summary so far, ...).
        tokenizer_dir: copies ``*token*``, ``chat_template*``, ``vocab*``, ``merges*`` and
            ``special_tokens_map*`` from here beside the weights, so ``model/`` loads on its own.
        keep_last: keep only the newest ``keep_last`` complete checkpoints (0 = keep all).
    """
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be an int >= 0, got {step!r}")
    if not isinstance(keep_last, int) or keep_last < 0:
        raise CheckpointError(f"keep_last must be an int >= 0, got {keep_last!r}")
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a crashed earlier save
        shutil.rmtree(stale, ignore_errors=True)
    final = _step_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        model_dir = tmp / "model"
        kwargs = {"state_dict": dict(model_state)} if model_state is not None else {}
        model.save_pretrained(model_dir, safe_serialization=True, **kwargs)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, model_dir)
        torch.save(dict(optimizer_state), tmp / "optimizer.pt")
        torch.save(dict(rng), tmp / "rng.pt")
        meta = {
            "step": step,
            "state": dict(state or {}),
            "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
        }
        (tmp / "state.json").write_text(json.dumps(meta, indent=2))
        (tmp / "config.yaml").write_text(config_yaml)
        write_checksums(tmp)
        _fsync_tree(tmp)
        (tmp / COMPLETE_MARKER).write_text(f"{step}\n")
        _fsync_file(tmp / COMPLETE_MARKER)
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (a resumed run that saves the same step again)
            old = root / f".tmp-old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for _s, p in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(p, ignore_errors=True)
        _fsync_dir(root)
    return final


def _load_model_state(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _read(p: Path) -> Checkpoint:
    missing = [r for r in _REQUIRED if not (p / r).exists()]
    if missing:
        raise CheckpointError(f"{p} is not a complete checkpoint: missing {', '.join(missing)}")
    meta = json.loads((p / "state.json").read_text())
    return Checkpoint(
        path=p,
        step=int(meta["step"]),
        model_state=_load_model_state(p / "model"),
        optimizer_state=torch.load(p / "optimizer.pt", map_location="cpu", weights_only=False),
        rng=torch.load(p / "rng.pt", map_location="cpu", weights_only=False),
        state=meta.get("state", {}),
        config_yaml=(p / "config.yaml").read_text(),
    )


def _damage(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def load_checkpoint(
    path: str | os.PathLike[str], *, warn: Optional[Callable[[str], None]] = None, verify: bool = True
) -> Checkpoint:
    """Loads a checkpoint directory (a ``step-N`` folder), or a run directory's newest intact one.

    Every file is checked against ``checksums.json`` first (``verify``). In a run directory a
    damaged checkpoint is skipped for the next older one, ``warn`` (default: ``warnings.warn``)
    getting one line per skipped checkpoint; a ``step-N`` folder that is damaged is a
    :class:`CheckpointError`, as is a run directory with no intact checkpoint."""
    from safetensors import SafetensorError

    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=3))
    p = Path(path)
    # a truncated pickle raises EOFError / UnpicklingError / RuntimeError ("PytorchStreamReader failed ...")
    damaged_load = (OSError, EOFError, RuntimeError, ValueError, SafetensorError, pickle.UnpicklingError)
    if _STEP_RE.match(p.name):
        problem = verify_checksums(p) if verify else None
        if problem:
            raise CheckpointError(f"checkpoint {p} is damaged: {problem}")
        try:
            return _read(p)
        except CheckpointError:
            raise
        except damaged_load as exc:
            raise CheckpointError(f"checkpoint {p} is damaged: {_damage(exc)}") from None
    found = list_checkpoints(p)
    if not found:
        raise CheckpointError(f"{p}: no complete checkpoint (expected {p}/checkpoints/step-NNNNNNNN/{COMPLETE_MARKER})")
    skipped = []
    for _step, cp in reversed(found):
        problem = verify_checksums(cp) if verify else None
        if problem is None:
            try:
                ck = _read(cp)
            except (CheckpointError, *damaged_load) as exc:
                problem = _damage(exc)
            else:
                return ck
        skipped.append(cp.name)
        warn(f"checkpoint {cp} is damaged ({problem}); skipped")
    raise CheckpointError(f"{p}: no intact checkpoint (damaged: {', '.join(skipped)})")


def save_model_dir(
    out: str | os.PathLike[str],
    model,
    *,
    tokenizer_dir: Optional[str | os.PathLike[str]] = None,
    extra: Optional[Mapping[str, Any]] = None,
) -> Path:
    """Writes ``model`` (``save_pretrained``) with the tokenizer files of ``tokenizer_dir`` and
    ``extra`` (JSON, as ``pcsd-state.json``) to ``out`` atomically, with ``checksums.json`` and
    ``COMPLETE`` (the warm-up's model, ``sft-model/``): a crash leaves the old folder or none."""
    out = Path(out)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
        (tmp / "pcsd-state.json").write_text(json.dumps(dict(extra or {}), indent=2))
        write_checksums(tmp)
        _fsync_tree(tmp)
        (tmp / COMPLETE_MARKER).write_text("1\n")
        _fsync_file(tmp / COMPLETE_MARKER)
        if out.exists():
            old = out.with_name(f".tmp-old-{out.name}-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_model_dir_state(path: str | os.PathLike[str]) -> Optional[dict[str, Any]]:
    """The ``extra`` state of a complete, intact :func:`save_model_dir` folder; None when the folder
    is absent or incomplete. A folder whose files differ from its checksums is a CheckpointError."""
    p = Path(path)
    if not (p / COMPLETE_MARKER).is_file():
        return None
    problem = verify_checksums(p)
    if problem:
        raise CheckpointError(f"{p} is damaged: {problem}")
    try:
        return json.loads((p / "pcsd-state.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{p} is damaged: {_damage(exc)}") from None


def apply_model_state(model, state: Mapping[str, torch.Tensor], *, trainable_only: bool = False) -> None:
    """Copies a full state dict into a plain (unsharded) model; tied weights may be absent from
    the file (``save_pretrained`` writes one copy) and are checked to be tied in the model.
    ``trainable_only``: the state holds the trained parameters alone (:func:`check_trainable_state`)."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    if unexpected:
        raise CheckpointError(f"checkpoint weights not in the model: {sorted(unexpected)[:8]}")
    if trainable_only:
        return
    tied = _tied_names(model)
    really_missing = [k for k in missing if k not in tied]
    if really_missing:
        raise CheckpointError(f"model weights missing from the checkpoint: {sorted(really_missing)[:8]}")


def check_trainable_state(model, state: Mapping[str, torch.Tensor]) -> None:
    """A trainable-only state (a LoRA checkpoint's adapters) must hold every trained parameter of
    ``model`` and nothing else."""
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    extra = sorted(set(state) - trained)
    if extra:
        raise CheckpointError(f"checkpoint weights that are not trained parameters of the model: {extra[:8]}")
    missing = sorted(trained - set(state))
    if missing:
        raise CheckpointError(f"trained parameters missing from the checkpoint: {missing[:8]}")


def _tied_names(model) -> set[str]:
    """Names of parameters that share storage with an earlier-named parameter."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        ptr = p.data_ptr()
        if ptr in seen:
            tied.add(name)
        else:
            seen[ptr] = name
    return tied
