"""One rank of the two torchrun "nodes" of ``tests/test_distributed.py::test_two_torchrun_nodes_match_one_process``.

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT \
        tests/multinode_worker.py MODEL_DIR OUT_DIR

Each rank joins through torchrun's environment (:func:`pcsd.train.distributed.init_distributed`,
``dist.mesh=hsdp``: a 2-D mesh of 2 nodes x 2 ranks), then runs the update of the hand-made batch
of ``test_distributed`` on its share of the groups twice, on the HSDP mesh and on the flat one,
each from freshly loaded models; rank 0 saves both results. Then the run-folder check
(:func:`pcsd.train.rundir.check_shared_run_dir`): once on a folder both nodes see, once with node 1
looking at a folder of its own (a node without the shared file system), and a problem of rank 3 alone
made every rank's (:func:`pcsd.train.distributed.agree`); every rank records what it got.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from test_distributed import _cfg, _load, _optimizer

    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.rundir import RunDirError, check_shared_run_dir
    from pcsd.train.update import update_step

    out = Path(out_dir)
    ctx = du.init_distributed(device="cpu", mesh="hsdp")
    try:
        flat = dataclasses.replace(ctx, mesh=du.device_mesh("flat", "cpu", ctx.world_size, ctx.nodes), mesh_kind="flat")
        results = {}
        for c in (ctx, flat):
            student, frozen = _load(model_dir)
            du.shard_model(student, c)
            du.shard_model(frozen, c)
            weight = student.model.layers[0].mlp.up_proj.weight
            rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
            mine = du.select_groups(rb, du.split_groups(5, c))
            stats = update_step(student, frozen, _optimizer(student), mine, _cfg(), step=0, ctx=c)
            results[c.mesh_kind] = dict(
                stats=stats,
                state=du.full_model_state(student, c),
                mesh_shape=tuple(c.mesh.shape),
                placements=str(weight.placements),
                local_rows=du.gather_objects(weight.to_local().shape[0], c),
                rows=weight.shape[0],
                shard_size=c.shard_size,
            )
        # the run folder: seen by every node, then not by node 1 (its own folder at "the same path")
        shared = out / "run"
        if ctx.is_main:
            shared.mkdir()
        du.barrier(ctx)
        errors = {}
        for case, folder in (("shared", shared), ("node 1 blind", shared if ctx.rank < 2 else out / "node1-disk")):
            folder.mkdir(exist_ok=True)
            try:
                check_shared_run_dir(folder, ctx, wait_s=0.5)
                errors[case] = None
            except RunDirError as exc:
                errors[case] = dict(message=str(exc), all_ranks=getattr(exc, "all_ranks", False))
        # what one rank found alone (rank 3: a file it cannot read) becomes every rank's error
        agreed = du.agree("cannot read it" if ctx.rank == 3 else None, ctx)
        (out / f"errors-{ctx.rank}.json").write_text(json.dumps(dict(nodes=ctx.nodes, errors=errors, agreed=agreed)))
        if ctx.is_main:
            torch.save(results, out / "rank0.pt")
    finally:
        du.shutdown(ctx)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
