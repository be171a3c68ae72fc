"""A memory plan per GPU, made from the config and the model's shape, before anything is loaded.

    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan                  # 1 GPU, its memory (or 80 GB)
    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan --gpus 8 --gpu-memory-gb 40

Shapes come from ``model.path``'s ``config.json``; without ``model.path`` the paper presets use the
built-in shapes :data:`BUILTIN_SHAPES` (Qwen2.5-3B-Instruct, Qwen3-1.7B), so the plan works without
weights. ``P`` parameters, ``N`` = FSDP world size, ``b(x)`` = bytes of dtype x:

* master weights ``P b(param) / N``, gradients ``P b(param) / N``, AdamW ``2 P b(param) / N``;
* the frozen teacher/reference copy ``P b(teacher) / N``;
* weights in the compute dtype while computing: on one device autocast's cache of the cast weights
  (``P b(compute)``, when compute != param); under FSDP2 the unsharded root (embeddings, lm head)
  plus two decoder layers being gathered;
* activations of one micro-batch of ``optim.tokens_per_microbatch`` tokens: per token and layer the
  tensors autograd keeps (norm inputs, q/k/v, attention output, MLP intermediates; counted below in
  :func:`activation_bytes_per_token`), or with ``optim.gradient_checkpointing`` only each layer's
  input plus one layer recomputed; the lm head never materialises ``[tokens, vocab]`` logits
  (chunked log-probs: a ``1024 x 16384`` float32 tile and its backward twin);
* vLLM's share, ``rollout.gpu_memory_utilization`` of the device (its bf16 weights + KV cache);
  it sleeps (weights to CPU, KV cache freed) during the update;
* 2 GiB for the CUDA context and allocator slack.

Peak = static + max(rollout phase: vLLM's share, update phase: compute weights + activations).
The numbers are estimates (within ~10 %), not measurements; the verdict names the setting to change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

GiB = 1024 ** 3
CONTEXT_BYTES = 2 * GiB
TOKEN_CHUNK, VOCAB_CHUNK = 1024, 16384  # pcsd.ops.scoring.score_packed's defaults

#: config.json fields of the paper's two models (Hugging Face Qwen/Qwen2.5-3B-Instruct, Qwen/Qwen3-1.7B)
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-3b": dict(model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True),
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True),
}
#: preset -> built-in shape used when model.path is not set
PRESET_SHAPES = {"alfworld-qwen2.5-3b": "qwen2.5-3b", "alfworld-qwen3-1.7b": "qwen3-1.7b",
                 "webshop-qwen2.5-3b": "qwen2.5-3b", "webshop-qwen3-1.7b": "qwen3-1.7b"}
_BYTES = {"float32": 4, "bfloat16": 2}


class PlanError(ValueError):
    """No shape to plan with."""


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool

    @classmethod
    def from_config(cls, conf: dict[str, Any], name: str) -> "Shape":
        try:
            h, heads = int(conf["hidden_size"]), int(conf["num_attention_heads"])
            mt = str(conf.get("model_type", ""))
            return cls(name=name, hidden=h, intermediate=int(conf["intermediate_size"]),
                       layers=int(conf["num_hidden_layers"]), heads=heads,
                       kv_heads=int(conf.get("num_key_value_heads") or heads),
                       head_dim=int(conf.get("head_dim") or h // heads), vocab=int(conf["vocab_size"]),
                       tied=bool(conf.get("tie_word_embeddings", False)), qkv_bias=mt == "qwen2",
                       qk_norm=mt == "qwen3")
        except KeyError as exc:
            raise PlanError(f"{name}: config.json has no {exc.args[0]!r} (a decoder-only HF config is expected)") from None

    def layer_params(self) -> int:
        h, hd = self.hidden, self.head_dim
        q, kv = self.heads * hd, self.kv_heads * hd
        n = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h
        n += (q + 2 * kv) if self.qkv_bias else 0
        n += 2 * hd if self.qk_norm else 0
        return n

    def params(self) -> int:
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_shape(cfg: Any) -> Shape:
    """The shape of ``model.path`` (its config.json: a folder's, or a model id's from the Hugging Face
    cache or Hub), or the preset's built-in shape."""
    if cfg.model.path:  # a folder, or a Hugging Face model id (its config.json alone is fetched)
        from pcsd.models import ModelNotFound, model_config_file

        try:
            p = model_config_file(cfg.model.path)
        except ModelNotFound as exc:
            raise PlanError(str(exc)) from None
        return Shape.from_config(json.loads(p.read_text()), str(cfg.model.path))
    key = PRESET_SHAPES.get(cfg.preset)
    if key is None:
        raise PlanError(f"preset {cfg.preset} has no built-in model shape: set model.path=<a HF model directory> "
                        f"(built-in shapes: {', '.join(f'{k} ({v})' for k, v in PRESET_SHAPES.items())})")
    return Shape.from_config(BUILTIN_SHAPES[key], key)


def activation_bytes_per_token(s: Shape, compute: int, residual: int, checkpointing: bool) -> int:
    """Bytes autograd keeps per token for the backward, all layers. ``compute``: bytes of the
    compute dtype; ``residual``: of the residual stream (fp32 under autocast, where the embeddings
    and residual adds stay fp32; the compute dtype under FSDP's policy)."""
    h, hd, i = s.hidden, s.head_dim, s.intermediate
    q, kv = s.heads * hd, s.kv_heads * hd
    per_layer = (
        2 * (residual * h + compute * h)  # two RMSNorms: fp32/residual input, normed output
        + compute * (q + 2 * kv)  # q, k, v after rotary (attention inputs)
        + compute * q + 4 * s.heads  # attention output (o-proj input) + logsumexp
        + compute * 4 * i  # gate, up, silu(gate), silu * up (down-proj input)
        + compute * (q + kv)  # pre-rotary q, k
    )
    if checkpointing:  # each layer's input kept; one layer's activations live during its recompute
        return s.layers * residual * h + per_layer
    return s.layers * per_layer


@dataclass
class Plan:
    shape: Shape
    world_size: int
    device_bytes: int
    rows: list[tuple[str, int, str]] = field(default_factory=list)  # (item, bytes per GPU, how)
    rollout_bytes: int = 0
    update_bytes: int = 0
    static_bytes: int = 0
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not fatal (e.g. vLLM queues sequences)

    @property
    def peak(self) -> int:
        return self.static_bytes + max(self.rollout_bytes, self.update_bytes)

    @property
    def fits(self) -> bool:
        return self.peak <= self.device_bytes

    def render(self) -> str:
        g = lambda b: f"{b / GiB:8.2f} GiB"  # noqa: E731
        s = self.shape
        out = [f"memory plan per GPU: {s.name}, {s.params() / 1e9:.2f} B parameters, "
               f"{self.world_size} GPU(s) of {self.device_bytes / GiB:.0f} GiB (FSDP world size {self.world_size})"]
        for name, b, how in self.rows:
            out.append(f"  {name:<34}{g(b)}   {how}")
        out.append(f"  {'static (always resident)':<34}{g(self.static_bytes)}")
        out.append(f"  {'rollout phase (+ vLLM)':<34}{g(self.static_bytes + self.rollout_bytes)}")
        out.append(f"  {'update phase (+ compute, act.)':<34}{g(self.static_bytes + self.update_bytes)}")
        out.append(f"  {'peak':<34}{g(self.peak)}   of {self.device_bytes / GiB:.0f} GiB "
                   f"({100 * self.peak / self.device_bytes:.0f} %)")
        out.append("verdict: " + ("fits" if self.fits else "does NOT fit") +
                   ("" if not self.advice else "; " + "; ".join(self.advice)))
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def memory_plan(cfg: Any, world_size: int, device_bytes: int, shape: Optional[Shape] = None) -> Plan:
    """The plan of ``cfg`` on ``world_size`` GPUs of ``device_bytes`` each (see the module doc)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if device_bytes <= 0:
        raise ValueError(f"device memory must be > 0 bytes, got {device_bytes}")
    s = shape or model_shape(cfg)
    m, n = cfg.model, world_size
    P = s.params()
    bp, bc, bt = _BYTES[m.param_dtype], _BYTES[m.compute_dtype], _BYTES[m.teacher_dtype]
    mixed = m.compute_dtype != m.param_dtype
    plan = Plan(s, n, device_bytes)
    trains = cfg.optim.steps > 0
    frozen = cfg.algo.distill or (cfg.algo.grpo and cfg.algo.kl_beta > 0)
    static = [("master weights", P * bp // n, f"{m.param_dtype}, / {n}")]
    if trains:
        static += [("gradients", P * bp // n, f"{m.param_dtype}, / {n}"),
                   ("AdamW state (2 moments)", 2 * P * bp // n, f"{m.param_dtype}, / {n}")]
    if frozen:
        static.append(("frozen teacher/reference", P * bt // n, f"{m.teacher_dtype}, / {n}"))
    static.append(("CUDA context + slack", CONTEXT_BYTES, "constant"))
    plan.static_bytes = sum(b for _, b, _ in static)

    # update phase: weights in the compute dtype + one micro-batch's activations
    if n == 1:
        gathered = P * bc if mixed else 0
        how_g = "autocast's cached casts" if mixed else "none (compute = param dtype)"
    else:
        root = s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden
        gathered = (root + 2 * s.layer_params()) * bc
        how_g = "FSDP2: unsharded root + 2 layers"
    ckpt = bool(cfg.optim.get("gradient_checkpointing", False))
    residual = 4 if (n == 1 and mixed and bp == 4) else bc
    tokens = cfg.optim.tokens_per_microbatch
    per_tok = activation_bytes_per_token(s, bc, residual, ckpt)
    head = tokens * s.hidden * 4 + 3 * TOKEN_CHUNK * VOCAB_CHUNK * 4  # saved hidden + chunk tiles
    acts = tokens * per_tok + head if trains else 0
    plan.update_bytes = gathered + acts
    # rollout phase: vLLM's share (asleep in the update)
    backend = cfg.rollout.backend
    util = float(cfg.rollout.gpu_memory_utilization)
    vllm = int(util * device_bytes) if backend == "vllm" else 0
    plan.rollout_bytes = vllm
    plan.rows = static + [
        ("compute-dtype weights (update)", gathered, how_g),
        (f"activations ({tokens} tokens)", acts,
         f"{per_tok / 1024:.0f} KiB/token{' (checkpointed)' if ckpt else ''} + chunked lm head"),
        ("vLLM (rollout)", vllm, f"rollout.gpu_memory_utilization={util}" if vllm else "hf backend: none"),
    ]
    if vllm:
        max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
        kv = vllm - P * 2 - GiB  # bf16 weights + ~1 GiB of its own activations
        seqs = kv // (s.kv_bytes_per_token() * max_len) if kv > 0 else 0
        want = math.ceil(cfg.rollout.tasks_per_step * cfg.rollout.group_size / n)
        plan.rows.append(("  of which KV cache", max(kv, 0),
                          f"~{seqs} sequences of {max_len} tokens at once (this rank plays {want})"))
        if 1 <= seqs < want:
            all_util = (P * 2 + GiB + s.kv_bytes_per_token() * max_len * want) / device_bytes
            room = (device_bytes - plan.static_bytes) / device_bytes
            plan.notes.append(f"vLLM holds ~{seqs} of this rank's {want} sequences at once and queues the rest "
                              f"(slower rollouts); rollout.gpu_memory_utilization={all_util:.2f} holds all of them"
                              + ("" if all_util <= room else f", more than this GPU has room for ({room:.2f})"))
        if seqs < 1:
            need = (P * 2 + GiB + s.kv_bytes_per_token() * max_len) / device_bytes
            plan.advice.append(f"vLLM's share cannot hold its weights and one sequence: raise "
                               f"rollout.gpu_memory_utilization to >= {need:.2f}")
    if not plan.fits:
        room = device_bytes - plan.static_bytes
        if plan.static_bytes + plan.rollout_bytes > device_bytes and vllm:
            need_min = (P * 2 + GiB + s.kv_bytes_per_token() * (cfg.rollout.max_prompt_tokens
                                                                 + cfg.rollout.max_response_tokens))
            if room > need_min:
                plan.advice.append(f"lower rollout.gpu_memory_utilization to <= {room / device_bytes:.2f}")
            else:
                plan.advice.append("the training state leaves vLLM no room: use more GPUs (FSDP divides "
                                   "weights, gradients and AdamW state) or rollout.backend=hf")
        if plan.static_bytes + plan.update_bytes > device_bytes and trains:
            fit_tokens = (room - gathered - 3 * TOKEN_CHUNK * VOCAB_CHUNK * 4) // (per_tok + s.hidden * 4)
            row = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
            if fit_tokens >= row:
                plan.advice.append(f"lower optim.tokens_per_microbatch to <= {int(fit_tokens)}")
            if not ckpt:
                plan.advice.append("set optim.gradient_checkpointing=true")
            if fit_tokens < row:
                plan.advice.append("use more GPUs (FSDP divides weights, gradients and AdamW state)")
    return plan


def device_memory_bytes() -> Optional[int]:
    """The first CUDA device's memory, or None without one."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - a plan must not fail on a driver problem
        return None
    return None
