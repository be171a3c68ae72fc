"""vLLM worker extension: receives the trainer's weights in place through the engine's own weight
reload (``model_runner.reload_weights`` with checkpoint-format tensors, which re-runs any
post-load processing). Named by ``worker_extension_cls`` when the engine is built, called with
``LLM.collective_rpc("pcsd_load_weights", args=(named_tensors,))``; the caller then resets the
prefix cache.

The engine runs in the trainer's process (:class:`pcsd.rollout.backends.VLLMBackend`), so
``named_tensors`` is the trainer's own lazy stream (:func:`pcsd.train.distributed.iter_weights`):
tensors already in the engine's dtype on the trainer's device, produced a bounded bucket at a time
while ONE ``reload_weights`` consumes them. One reload per sync matters: vLLM's layerwise reload
processes a layer (fused q/k/v, gate/up) when all of its weights have arrived, and a second reload
would start every layer anew."""

from __future__ import annotations

import inspect
from typing import Iterable, Iterator

import torch


class PcsdWeightSync:
    """Mixed into vLLM's worker class by vLLM itself (``worker_extension_cls``)."""

    def pcsd_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Loads the stream into the model in place; returns how many tensors it held."""
        runner = self.model_runner  # type: ignore[attr-defined]
        device = next(runner.get_model().parameters()).device
        count = 0

        def on_device() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for name, t in named_tensors:
                count += 1
                yield name, t.to(device)  # no copy when the trainer shares the device

        runner.reload_weights(weights_iterator=on_device(), is_checkpoint_format=True)
        return count

    def pcsd_reload_parameters(self) -> list[str]:
        """The parameter names of the model runner's ``reload_weights`` (checked at engine start by
        :func:`pcsd.rollout.backends.check_vllm_reload`)."""
        return list(inspect.signature(self.model_runner.reload_weights).parameters)  # type: ignore[attr-defined]

    def pcsd_weight_checksum(self) -> float:
        """Sum of all parameters (tests use it to see that a sync changed the engine)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(sum(p.detach().double().sum() for p in model.parameters()))
