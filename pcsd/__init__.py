"""pcsd: GRPO + Persistent Consistency Self-Distillation for LLM agents.

The package's layers, each importing only the ones above it in this list (``tests/test_layers.py``
checks it):

  pcsd.ops         the math: the PCSD weights op (native CPU/CUDA kernels + PyTorch reference),
                   the weighting rules, GRPO advantages and token terms, the losses, packed log-probs
  pcsd.envs        the environments: the native ALFWorld engine, procedural games, experts, the pool
  pcsd.text        prompts: the Rust-backed prompt builder, skills, action parsing
  pcsd.models      loading a causal LM (a folder or a Hub id), the device, the end-of-turn token
  pcsd.lora        LoRA through peft: adapters, the base with them off, merged weights, adapter folders
  pcsd.data        fetching the real data and models (``python -m pcsd.data`` / ``pcsd-data``)
  pcsd.rollout     generation backends (vLLM, HF) and the batched multi-turn rollout loop
  pcsd.eval        evaluation (``python -m pcsd.eval``)
  pcsd.train       the training job (``python -m pcsd.train``): config, methods, update, SFT, ...
  pcsd.diagnostics the paper's weight diagnostics (``python -m pcsd.diagnostics``)
  pcsd.bench       the benchmarks (``python -m pcsd.bench``)

``pcsd.testing`` (the tiny generated model) and ``pcsd.progress`` are helpers any layer may use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

from pcsd._native import NativeModuleError, native_info

__version__ = "0.1.0"
__all__ = ["NativeModuleError", "native_info", "__version__"]

#: modules that moved into the layered packages (0.1 layout -> now); the old names keep working
#: for a while, with a DeprecationWarning
MOVED_MODULES: dict[str, str] = {
    "pcsd.reference": "pcsd.ops.reference",
    "pcsd.weighting": "pcsd.ops.weighting",
    "pcsd.losses": "pcsd.ops.losses",
    "pcsd.grpo": "pcsd.ops.grpo",
    "pcsd.scoring": "pcsd.ops.scoring",
    "pcsd.experts": "pcsd.envs.experts",
    "pcsd.prompts": "pcsd.text.prompts",
    "pcsd.sft": "pcsd.train.sft",
    "pcsd.checkpoint": "pcsd.train.checkpoint",
    "pcsd.distributed": "pcsd.train.distributed",
    "pcsd.metrics": "pcsd.train.metrics",
    "pcsd.config": "pcsd.train.config",
    "pcsd.methods": "pcsd.train.methods",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module it moved to (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
