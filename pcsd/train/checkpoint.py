"""Training checkpoints: written atomically, found again by ``--resume``.

Layout of one checkpoint, ``<run_dir>/checkpoints/step-<NNNNNNNN>/``::

    model/            HF format: save_pretrained weights + config, tokenizer and chat-template files
    optimizer.pt      the optimizer's state_dict (full, unsharded)
    rng.pt            every RNG state: python random, numpy, torch CPU, CUDA (when present) and the
                      trainer's own random.Random states (game sampling), by name
    state.json        step, trainer state (summary so far, ...), torch thread count, torch version
    config.yaml       the resolved run configuration
    COMPLETE          written last; a directory without it is never loaded

Atomicity: everything is written into ``checkpoints/.tmp-step-<N>-<pid>`` (same parent, so the
final rename never crosses a file system), every file and the directory are fsync'ed, ``COMPLETE``
is written and fsync'ed, then the directory is renamed into place with :func:`os.replace` and the
parent directory is fsync'ed. A crash at any point leaves either no ``step-<N>`` directory or a
complete one; stale ``.tmp-*`` directories are removed by the next save. :func:`latest_checkpoint`
only returns directories holding ``COMPLETE`` (and whose files all exist), so a damaged or
half-copied checkpoint is skipped rather than loaded.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
           "capture_rng", "restore_rng", "CheckpointError", "COMPLETE_MARKER"]

COMPLETE_MARKER = "COMPLETE"
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
def save_checkpoint(run_dir: str | os.PathLike[str], step: int, model, optimizer_state: Mapping[str, Any],
                    rng: Mapping[str, Any], *, config_yaml: str, state: Optional[Mapping[str, Any]] = None,
                    model_state: Optional[Mapping[str, torch.Tensor]] = None,
                    tokenizer_dir: Optional[str | os.PathLike[str]] = None, keep_last: int = 0) -> Path:
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
            for pat in ("*token*", "chat_template*", "vocab*", "merges*", "special_tokens_map*"):
                for f in Path(tokenizer_dir).glob(pat):
                    if f.is_file():
                        shutil.copyfile(f, model_dir / f.name)
        torch.save(dict(optimizer_state), tmp / "optimizer.pt")
        torch.save(dict(rng), tmp / "rng.pt")
        meta = {"step": step, "state": dict(state or {}), "torch_threads": torch.get_num_threads(),
                "torch_version": torch.__version__}
        (tmp / "state.json").write_text(json.dumps(meta, indent=2))
        (tmp / "config.yaml").write_text(config_yaml)
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


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Loads a checkpoint directory (a ``step-N`` folder, or a run directory: its newest one)."""
    p = Path(path)
    if not _STEP_RE.match(p.name):
        found = latest_checkpoint(p)
        if found is None:
            raise CheckpointError(f"{p}: no complete checkpoint (expected {p}/checkpoints/step-NNNNNNNN/"
                                  f"{COMPLETE_MARKER})")
        p = found
    missing = [r for r in _REQUIRED if not (p / r).exists()]
    if missing:
        raise CheckpointError(f"{p} is not a complete checkpoint: missing {', '.join(missing)}")
    meta = json.loads((p / "state.json").read_text())
    return Checkpoint(
        path=p, step=int(meta["step"]), model_state=_load_model_state(p / "model"),
        optimizer_state=torch.load(p / "optimizer.pt", map_location="cpu", weights_only=False),
        rng=torch.load(p / "rng.pt", map_location="cpu", weights_only=False),
        state=meta.get("state", {}), config_yaml=(p / "config.yaml").read_text())


def apply_model_state(model, state: Mapping[str, torch.Tensor]) -> None:
    """Copies a full state dict into a plain (unsharded) model; tied weights may be absent from
    the file (``save_pretrained`` writes one copy) and are checked to be tied in the model."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    if unexpected:
        raise CheckpointError(f"checkpoint weights not in the model: {sorted(unexpected)[:8]}")
    tied = _tied_names(model)
    really_missing = [k for k in missing if k not in tied]
    if really_missing:
        raise CheckpointError(f"model weights missing from the checkpoint: {sorted(really_missing)[:8]}")


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
