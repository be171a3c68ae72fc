"""Process groups, FSDP2 sharding and the collective helpers the training loop uses.

The loop never reads launcher environment variables itself: it receives a :class:`DistContext`.

* ``torchrun --nproc_per_node=N -m pcsd.train ...``: :func:`init_distributed` reads ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` (set by torchrun).
* ``torchrun --nnodes=M --nproc_per_node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT -m
  pcsd.train ...`` on each of M nodes: the same, with ``M = WORLD_SIZE / LOCAL_WORLD_SIZE`` nodes.
  ``dist.mesh`` picks the device mesh (:func:`device_mesh`): ``hsdp`` (the default) a 2-D mesh
  ``(M, G)``, FSDP2 sharding within a node and replicating across nodes (HSDP: the all-gathers
  stay inside a node, one all-reduce of the gradient shards crosses nodes); ``flat`` one 1-D mesh
  of all ``M G`` ranks (every all-gather crosses nodes; each GPU keeps ``1 / (M G)`` of the state
  instead of ``1 / G``). On one node both are the same 1-D mesh. The device is
  ``cuda:<LOCAL_RANK>``; rollout seeds are by global rank (:func:`pcsd.train.job.rollout_seed`);
  every rank has its own env pools and (``rollout.backend=vllm``) its own engine. Rank 0 writes
  every file (checkpoints once, not once per node) into ``run.dir``, which every node must see at
  the same path (a shared file system): :func:`pcsd.train.rundir.check_shared_run_dir` checks it
  at the start.
* A Ray (or any other) launcher calls ``init_distributed(rank=..., world_size=...,
  init_method="tcp://host:port")`` in each worker, then :func:`pcsd.train.job.train` with the context.
* One process: :func:`single_process` (no process group; every collective is the identity).

Sharding uses FSDP2 (:func:`torch.distributed.fsdp.fully_shard`): each decoder layer is one FSDP
unit, then the root. The loop normalises its loss by *global* counts (GRPO's ``1/G sum_g 1/M_g``
and PCSD's ``1/M`` over every rank's tokens, see :func:`global_sum`), so the gradient of one
process on the whole batch is the *sum* of the ranks' gradients. FSDP2 reduce-scatters the mean,
so each rank back-propagates ``world_size * loss`` (:func:`grad_scale`). (FSDP2's
``set_gradient_divide_factor(1.0)`` would express the sum directly, but it reduces with
``ReduceOp.PREMUL_SUM``, which gloo does not implement: "Cannot use ReduceOp.PREMUL_SUM with
Gloo" in torch 2.13.)

Every FSDP forward is a collective (all-gather per layer), so every rank must run the same number
of forward passes: :func:`global_max` gives the count to pad to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from pcsd.lora import WeightSource, weight_sources

__all__ = [
    "DistContext",
    "single_process",
    "init_distributed",
    "shutdown",
    "shard_model",
    "split_groups",
    "global_sum",
    "global_max",
    "full_model_state",
    "merged_model_state",
    "full_optimizer_state",
    "iter_weights",
    "load_full_state",
    "broadcast_object",
    "barrier",
    "select_groups",
    "MESHES",
    "device_mesh",
    "gather_objects",
    "agree",
    "ranks_text",
]

#: the choices of ``dist.mesh`` (:func:`device_mesh`)
MESHES = ("hsdp", "flat")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits. ``mesh`` is the DeviceMesh FSDP2 shards over (None when alone): a
    1-D mesh over all ranks, or with ``mesh_kind="hsdp"`` on several nodes a 2-D ``(nodes,
    ranks per node)`` one (:func:`device_mesh`)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str = ""
    mesh: Any = None
    nodes: int = 1
    mesh_kind: str = "flat"

    @property
    def shard_size(self) -> int:
        """How many ranks one parameter is sharded over: the ranks of a node under HSDP, else all."""
        return self.world_size // self.nodes if self.mesh_kind == "hsdp" else self.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def single_process(device: torch.device | str = "cpu") -> DistContext:
    return DistContext(device=torch.device(device))


def init_distributed(
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    local_rank: Optional[int] = None,
    backend: Optional[str] = None,
    device: Optional[str] = None,
    init_method: str = "env://",
    timeout_s: float = 4 * 3600.0,
    mesh: str = "hsdp",
    local_world_size: Optional[int] = None,
) -> DistContext:
    """Joins (or creates) the default process group and builds the device mesh.

    Args default to the launcher's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
    ``LOCAL_WORLD_SIZE`` (ranks per node; absent: one node); with a world of one and no process
    group this is :func:`single_process`. ``backend`` defaults to ``nccl`` on CUDA and ``gloo`` on
    CPU; ``device`` (``auto``, ``cpu``, ``cuda``) picks ``cuda:<local_rank>``. ``mesh``: ``hsdp``
    or ``flat`` (:func:`device_mesh`). ``timeout_s`` is long because rank 0 evaluates alone while
    the others wait.
    """
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank)) if local_rank is None else local_rank
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size) and world_size >= 1, got rank={rank} world_size={world_size}"
        )
    if mesh not in MESHES:
        raise ValueError(f"dist.mesh must be one of {', '.join(MESHES)}, got {mesh!r}")
    nodes = node_count(rank, world_size, local_world_size)
    want = device or "auto"
    if want not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda and torch.cuda.is_available() and local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK={local_rank}, but this node has {torch.cuda.device_count()} GPU(s): run at most "
            f"that many processes per node (torchrun --nproc_per_node)"
        )
    dev = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size == 1 and not dist.is_initialized():
        return DistContext(device=dev)
    backend = backend or ("nccl" if use_cuda else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=dev,
        backend=backend,
        mesh=device_mesh(mesh, dev.type, world_size, nodes),
        nodes=nodes,
        mesh_kind=mesh,
    )


def node_count(rank: int, world_size: int, local_world_size: Optional[int] = None) -> int:
    """The number of nodes, ``world_size / local_world_size`` (default: ``LOCAL_WORLD_SIZE``,
    torchrun's ``--nproc_per_node``; absent: one node). Every node runs the same number of ranks,
    numbered node by node (torchrun's layout: rank = node rank x ranks per node + local rank, which
    its ``GROUP_RANK`` confirms when set)."""
    env = os.environ.get("LOCAL_WORLD_SIZE")
    per_node = (int(env) if env else world_size) if local_world_size is None else local_world_size
    if per_node < 1 or world_size % per_node:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={per_node} must divide WORLD_SIZE={world_size}: every node runs the same "
            f"number of processes (torchrun --nproc_per_node)"
        )
    group = os.environ.get("GROUP_RANK")
    if local_world_size is None and group is not None and int(group) != rank // per_node:
        raise ValueError(
            f"RANK={rank} is on node GROUP_RANK={group}, not node {rank // per_node}: the ranks of a node "
            f"must be numbered together (torchrun numbers them so)"
        )
    return world_size // per_node


def device_mesh(kind: str, device_type: str, world_size: int, nodes: int = 1) -> Any:
    """The DeviceMesh FSDP2 shards over (``dist.mesh``). ``hsdp`` on several nodes: 2-D
    ``(nodes, world_size / nodes)`` with dimensions ``replicate`` and ``shard``; row ``i`` holds
    node ``i``'s ranks, so :func:`torch.distributed.fsdp.fully_shard` shards each parameter over a
    node's ranks and keeps a replica per node (reduce-scatter within the node, then an all-reduce
    of the shards across nodes). ``flat``, and ``hsdp`` on one node: 1-D over all ranks. Collective:
    every rank builds every mesh, in the same order."""
    from torch.distributed.device_mesh import init_device_mesh

    if kind not in MESHES:
        raise ValueError(f"dist.mesh must be one of {', '.join(MESHES)}, got {kind!r}")
    if kind == "hsdp" and nodes > 1:
        return init_device_mesh(device_type, (nodes, world_size // nodes), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,))


def shutdown(ctx: DistContext) -> None:
    """Leaves the process group. All ranks meet at a barrier first: a rank that destroys its gloo
    group while a peer still has collectives in flight (FSDP2's last reduce-scatter, or rank 0
    still writing a file) can make the peer abort with "terminate called without an active
    exception"."""
    if ctx.distributed and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- sharding
def _decoder_layers(model: nn.Module) -> Sequence[nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError("shard_model: expected a HF causal LM with model.model.layers (Llama/Qwen family)")
    return list(layers)


def _packed_hidden(
    self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor], attention_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Final hidden states ``[B, N, H]`` of a packed row or a padded batch (what
    :func:`pcsd.ops.scoring.score_packed` needs), as an FSDP forward method of the causal LM."""
    return self.model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state


def shard_model(
    model: nn.Module, ctx: DistContext, *, reshard_after_forward: bool = True, mp_policy: Any = None
) -> nn.Module:
    """Shards ``model`` in place with FSDP2 (each decoder layer, then the root). The identity
    when ``ctx`` is a single process. Works for the trained student and for frozen models.
    ``mp_policy``: a ``MixedPrecisionPolicy`` (see :func:`pcsd.train.precision.fsdp_policy`)."""
    if not ctx.distributed:
        return model
    import types

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mp = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=ctx.mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    # The root unit holds the embeddings, the final norm and the lm head. pcsd.ops.scoring reads the
    # lm-head weight outside forward (chunked log-probs), so the root keeps its parameters
    # unsharded after forward (FSDP2's default for the root) and the packed forward is
    # registered as an FSDP forward method, so the root's all-gather / reduce-scatter hooks run.
    fully_shard(model, mesh=ctx.mesh, reshard_after_forward=False, mp_policy=mp)
    setattr(model, "pcsd_packed_hidden", types.MethodType(_packed_hidden, model))  # a method, not a submodule
    register_fsdp_forward_method(model, "pcsd_packed_hidden")
    return model


def grad_scale(ctx: DistContext) -> float:
    """Factor on the local loss before ``backward`` so that FSDP's mean over ranks is the sum."""
    return float(ctx.world_size)


def split_groups(num_groups: int, ctx: DistContext) -> range:
    """The contiguous share ``range(lo, hi)`` of ``num_groups`` GRPO groups played by this rank
    (whole groups stay on one rank, so advantages stay group-local). Sizes differ by at most 1."""
    if num_groups < 0:
        raise ValueError(f"num_groups must be >= 0, got {num_groups}")
    base, extra = divmod(num_groups, ctx.world_size)
    lo = ctx.rank * base + min(ctx.rank, extra)
    return range(lo, lo + base + (1 if ctx.rank < extra else 0))


# ----------------------------------------------------------------------------- collectives
def global_sum(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Element-wise sum over ranks (float64)."""
    if not ctx.distributed:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=_coll_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def global_max(value: int, ctx: DistContext) -> int:
    if not ctx.distributed:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=_coll_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def broadcast_object(obj: Any, ctx: DistContext, src: int = 0) -> Any:
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (picklable objects)."""
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def agree(problem: Optional[str], ctx: DistContext) -> Optional[str]:
    """The first rank's problem (a one-line message, or None when it has none) on every rank,
    naming the ranks that had one: what each rank found on its own (a file it cannot read) becomes
    the same error everywhere, so no rank goes on into a collective its peers never reach (a hang
    until the process group's timeout). Collective."""
    found = [(r, p) for r, p in enumerate(gather_objects(problem, ctx)) if p]
    if not found:
        return None
    ranks = [r for r, _ in found]
    if not ctx.distributed:
        return found[0][1]
    return f"rank(s) {ranks_text(ranks)} of {ctx.world_size}: {found[0][1]}"


def ranks_text(ranks: Sequence[int]) -> str:
    """``0, 1, 2`` (the first 8, then how many)."""
    return ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def _coll_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


# ----------------------------------------------------------------------------- state
def full_model_state(
    model: nn.Module, ctx: DistContext, *, all_ranks: bool = False, trainable_only: bool = False
) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on CPU: on rank 0 only (others get ``{}``), or on every rank
    with ``all_ranks`` (to refresh a per-rank generation copy). ``trainable_only``: the parameters
    that train alone (a LoRA run's adapters: the frozen base is never gathered). Collective under
    FSDP."""
    keep = {n for n, p in model.named_parameters() if p.requires_grad} if trainable_only else None
    if not ctx.distributed:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if keep is None or k in keep}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # ignore_frozen_params still gives a frozen weight tied to another name (the tied lm head): filtered
    opts = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks, ignore_frozen_params=trainable_only)
    sd = get_model_state_dict(model, options=opts)
    return {k: v.detach().cpu() for k, v in sd.items() if isinstance(v, torch.Tensor) and (keep is None or k in keep)}


def merged_model_state(model: nn.Module, ctx: DistContext, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's weights under their HF names in ``dtype`` on CPU, LoRA adapters merged into their
    layers (:func:`pcsd.lora.weight_sources`): on rank 0 (the others get ``{}``). Gathered a weight
    at a time under FSDP2 (collective)."""
    out: dict[str, torch.Tensor] = {}
    for src in weight_sources(model):
        t = src.make(dtype, _full)
        if ctx.is_main:
            cpu = t.detach().cpu()
            for name in src.names:
                out[name] = cpu
    return out


def iter_weights(
    model: nn.Module, ctx: DistContext, dtype: torch.dtype, bucket_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's full parameters as ``(name, tensor)`` in ``dtype`` on the model's device, for a
    generation engine's weight sync: a lazy stream that materialises one bucket at a time.

    Parameters are grouped in order into buckets of at most ``bucket_bytes`` (in ``dtype``; a
    larger parameter is a bucket of its own); a bucket's tensors are cast (and, under FSDP2,
    gathered from the shards after casting, so the gather moves ``dtype``) when the stream reaches
    it and dropped before the next one is made. So the memory a sync adds is one bucket, not the
    model, provided the consumer keeps nothing (vLLM's reload keeps a layer until it is complete).
    A tied parameter (the lm-head sharing the embedding) is cast and gathered once and yielded
    under each of its names one after the other, the same tensor: vLLM's layerwise reload counts
    the tied lm-head as a layer of its own and, given no weight for it, puts its old values back.
    A LoRA model streams its merged weights under the base model's names (:mod:`pcsd.lora`: each
    targeted weight made as ``W + (B @ A) * scaling`` in float32, then cast; under FSDP2 its base
    weight and adapters gathered first), never the adapters themselves.
    Collective under FSDP: every rank consumes the whole stream.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    buckets: list[list[WeightSource]] = [[]]
    size = 0
    for src in weight_sources(model):  # each parameter once, with all of its names
        n = src.numel * (itemsize if src.is_floating_point else src.parts[0].element_size())
        if buckets[-1] and size + n > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(src)
        size += n
    for plan in buckets:  # a bucket's tensors live in _bucket's frame: dropped before the next is made
        yield from _bucket(plan, dtype)


def _bucket(plan: list[WeightSource], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """One bucket of :func:`iter_weights`: its tensors made (cast, gathered), then yielded by name."""
    made = [(src.names, src.make(dtype, _full)) for src in plan]
    for names, t in made:
        for name in names:
            yield name, t


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (sharded) DTensor (an all-gather), or ``t`` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, ctx: DistContext) -> dict[str, Any]:
    """The optimizer's full state dict (parameter names as keys under FSDP). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if not ctx.distributed:  # same layout (parameter names as keys), so a run can change world size
        return get_optimizer_state_dict(model, opt)
    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(
    model: nn.Module,
    opt: Optional[torch.optim.Optimizer],
    model_state: dict,
    optimizer_state: Optional[dict],
    ctx: DistContext,
    *,
    trainable_only: bool = False,
) -> None:
    """Loads full state dicts (read on every rank) into a sharded or plain model/optimizer.
    ``trainable_only``: ``model_state`` holds the trained parameters alone (a LoRA run's adapters),
    every one of them; the frozen ones keep their values."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    if trainable_only:
        from pcsd.train.checkpoint import check_trainable_state

        check_trainable_state(model, model_state)
    if not ctx.distributed:
        from pcsd.train.checkpoint import apply_model_state

        apply_model_state(model, model_state, trainable_only=trainable_only)
        if opt is not None and optimizer_state is not None:
            set_optimizer_state_dict(model, opt, optimizer_state)
        return

    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, model_state, options=opts)
    if opt is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, opt, optimizer_state, options=opts)


def select_groups(rb, groups: range):
    """The sub-batch of ``rb`` (a :class:`pcsd.rollout.loop.RolloutBatch`) holding the GRPO groups
    ``groups`` (as :func:`split_groups` returns), trajectories and groups renumbered from 0.
    For launchers that collect rollouts centrally and hand each rank its share."""
    g_lo, g_hi = groups.start, groups.stop
    keep_traj = ((rb.traj_group >= g_lo) & (rb.traj_group < g_hi)).nonzero().flatten()
    if keep_traj.numel() == 0:
        raise ValueError(
            f"groups {groups} select no trajectory (the batch has groups "
            f"0..{int(rb.traj_group.max()) if rb.traj_group.numel() else -1})"
        )
    return rb.take_groups(groups)
