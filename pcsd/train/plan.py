"""A memory plan per GPU, made from the config and the model's shape, before anything is loaded.

    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan                  # 1 GPU, its memory (or 80 GB)
    python -m pcsd.train preset=alfworld-qwen2.5-3b --plan --gpus 8 --gpu-memory-gb 40

Shapes come from ``model.path``'s ``config.json``; without ``model.path`` the paper presets use the
built-in shapes :data:`BUILTIN_SHAPES` (Qwen2.5-3B-Instruct, Qwen3-1.7B, Qwen2.5-7B-Instruct), so the
plan works without weights; ``model.path=<a Hugging Face id of one of them>`` plans with the real config.json
(a folder's, the Hugging Face cache's or the Hub's) and with the built-in shape when none can be read. ``P`` parameters, ``N`` = FSDP world size, ``b(x)`` = bytes of dtype x, ``V`` vocabulary,
``H`` hidden size. Each item is one line of the plan, in one of four phases:

*static* (always resident): master weights ``P b(param) / N``, gradients ``P b(param) / N``, AdamW
``2 P b(param) / N``, the frozen teacher/reference copy ``P b(teacher) / N``, 2 GiB for the CUDA
context and allocator slack; with the ``hf`` backend on several GPUs, the full generation copy
``P b(compute)`` every rank keeps (``pcsd.train.job.build_models``).

*LoRA* (``model.lora_rank`` r > 0, :mod:`pcsd.lora`): the static lines are the base weights
``P b(compute) / N`` (frozen, no master copy), the adapters ``A = layers x sum r (in + out)`` over the
targeted linear layers (:meth:`Shape.lora_params`) ``A b(param) / N``, their gradients and AdamW
state; no frozen copy (the teacher and the reference are the base with its adapters off). The
residual stream is in the compute dtype (the base is), the cast weights are the adapters', the lm
head's weight gradient is never made, each adapter keeps its ``[tokens, r]`` input of ``B`` for the
backward, and AdamW's temporaries are the adapters'.

*rollout*: ``vllm``: its share, ``rollout.gpu_memory_utilization`` of the device (bf16 weights, its
CUDA graphs, which vLLM >= 0.21 profiles into the share, and the KV cache); ``hf``: ``generate`` on
the model itself under autocast (the cast weights ``P b(compute)`` on one GPU), its KV cache for
``min(64, sequences per rank)`` sequences of ``max_prompt + max_response`` tokens (in the residual
stream's dtype: float32 under autocast), and the larger of the prefill (one layer's activations
over the prompts, with the prompts' KV) and the last step (the whole KV cache and one step's
``batch x V`` logits with their sampling copies, :data:`LOGIT_COPY_BYTES`; the backend keeps only
the sampled tokens' log-probs): :func:`hf_generation_bytes`.

*update, micro-batch*: weights in the compute dtype (autocast's cache of the cast weights on one
device; under FSDP2 the unsharded root (embeddings, lm head) plus two decoder layers being
gathered); activations of the widest micro-batch (per token and layer the tensors autograd keeps,
:func:`activation_bytes_per_token`; with ``optim.gradient_checkpointing`` each layer's input plus one
layer recomputed); the rows beyond ``optim.tokens_per_microbatch`` (a row longer than the budget
is a micro-batch of its own; packed rows, with flash-attention or FlexAttention, add no padding;
with ``model.attn_impl=sdpa-padded`` a micro-batch is a right-padded ``[rows, longest]`` batch,
counted as at most :data:`PAD_RATIO` x the budget); the lm head's gradient buffers
(``[V, H]`` float32 for the weight, ``[tokens, H]`` for the hidden states, one logits tile: a
``[max(441, longest response), V]`` float32 tile on the fused path and, where its matmuls are
not float32, the group buffer of the softmax gradients (``[max(883, longest response), V]`` in the
compute dtype: :func:`pcsd.ops.fused.fused_buffer_bytes`), ``3 x 1024 x 16384`` on the recomputing one); under FSDP2 the fused path's float32 copy of the gathered lm-head weight (once
per micro-batch); vLLM's CUDA graphs, which stay while the engine sleeps.

*update, optimizer step*: AdamW's temporaries, none with the fused AdamW a GPU run uses
(:mod:`pcsd.train.optim`: ``fused=True`` on CUDA updates in place); with ``foreach`` (torch's
default, ``adamw="foreach"`` here) ``torch._foreach_sqrt`` of the second moments, ``P b(param) / N``;
plus vLLM's CUDA graphs.

Peak = static + max(rollout, micro-batch, optimizer step). The numbers are estimates (``python -m
pcsd.bench gpu`` measures one update against :func:`predict_update`); the verdict names the
setting to change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence

GiB = 1024**3
CONTEXT_BYTES = 2 * GiB
TOKEN_CHUNK, VOCAB_CHUNK = 1024, 16384  # pcsd.ops.scoring.score_packed's defaults
#: a padded micro-batch (model.attn_impl=sdpa-padded) is a right-padded [rows, longest] batch; its rows are turns
#: of the same rollout steps (one template, one history window), counted as at least half the longest
PAD_RATIO = 2
#: vLLM's CUDA graph pool: an upper estimate for models of a few billion parameters (vLLM logs its
#: own figure, "CUDA graph pool memory"); python -m pcsd.bench gpu measures it where vLLM is installed
VLLM_CUDA_GRAPH_BYTES = GiB
VLLM_ACTIVATION_BYTES = GiB  # vLLM's own activations inside its share
#: pcsd.rollout.backends.HFBackend's max_batch: sequences per transformers generate call
HF_MAX_BATCH = 64
#: bytes per (sequence x vocabulary entry) of one generate step: the logits cast to float32, the
#: processed scores, the sampling probabilities, the behaviour log-softmax (4 float32 copies) and
#: top-p's int64 sort indices
LOGIT_COPY_BYTES = 4 * 4 + 8

#: config.json fields of the paper's two models (Hugging Face Qwen/Qwen2.5-3B-Instruct, Qwen/Qwen3-1.7B)
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-3b": dict(
        model_type="qwen2",
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(  # Qwen/Qwen2.5-7B-Instruct (the SDAR repository's LoRA model)
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen3-1.7b": dict(
        model_type="qwen3",
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}
#: preset -> built-in shape used when model.path is not set
PRESET_SHAPES = {
    "alfworld-qwen2.5-3b": "qwen2.5-3b",
    "alfworld-qwen3-1.7b": "qwen3-1.7b",
    "webshop-qwen2.5-3b": "qwen2.5-3b",
    "webshop-qwen3-1.7b": "qwen3-1.7b",
}
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
            return cls(
                name=name,
                hidden=h,
                intermediate=int(conf["intermediate_size"]),
                layers=int(conf["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(conf.get("num_key_value_heads") or heads),
                head_dim=int(conf.get("head_dim") or h // heads),
                vocab=int(conf["vocab_size"]),
                tied=bool(conf.get("tie_word_embeddings", False)),
                qkv_bias=mt == "qwen2",
                qk_norm=mt == "qwen3",
            )
        except KeyError as exc:
            raise PlanError(
                f"{name}: config.json has no {exc.args[0]!r} (a decoder-only HF config is expected)"
            ) from None

    def layer_params(self) -> int:
        h, hd = self.hidden, self.head_dim
        q, kv = self.heads * hd, self.kv_heads * hd
        n = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h
        n += (q + 2 * kv) if self.qkv_bias else 0
        n += 2 * hd if self.qk_norm else 0
        return n

    def linears(self) -> dict[str, tuple[int, int]]:
        """``(in, out)`` of each linear layer of one decoder layer, by name (Llama/Qwen family)."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def lora_params(self, rank: int, targets: Optional[Sequence[str]] = None) -> int:
        """Parameters of rank-``rank`` adapters (``A [r, in]``, ``B [out, r]``) on ``targets`` (None:
        every linear layer) of every decoder layer."""
        lin = self.linears()
        names = list(targets) if targets is not None else list(lin)
        unknown = [t for t in names if t not in lin]
        if unknown:
            raise PlanError(f"model.lora_targets: {', '.join(unknown)} is not one of {', '.join(lin)}")
        return self.layers * sum(rank * (lin[t][0] + lin[t][1]) for t in names)

    def params(self) -> int:
        emb = self.vocab * self.hidden
        return emb * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_shape(cfg: Any) -> Shape:
    """The shape of ``model.path`` (its config.json: a folder's, or a model id's from the Hugging Face
    cache or Hub; the built-in shape of a model id that names one when neither has it), or the
    preset's built-in shape."""
    if cfg.model.path:  # a folder, or a Hugging Face model id (its config.json alone is fetched)
        from pcsd.models import ModelNotFound, model_config_file

        known = _builtin_for_unreachable_id(str(cfg.model.path))
        if known is not None:
            return known
        try:
            p = model_config_file(cfg.model.path)
        except ModelNotFound as exc:
            raise PlanError(str(exc)) from None
        return Shape.from_config(json.loads(p.read_text()), str(cfg.model.path))
    key = PRESET_SHAPES.get(cfg.preset)
    if key is None:
        raise PlanError(
            f"preset {cfg.preset} has no built-in model shape: set model.path=<a HF model directory> "
            f"(built-in shapes: {', '.join(f'{k} ({v})' for k, v in PRESET_SHAPES.items())})"
        )
    return Shape.from_config(BUILTIN_SHAPES[key], key)


def _builtin_for_unreachable_id(spec: str) -> Optional[Shape]:
    """The built-in shape of a Hugging Face model id that names one (``Qwen/Qwen2.5-3B-Instruct``:
    qwen2.5-3b) when its config.json is not cached and the Hub cannot be reached now (offline, or its
    host not answering within 3 s), with one line on stderr saying so; else None (read the real one)."""
    import os
    import re
    import socket
    import sys
    from urllib.parse import urlparse

    from pcsd.models import _offline, hub_kwargs, is_model_id

    name = re.sub(r"[^a-z0-9.]", "", spec.split("/")[-1].lower())
    key = next((k for k in BUILTIN_SHAPES if name.startswith(k.replace("-", ""))), None)
    if key is None or os.path.exists(spec) or not is_model_id(spec):
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    hub = hub_kwargs()  # the environment as it is now (huggingface_hub read it once, at import)
    if isinstance(try_to_load_from_cache(spec, "config.json", cache_dir=hub.get("cache_dir")), str):
        return None  # cached: the real one
    if not _offline():
        url = urlparse(hub.get("endpoint") or constants.ENDPOINT)
        try:
            socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=3).close()
            return None  # reachable: the real one
        except OSError:
            pass
    print(
        f"pcsd.train: model.path={spec}: not cached and the Hugging Face Hub cannot be reached; the plan uses the "
        f"built-in shape of {key}",
        file=sys.stderr,
    )
    return Shape.from_config(BUILTIN_SHAPES[key], f"{key} (built-in)")


def activation_bytes_per_token(s: Shape, compute: int, residual: int, checkpointing: bool) -> int:
    """Bytes autograd keeps per token for the backward, all layers. ``compute``: bytes of the
    compute dtype; ``residual``: of the residual stream (fp32 under autocast, where the embeddings
    and residual adds stay fp32; the compute dtype under FSDP's policy)."""
    h, hd, i = s.hidden, s.head_dim, s.intermediate
    q, kv = s.heads * hd, s.kv_heads * hd
    per_layer = (
        2 * (residual * h + compute * h)  # two RMSNorms: fp32/residual input, normed output
        + compute * (q + 2 * kv)  # q, k, v after rotary (attention inputs)
        + compute * q
        + 4 * s.heads  # attention output (o-proj input) + logsumexp
        + compute * 4 * i  # gate, up, silu(gate), silu * up (down-proj input)
        + compute * (q + kv)  # pre-rotary q, k
    )
    if checkpointing:  # each layer's input kept; one layer's activations live during its recompute
        return s.layers * residual * h + per_layer
    return s.layers * per_layer


class Row(NamedTuple):
    """One line of the plan: ``item``, ``size`` (bytes per GPU), ``how`` it was counted and the
    ``phase`` it adds to: static | rollout | microbatch | step | update (both parts of the update) |
    info (a part of the line above, not added again)."""

    item: str
    size: int
    how: str
    phase: str


@dataclass(frozen=True)
class MicroBatch:
    """The widest micro-batch of an update, as the activations see it."""

    tokens: int  # positions of its forward pass, padding included
    base: int  # the tokens of the plan's "activations" line (the budget, or the batch's packed tokens)
    response_tokens: int  # its response tokens (rows of the lm head's hidden-state gradient)
    longest_response: int  # the longest response (a fused logits tile never splits one)
    how: str


@dataclass
class Plan:
    shape: Shape
    world_size: int
    device_bytes: int
    rows: list[Row] = field(default_factory=list)
    adamw: str = "fused"  # the optimizer's implementation the plan counts (pcsd.train.optim.adamw_kind)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not fatal (e.g. vLLM queues sequences)
    nodes: int = 1  # world_size GPUs on this many nodes
    mesh: str = "flat"  # dist.mesh (pcsd.train.distributed.device_mesh)

    @property
    def shard_size(self) -> int:
        """The GPUs one parameter is sharded over: a node's under HSDP on several nodes, else all."""
        return self.world_size // self.nodes if self.mesh == "hsdp" else self.world_size

    def layout(self) -> str:
        """The GPUs and the mesh, for the plan's first line."""
        gib = f"{self.device_bytes / GiB:.0f} GiB"
        if self.nodes == 1:
            return f"{self.world_size} GPU(s) of {gib} (FSDP world size {self.world_size})"
        per = self.world_size // self.nodes
        how = (
            f"FSDP shards over the {per} GPUs of a node, a replica per node"
            if self.mesh == "hsdp"
            else f"FSDP shards over all {self.world_size} GPUs"
        )
        return f"{self.nodes} nodes x {per} GPU(s) of {gib} (dist.mesh={self.mesh}: {how})"

    def total(self, phase: str) -> int:
        return sum(r.size for r in self.rows if r.phase == phase)

    @property
    def static_bytes(self) -> int:
        return self.total("static")

    @property
    def rollout_bytes(self) -> int:
        return self.total("rollout")

    @property
    def microbatch_bytes(self) -> int:
        """The update's forward/backward of its widest micro-batch (with what stays while it runs)."""
        return self.total("update") + self.total("microbatch")

    @property
    def step_bytes(self) -> int:
        """The update's optimizer step (with what stays while it runs)."""
        return self.total("update") + self.total("step")

    @property
    def update_bytes(self) -> int:
        return max(self.microbatch_bytes, self.step_bytes)

    @property
    def peak(self) -> int:
        return self.static_bytes + max(self.rollout_bytes, self.update_bytes)

    @property
    def fits(self) -> bool:
        return self.peak <= self.device_bytes

    def render(self) -> str:
        g = lambda b: f"{b / GiB:8.2f} GiB"  # noqa: E731
        s = self.shape
        out = [f"memory plan per GPU: {s.name}, {s.params() / 1e9:.2f} B parameters, {self.layout()}"]
        for r in self.rows:
            tag = "" if r.phase == "info" else f"[{r.phase}] "
            out.append(f"  {r.item:<36}{g(r.size)}   {tag}{r.how}")
        st = self.static_bytes
        out.append(f"  {'static (always resident)':<36}{g(st)}")
        out.append(f"  {'rollout phase (+ generation)':<36}{g(st + self.rollout_bytes)}")
        out.append(f"  {'update phase, micro-batch':<36}{g(st + self.microbatch_bytes)}")
        out.append(f"  {'update phase, optimizer step':<36}{g(st + self.step_bytes)}")
        out.append(
            f"  {'peak':<36}{g(self.peak)}   of {self.device_bytes / GiB:.0f} GiB "
            f"({100 * self.peak / self.device_bytes:.0f} %)"
        )
        out.append(
            "verdict: "
            + ("fits" if self.fits else "does NOT fit")
            + ("" if not self.advice else "; " + "; ".join(self.advice))
        )
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def attention_is_varlen() -> bool:
    """Whether a run here gets flash-attention's varlen attention (packed micro-batches, no padding):
    ``flash_attn`` is installed, which is what :func:`pcsd.models.load_model` checks on CUDA."""
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def update_packing(cfg: Any, varlen: bool) -> Optional[str]:
    """What packs the update's micro-batches on a GPU run of ``cfg`` (None: nothing, rows are
    padded): ``model.attn_impl`` as :func:`pcsd.models.attention_choice` resolves it on CUDA, with
    flash-attention where ``varlen`` says it is installed and FlexAttention wherever torch has it."""
    impl = cfg.model.get("attn_impl", "auto")
    if impl == "sdpa-padded":
        return None
    if impl == "flash" or (impl == "auto" and varlen):
        return "flash-attention"
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return None
    return "FlexAttention"


def config_microbatch(cfg: Any, varlen: bool, budget: Optional[int] = None) -> MicroBatch:
    """The widest micro-batch a config can make: ``optim.tokens_per_microbatch`` (``budget``)
    packed tokens, or one row of ``max_prompt + max_response`` tokens when that is longer. Packed
    rows (flash-attention or FlexAttention, :func:`update_packing`) cost no padding; padded rows
    (``model.attn_impl=sdpa-padded``, or no FlexAttention in torch) are padded to the longest of
    their micro-batch (at most :data:`PAD_RATIO` x the budget, see the module doc)."""
    budget = int(cfg.optim.tokens_per_microbatch if budget is None else budget)
    row = int(cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens)
    packed = max(budget, row)
    longest = int(cfg.rollout.max_response_tokens)
    packer = update_packing(cfg, varlen)
    if packer is not None:
        how = f"{packer}: packed rows" if row <= budget else f"{packer}: a {row}-token row is a micro-batch of its own"
        return MicroBatch(packed, budget, packed, longest, how)
    tokens = max(row, PAD_RATIO * budget)
    return MicroBatch(
        tokens, budget, packed, longest, f"padded rows (sdpa): padded to the longest (<= {PAD_RATIO} x budget)"
    )


def batch_microbatch(cfg: Any, prompt_lens: Sequence[int], response_lens: Sequence[int], varlen: bool) -> MicroBatch:
    """The widest micro-batch :func:`pcsd.train.update.update_step` makes of a batch with these
    row lengths (the same greedy grouping); ``varlen``: whether its rows are packed (flash-attention
    or FlexAttention); a padded micro-batch is ``rows x longest`` wide."""
    from pcsd.ops.scoring import greedy_microbatches

    sizes = [p + r if r else 0 for p, r in zip(prompt_lens, response_lens)]
    mbs = greedy_microbatches(sizes, int(cfg.optim.tokens_per_microbatch))
    if not mbs:
        raise ValueError("the batch has no row with response tokens")

    def width(rows: list[int]) -> int:
        return sum(sizes[i] for i in rows) if varlen else len(rows) * max(sizes[i] for i in rows)

    widest = max(mbs, key=width)
    packed = sum(sizes[i] for i in widest)
    return MicroBatch(
        width(widest),
        packed,
        sum(response_lens[i] for i in widest),
        max(response_lens),
        f"{len(widest)} rows, {packed} tokens" + ("" if varlen else f", padded to {width(widest)}"),
    )


class Lora(NamedTuple):
    """``model.lora_*`` as the plan counts them."""

    rank: int
    targets: Optional[tuple[str, ...]]
    dropout: float


def lora_of(cfg: Any) -> Optional[Lora]:
    """The LoRA settings of ``cfg`` (None: full fine-tuning, ``model.lora_rank=0``)."""
    m = cfg.model
    rank = int(m.get("lora_rank", 0) or 0)
    if rank <= 0:
        return None
    targets = m.get("lora_targets", None)
    return Lora(rank, None if targets is None else tuple(str(t) for t in targets), float(m.get("lora_dropout", 0.0)))


def residual_bytes(cfg: Any, n: int) -> int:
    """Bytes per element of the residual stream: float32 for an fp32 student under autocast on one
    GPU (its embeddings and residual adds stay fp32), else the compute dtype (FSDP2's policy, or a
    LoRA run's base weights frozen in the compute dtype)."""
    m = cfg.model
    bp, bc = _BYTES[m.param_dtype], _BYTES[m.compute_dtype]
    return 4 if (n == 1 and bc != bp and bp == 4 and lora_of(cfg) is None) else bc


def _update_rows(
    s: Shape, cfg: Any, n: int, mb: MicroBatch, backend: str, adamw: str = "fused", shard: Optional[int] = None
) -> list[Row]:
    """The update's lines (micro-batch, optimizer step, and what stays through both); ``adamw``:
    the optimizer's implementation (:func:`pcsd.train.optim.adamw_kind`); ``n`` the world size,
    ``shard`` the ranks a parameter is sharded over (default ``n``; HSDP: a node's)."""
    k = n if shard is None else shard
    m = cfg.model
    P, V, H = s.params(), s.vocab, s.hidden
    bp, bc = _BYTES[m.param_dtype], _BYTES[m.compute_dtype]
    mixed = m.compute_dtype != m.param_dtype
    trains = cfg.optim.steps > 0
    lora = lora_of(cfg)
    A = s.lora_params(lora.rank, lora.targets) if lora else 0  # adapter parameters
    trained = A if lora else P
    if n == 1:
        gathered = (A if lora else P) * bc if mixed else 0
        how_g = ("autocast's casts of the adapters" if lora else "autocast's cached casts") if mixed else "none"
        how_g += "" if mixed else " (compute = param dtype)"
    else:
        root = V * H * (1 if s.tied else 2) + H
        gathered = (root + 2 * (s.layer_params() + A // s.layers)) * bc
        how_g = "FSDP2: unsharded root + 2 layers"
    ckpt = bool(cfg.optim.get("gradient_checkpointing", False))
    residual = residual_bytes(cfg, n)
    per_tok = activation_bytes_per_token(s, bc, residual, ckpt) + H * 4  # + the final hidden states (fp32)
    how_a = ""
    if lora:  # each adapter keeps its [tokens, r] input of B; with dropout also its dropped [tokens, in] input and mask
        lin = s.linears()
        names = lora.targets if lora.targets is not None else tuple(lin)
        extra = len(names) * lora.rank * bc + (sum(lin[t][0] for t in names) * (bc + 1) if lora.dropout > 0 else 0)
        per_tok += (1 if ckpt else s.layers) * extra
        how_a = f", adapters {(1 if ckpt else s.layers) * extra / 1024:.1f} KiB"
    rows = [Row("compute-dtype weights (update)", gathered, how_g, "microbatch")]
    if not trains:
        return rows
    fused = bool(cfg.optim.get("fused_lm_head", False))
    rows += [
        Row(
            f"activations ({mb.base} tokens)",
            mb.base * per_tok,
            f"{per_tok / 1024:.0f} KiB/token{' (checkpointed)' if ckpt else ''}{how_a}",
            "microbatch",
        ),
        Row(
            "micro-batch beyond the budget",
            max(mb.tokens - mb.base, 0) * per_tok,
            f"{mb.tokens} positions: {mb.how}",
            "microbatch",
        ),
    ]
    if fused:
        from pcsd.ops.fused import DEFAULT_GROUP_ELEMS, auto_token_chunk, fused_buffer_bytes

        most = max(mb.response_tokens, mb.longest_response)  # no buffer has more rows than the call's tokens
        chunk = min(max(auto_token_chunk(V), mb.longest_response), most)
        tile = fused_buffer_bytes(V, mb.longest_response, bc, tokens=mb.response_tokens)
        group = f" + a [{min(max(chunk, DEFAULT_GROUP_ELEMS // V), most)}, V] group buffer" if bc < 4 else ""
        how_t = f"a [{chunk}, V] float32 tile{group} (fused)"
    else:
        tile, how_t = 3 * TOKEN_CHUNK * VOCAB_CHUNK * 4, f"3 [{TOKEN_CHUNK}, {VOCAB_CHUNK}] tiles (recomputing)"
    w_grad = 0 if lora else V * H * 4  # LoRA: the lm head is frozen, its weight gradient never made
    rows.append(
        Row(
            "lm-head gradient buffers",
            w_grad + mb.response_tokens * H * 4 + tile,
            f"{'' if lora else 'float32 [V, H] + '}[{mb.response_tokens}, H] + {how_t}",
            "microbatch",
        )
    )
    if n > 1 and fused:
        rows.append(
            Row(
                "FSDP lm-head weight (fused pass)",
                V * H * 4,
                "float32 copy of the gathered weight, once per micro-batch",
                "microbatch",
            )
        )
    if adamw == "fused":
        rows.append(Row("AdamW step (fused)", 0, "fused=True on CUDA: in place, no temporaries", "step"))
    else:
        rows.append(
            Row(
                "AdamW step temporaries (foreach)",
                trained * bp // k,
                f"sqrt of the 2nd moments{' (adapters)' if lora else ''}, {m.param_dtype}, / {k}",
                "step",
            )
        )
    if backend == "vllm":
        rows.append(
            Row(
                "vLLM CUDA graphs (asleep)",
                VLLM_CUDA_GRAPH_BYTES,
                "sleep frees weights and KV cache, not the graph pool",
                "update",
            )
        )
    return rows


def hf_generation_bytes(s: Shape, cfg: Any, n: int, varlen: bool = False) -> tuple[int, int, str]:
    """(sequences per generate call, bytes, how) of the hf backend's generate (weights apart): the
    larger of its two peaks, :func:`hf_generation_phases`."""
    batch, at_prefill, at_decode, how = hf_generation_phases(s, cfg, n, varlen)
    return batch, max(at_prefill, at_decode), how


def hf_generation_phases(s: Shape, cfg: Any, n: int, varlen: bool = False) -> tuple[int, int, int, str]:
    """(sequences per generate call, bytes at the prefill, bytes at the last step, how) of the hf
    backend's generate, weights apart. The prefill: its activations at the widest point
    (:func:`prefill_bytes_per_token`) with the prompts' KV cache; the last step: the whole KV cache
    (and one layer's grown copy, which ``torch.cat`` makes before the old one is freed) and one
    step's logits with their sampling copies.

    The KV cache is held in the residual stream's dtype: float32 for an fp32 student under bf16
    autocast (one GPU). The rotary cos/sin follow the fp32 hidden states, so K after the rotation
    is float32, and transformers' ``DynamicLayer`` starts both caches empty in K's dtype, so the
    bf16 V is promoted as it is appended: twice the bf16 estimate (``docs/gpu.md``). Without
    flash-attention (``varlen`` False) the prefill also holds sdpa's ``[B, 1, L, L]`` bool mask."""
    m, r = cfg.model, cfg.rollout
    bc = _BYTES[m.compute_dtype]
    residual = residual_bytes(cfg, n)
    batch = min(HF_MAX_BATCH, math.ceil(r.tasks_per_step * r.group_size / n))
    prompt = int(r.max_prompt_tokens)
    length = prompt + r.max_response_tokens
    kv_tok = s.kv_bytes_per_token(residual)
    prefill = batch * prompt * prefill_bytes_per_token(s, bc, residual) + (0 if varlen else batch * prompt * prompt)
    kv = batch * length * kv_tok
    grow = kv // s.layers  # each step torch.cat makes a layer's longer cache while the old one lives
    logits = batch * s.vocab * LOGIT_COPY_BYTES
    how = (
        f"{batch} sequences of {length} tokens, the larger of prefill {prefill / GiB:.2f} + its KV "
        f"{batch * prompt * kv_tok / GiB:.2f} and KV {kv / GiB:.2f} + logits {logits / GiB:.2f} GiB "
        f"(KV in {'float32' if residual == 4 else 'the compute dtype'})"
    )
    return batch, batch * prompt * kv_tok + prefill, kv + grow + logits, how


def prefill_bytes_per_token(s: Shape, compute: int, residual: int) -> int:
    """Bytes per prompt token of a no-grad prefill at its widest point, one layer's MLP: four
    tensors of the residual stream (the embeddings, which the model's forward keeps to its end;
    the layer's input, which the loop over layers keeps; the residual after attention; its normed
    copy), the rotary cos and sin (the residual's dtype), and the MLP's gate, up and their product
    at once (transformers' Qwen2/Qwen3 code, measured on CPU in ``tests/test_plan.py``)."""
    return 4 * residual * s.hidden + 2 * residual * s.head_dim + 3 * compute * s.intermediate


def memory_plan(
    cfg: Any,
    world_size: int,
    device_bytes: int,
    shape: Optional[Shape] = None,
    *,
    varlen: Optional[bool] = None,
    backend: Optional[str] = None,
    adamw: Optional[str] = None,
    nodes: int = 1,
    mesh: Optional[str] = None,
    other_mesh: bool = True,
) -> Plan:
    """The plan of ``cfg`` on ``world_size`` GPUs of ``device_bytes`` each (see the module doc).
    ``varlen``: whether attention is flash-attention's (packed micro-batches; default: whether
    ``flash_attn`` is installed here); ``backend``: the rollout backend (default ``rollout.backend``);
    ``adamw``: ``fused`` (default: what a run on GPUs uses) or ``foreach``. ``nodes``: the
    ``world_size`` GPUs are on this many nodes, and ``mesh`` (default ``dist.mesh``) says what one
    GPU keeps: ``hsdp`` divides the training state by the GPUs of a node, ``flat`` by all of them;
    on several nodes a note gives the other mesh's static total and peak (unless ``other_mesh`` is
    false)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if nodes < 1 or world_size % nodes:
        raise ValueError(f"nodes must be >= 1 and divide world_size={world_size}, got {nodes}")
    mesh = mesh or str(getattr(getattr(cfg, "dist", None), "mesh", "flat"))
    if device_bytes <= 0:
        raise ValueError(f"device memory must be > 0 bytes, got {device_bytes}")
    s = shape or model_shape(cfg)
    varlen = attention_is_varlen() if varlen is None else varlen
    backend = backend or cfg.rollout.backend
    if adamw is None:
        from pcsd.train.optim import plan_adamw_kind

        adamw = plan_adamw_kind()
    if adamw not in ("fused", "foreach"):
        raise ValueError(f"adamw must be fused or foreach, got {adamw!r}")
    m, n = cfg.model, world_size
    P = s.params()
    bp, bc, bt = _BYTES[m.param_dtype], _BYTES[m.compute_dtype], _BYTES[m.teacher_dtype]
    mixed = m.compute_dtype != m.param_dtype
    plan = Plan(s, n, device_bytes, adamw=adamw, nodes=nodes, mesh=mesh)
    k = plan.shard_size  # the training state's divisor
    trains = cfg.optim.steps > 0
    frozen = cfg.algo.distill or (cfg.algo.grpo and cfg.algo.kl_beta > 0)
    lora = lora_of(cfg)
    if lora:  # the base frozen in the compute dtype (no master copy), float32 adapters train
        A = s.lora_params(lora.rank, lora.targets)
        what = f"rank {lora.rank} on {', '.join(lora.targets) if lora.targets is not None else 'every linear layer'}"
        rows = [
            Row("base weights (frozen)", P * bc // k, f"{m.compute_dtype}, / {k}", "static"),
            Row("LoRA adapters", A * bp // k, f"{A / 1e6:.1f} M, {what}, {m.param_dtype}, / {k}", "static"),
        ]
        if trains:
            rows += [
                Row("adapter gradients", A * bp // k, f"{m.param_dtype}, / {k}", "static"),
                Row("AdamW state (2 moments)", 2 * A * bp // k, f"adapters, {m.param_dtype}, / {k}", "static"),
            ]
        if frozen:
            rows.append(Row("frozen teacher/reference", 0, "the base with its adapters off: no copy", "static"))
    else:
        rows = [Row("master weights", P * bp // k, f"{m.param_dtype}, / {k}", "static")]
        if trains:
            rows += [
                Row("gradients", P * bp // k, f"{m.param_dtype}, / {k}", "static"),
                Row("AdamW state (2 moments)", 2 * P * bp // k, f"{m.param_dtype}, / {k}", "static"),
            ]
        if frozen:
            rows.append(Row("frozen teacher/reference", P * bt // k, f"{m.teacher_dtype}, / {k}", "static"))
    rows.append(Row("CUDA context + slack", CONTEXT_BYTES, "constant", "static"))
    # rollout phase
    util = float(cfg.rollout.gpu_memory_utilization)
    max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    want = math.ceil(cfg.rollout.tasks_per_step * cfg.rollout.group_size / n)
    vllm = int(util * device_bytes) if backend == "vllm" else 0
    kv = vllm - P * 2 - VLLM_ACTIVATION_BYTES - VLLM_CUDA_GRAPH_BYTES
    seqs = kv // (s.kv_bytes_per_token() * max_len) if kv > 0 else 0
    if backend == "vllm":
        rows += [
            Row("vLLM (rollout)", vllm, f"rollout.gpu_memory_utilization={util}", "rollout"),
            Row("  of which CUDA graphs", VLLM_CUDA_GRAPH_BYTES, "profiled into the share (vLLM >= 0.21)", "info"),
            Row(
                "  of which KV cache",
                max(kv, 0),
                f"~{seqs} sequences of {max_len} tokens at once (this rank plays {want})",
                "info",
            ),
        ]
    else:
        if n > 1:
            rows.append(Row("hf generation copy (full)", P * bc, f"{m.compute_dtype}, on every rank", "static"))
        else:
            cast = s.lora_params(lora.rank, lora.targets) if lora else P  # LoRA: the base is in the compute dtype
            rows.append(
                Row(
                    "hf generation: cast weights",
                    cast * bc if mixed else 0,
                    ("autocast's casts of the adapters" if lora else "autocast's cached casts")
                    if mixed
                    else "none (compute = param dtype)",
                    "rollout",
                )
            )
        _, gen, how = hf_generation_bytes(s, cfg, n, varlen)
        rows.append(Row("hf generation (KV, prefill, logits)", gen, how, "rollout"))
    rows += _update_rows(s, cfg, n, config_microbatch(cfg, varlen), backend, adamw, shard=k)
    plan.rows = rows
    if backend == "vllm":
        need = P * 2 + VLLM_ACTIVATION_BYTES + VLLM_CUDA_GRAPH_BYTES + s.kv_bytes_per_token() * max_len
        if 1 <= seqs < want:
            all_util = (need + s.kv_bytes_per_token() * max_len * (want - 1)) / device_bytes
            room = (device_bytes - plan.static_bytes) / device_bytes
            plan.notes.append(
                f"vLLM holds ~{seqs} of this rank's {want} sequences at once and queues the rest "
                f"(slower rollouts); rollout.gpu_memory_utilization={all_util:.2f} holds all of them"
                + ("" if all_util <= room else f", more than this GPU has room for ({room:.2f})")
            )
        if seqs < 1:
            plan.advice.append(
                f"vLLM's share cannot hold its weights and one sequence: raise "
                f"rollout.gpu_memory_utilization to >= {need / device_bytes:.2f}"
            )
    if not plan.fits:
        _advise(plan, cfg, varlen, backend)
    if nodes > 1 and other_mesh:
        _other_mesh_note(plan, cfg, device_bytes, s, varlen, backend, adamw)
    return plan


def _other_mesh_note(plan: Plan, cfg: Any, device_bytes: int, s: Shape, varlen: bool, backend: str, adamw: str) -> None:
    """On several nodes: what the other ``dist.mesh`` would keep per GPU (a note, and advice when
    only it fits)."""
    other = "flat" if plan.mesh == "hsdp" else "hsdp"
    alt = memory_plan(
        cfg,
        plan.world_size,
        device_bytes,
        s,
        varlen=varlen,
        backend=backend,
        adamw=adamw,
        nodes=plan.nodes,
        mesh=other,
        other_mesh=False,
    )
    plan.notes.append(
        f"dist.mesh={other} would keep {alt.static_bytes / GiB:.2f} GiB static per GPU (peak "
        f"{alt.peak / GiB:.2f} GiB; this plan: {plan.static_bytes / GiB:.2f} / {plan.peak / GiB:.2f}), "
        f"sharding over {alt.shard_size} GPUs"
        + (" (every all-gather crosses nodes)" if other == "flat" else " (all-gathers stay within a node)")
    )
    if not plan.fits and alt.fits:
        plan.advice.append(f"dist.mesh={other} fits")


def _advise(plan: Plan, cfg: Any, varlen: bool, backend: str) -> None:
    """The settings that would make a plan fit, added to ``plan.advice``."""
    s, n, device = plan.shape, plan.world_size, plan.device_bytes
    room = device - plan.static_bytes
    max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    if plan.static_bytes + plan.rollout_bytes > device:
        if backend == "vllm":
            need_min = s.params() * 2 + VLLM_ACTIVATION_BYTES + VLLM_CUDA_GRAPH_BYTES + s.kv_bytes_per_token() * max_len
            if room > need_min:
                plan.advice.append(f"lower rollout.gpu_memory_utilization to <= {room / device:.2f}")
            else:
                plan.advice.append(
                    "the training state leaves vLLM no room: use more GPUs (FSDP divides "
                    "weights, gradients and AdamW state) or rollout.backend=hf"
                )
        else:
            plan.advice.append(
                "the hf backend's generation does not fit: lower rollout.max_prompt_tokens / "
                "rollout.max_response_tokens, use rollout.backend=vllm or more GPUs"
            )
    if plan.static_bytes + plan.update_bytes > device and cfg.optim.steps > 0:

        def update(budget: int) -> int:
            mb = config_microbatch(cfg, varlen, budget)
            rows = _update_rows(s, cfg, n, mb, backend, plan.adamw, shard=plan.shard_size)
            probe = Plan(s, n, device, rows, plan.adamw, nodes=plan.nodes, mesh=plan.mesh)
            return probe.update_bytes

        lo, hi, fit = max_len, int(cfg.optim.tokens_per_microbatch) - 1, None
        while lo <= hi:  # the largest budget (>= one whole row) whose update fits
            mid = (lo + hi) // 2
            if update(mid) <= room:
                fit, lo = mid, mid + 1
            else:
                hi = mid - 1
        if fit is not None:
            plan.advice.append(f"lower optim.tokens_per_microbatch to <= {fit}")
        if not cfg.optim.get("gradient_checkpointing", False):
            plan.advice.append("set optim.gradient_checkpointing=true")
        if fit is None:
            plan.advice.append("use more GPUs (FSDP divides weights, gradients and AdamW state)")


def predict_update(
    cfg: Any,
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    shape: Optional[Shape] = None,
    varlen: Optional[bool] = None,
    world_size: int = 1,
    backend: str = "none",
    adamw: Optional[str] = None,
) -> Plan:
    """The plan's lines for one update of a batch with these row lengths (student prompts and
    responses): the static training state and the update phase, no rollout (``backend="vllm"``
    adds the sleeping engine's CUDA graphs) and no CUDA context, so that ``plan.static_bytes +
    plan.update_bytes`` is what ``torch.cuda.max_memory_allocated`` should see over an update
    after the first (AdamW's state exists). ``python -m pcsd.bench gpu`` compares the two."""
    s = shape or model_shape(cfg)
    varlen = attention_is_varlen() if varlen is None else varlen
    full = memory_plan(cfg, world_size, 1 << 62, s, varlen=varlen, backend=backend, adamw=adamw)
    keep = [r for r in full.rows if r.phase == "static" and r.item != "CUDA context + slack"]
    mb = batch_microbatch(cfg, prompt_lens, response_lens, varlen)
    rows = keep + _update_rows(s, cfg, world_size, mb, backend, full.adamw)
    return Plan(s, world_size, full.device_bytes, rows, adamw=full.adamw)


def device_memory_bytes() -> Optional[int]:
    """The first CUDA device's memory, or None without one."""
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - a plan must not fail on a driver problem
        return None
    return None
