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

``pcsd.tiny_model`` (the tiny generated model) and ``pcsd.progress`` are helpers any layer may use.
"""

from __future__ import annotations

from pcsd._native import NativeModuleError, native_info

__version__ = "0.1.0"
__all__ = ["NativeModuleError", "native_info", "__version__"]
