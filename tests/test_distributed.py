"""FSDP2 update on 2 CPU processes (gloo) == the same update in one process.

A fixed RolloutBatch (random token ids, no generation) is split by whole groups over 2 ranks; each
rank shards the tiny student and the frozen reference/teacher with ``fully_shard`` and runs
:func:`pcsd.train.update.update_step` on its share. The loss and the updated weights must match one
process on the whole batch: the GRPO ``1/G sum_g 1/M_g`` and PCSD ``1/M`` normalisers are global.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port, spawn_ranks, tiny_run

from pcsd.train.distributed import DistContext, select_groups, single_process, split_groups

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32", reason="torch.distributed with gloo is needed"
)


def _cfg(extra=(), **algo):
    from pcsd.train.config import load_config

    ov = [
        "rollout.backend=hf",
        "optim.lr=1e-2",
        "optim.tokens_per_microbatch=96",
        "rollout.max_prompt_tokens=64",
        "rollout.max_response_tokens=32",
        "optim.grad_clip=1e9",
    ]
    ov += [f"algo.{k}={v}" for k, v in algo.items()] + list(extra)
    return load_config(ov)


def _optimizer(model):
    # SGD: the updated weights are w - lr * grad, so comparing them compares the gradients. (Adam's
    # first step is lr * g / (|g| + eps), about lr * sign(g): float rounding in near-zero gradient
    # entries would flip whole steps and say nothing about the loss normalisation.)
    return torch.optim.SGD(model.parameters(), lr=0.5)


def _load(model_dir):
    from pcsd.models import load_model

    m = load_model(model_dir, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(m).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():  # reference != student: the KL term and its gradient are not 0
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return m, frozen


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, algo: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = _cfg(**algo)
        student, frozen = _load(model_dir)
        du.shard_model(student, ctx)
        du.shard_model(frozen, ctx)
        opt = _optimizer(student)
        rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
        mine = select_groups(rb, split_groups(5, ctx))
        stats = update_step(student, frozen, opt, mine, cfg, step=0, ctx=ctx)
        state = du.full_model_state(student, ctx)
        if ctx.is_main:
            torch.save({"stats": stats, "state": state}, out)
    finally:
        du.shutdown(ctx)


# the ranks run the default update (fused lm-head, joint frozen pass); the one-process reference
# runs it too, or (third case) the recomputing path with two frozen passes
_RECOMPUTE = ("optim.fused_lm_head=false", "optim.joint_frozen_pass=never")


@pytest.fixture(scope="module")
def two_ranks(tiny_dir, tmp_path_factory):
    """``run(algo)``: rank 0's stats and full weights after the 2-rank update with ``algo``, computed once
    per ``algo`` (the first and third cases give the ranks the same update; only their references differ)."""
    done: dict = {}

    def run(algo: dict) -> dict:
        key = tuple(sorted(algo.items()))
        if key not in done:
            out = tmp_path_factory.mktemp("ranks") / "rank0.pt"
            spawn_ranks(_worker, (2, free_port(), str(tiny_dir), str(out), algo))
            done[key] = torch.load(out, weights_only=False)
        return done[key]

    return run


def _rank_one_hangs(rank: int) -> None:
    if rank == 1:
        time.sleep(600)


def test_a_hang_of_two_ranks_fails_fast(capfd):
    """conftest.spawn_ranks: a rank still running at the deadline (one waiting on a collective the
    other never joins) fails the test within seconds, naming it, not after the gloo timeout."""
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"^rank\(s\) (0, )?1 of 2 still running after 3 s \(a hang"):
        spawn_ranks(_rank_one_hangs, (), timeout_s=3)
    assert time.monotonic() - t0 < 120
    assert "Traceback" not in capfd.readouterr().err  # rank 1 killed (rank 0 too while it still starts)


@pytest.mark.parametrize(
    "algo, ref_extra",
    [(dict(), ()), (dict(loss_agg="token-mean", lambda_distill=0.5), ()), (dict(), _RECOMPUTE)],
    ids=["paper-agg", "token-mean", "fused-vs-recompute"],
)
def test_two_gloo_ranks_match_one_process(tiny_dir, two_ranks, algo, ref_extra):
    got = two_ranks(algo)
    cfg = _cfg(ref_extra, **algo)
    assert cfg.optim.fused_lm_head == (not ref_extra)
    assert_matches_one_process(got, tiny_dir, cfg)


def assert_matches_one_process(got: dict, model_dir, cfg) -> None:
    """``got`` (rank 0's stats and full weights after a sharded update of the hand-made batch)
    equals the same update in one process on the whole batch."""
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    student, frozen = _load(model_dir)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    opt = _optimizer(student)
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = update_step(student, frozen, opt, rb, cfg, step=0, ctx=single_process())
    finally:
        torch.set_num_threads(threads)

    for key in ("loss", "pg", "kl", "pcsd", "clip_frac", "gap_mean", "weight_mean", "tokens"):
        assert got["stats"][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert abs(ref["pcsd"]) > 1e-6 and abs(ref["kl"]) > 1e-6  # the terms with global normalisers take part
    sd = student.state_dict()
    assert set(got["state"]) >= {k for k in sd if k != "lm_head.weight"}
    moved = 0
    for k, v in sd.items():
        if k not in got["state"]:
            continue
        torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
        moved += int(not torch.equal(v, before[k]))
    assert moved >= len(sd) - 1  # the update really moved the weights being compared


# ----------------------------------------------------------------------------- two torchrun "nodes"
WORKER = Path(__file__).with_name("multinode_worker.py")


def _torchrun_node(node: int, port: int, target: list[str], env: dict, cwd=None) -> subprocess.Popen:
    """``torchrun --nnodes=2 --nproc_per_node=2 TARGET`` of node ``node`` (a script and its
    arguments, or ``-m pcsd.train ...``): c10d rendezvous on the loopback address, node 0's agent
    hosting its store."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=pcsd-two-nodes",
        f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
        "--local-addr=127.0.0.1",
        "--max-restarts=0",
        *target,
    ]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _two_nodes(target_of_node, env: dict, cwd=None, timeout: float = 300) -> list[tuple[int, str]]:
    """Both nodes' torchrun commands, run together: each one's exit status and output."""
    port = free_port()
    procs = [_torchrun_node(n, port, target_of_node(n), env, cwd) for n in range(2)]
    results = []
    try:
        for p in procs:
            log = p.communicate(timeout=timeout)[0]
            results.append((p.returncode, log))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.fixture(scope="module")
def two_nodes(tiny_dir, tmp_path_factory, child_env):
    """Two torchrun commands (2 "nodes" x 2 gloo processes) running tests/multinode_worker.py:
    rank 0's results on each mesh, and every rank's run-folder errors."""
    out = tmp_path_factory.mktemp("nodes")
    env = dict(child_env, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(WORKER.parent) + os.pathsep + env.get("PYTHONPATH", "")
    for rc, log in _two_nodes(lambda n: [str(WORKER), str(tiny_dir), str(out)], env):
        assert rc == 0, log[-4000:]
    errors = [json.loads((out / f"errors-{r}.json").read_text()) for r in range(4)]
    return torch.load(out / "rank0.pt", weights_only=False), errors


def test_two_torchrun_nodes_match_one_process(tiny_dir, two_nodes):
    """2 nodes x 2 processes (two torchrun commands, c10d rendezvous on 127.0.0.1): the update of
    the hand-made batch equals one process's on each mesh. HSDP: a 2-D mesh, each weight sharded
    over the 2 ranks of a node (half its rows each) and replicated across the nodes; flat: one
    1-D mesh, a quarter of the rows each."""
    results, errors = two_nodes
    assert all(e["nodes"] == 2 for e in errors)
    hsdp, flat = results["hsdp"], results["flat"]
    assert hsdp["mesh_shape"] == (2, 2) and hsdp["placements"] == "(Replicate(), Shard(dim=0))"
    assert flat["mesh_shape"] == (4,) and flat["placements"] == "(Shard(dim=0),)"
    rows = hsdp["rows"]
    assert hsdp["shard_size"] == 2 and hsdp["local_rows"] == [rows // 2] * 4
    assert flat["shard_size"] == 4 and flat["local_rows"] == [rows // 4] * 4
    for got in (hsdp, flat):
        assert_matches_one_process(got, tiny_dir, _cfg())


def test_a_node_that_cannot_see_the_run_folder_stops_every_rank_with_one_line(two_nodes):
    """The folder check of a multi-node run: fine where every node sees rank 0's folder; where node
    1 has a folder of its own at that path, every rank raises the same line naming node 1's ranks
    (within the wait, not a hang), and rank 0 alone prints it."""
    _, errors = two_nodes
    assert [e["errors"]["shared"] for e in errors] == [None] * 4
    blind = [e["errors"]["node 1 blind"] for e in errors]
    assert all(b is not None and b["all_ranks"] for b in blind)
    assert len({b["message"] for b in blind[:2]}) == 1  # node 0's ranks say the same
    msg = blind[0]["message"]
    assert "rank(s) 2, 3 on " in msg and "cannot see the run folder rank 0 writes" in msg, msg
    assert "within 0.5 s" in msg and "a file system every node mounts at the same path" in msg
    assert [e["agreed"] for e in errors] == ["rank(s) 3 of 4: cannot read it"] * 4
    assert "\n" not in msg


_TINY_RUN = tiny_run(
    "rollout.tasks_per_step=4", "optim.lr=1e-2", "run.device=cpu", "run.progress=false", "run.tensorboard=false"
)


@pytest.mark.slow
def test_a_training_run_on_two_torchrun_nodes_stops_resumes_and_checks_its_folder(tmp_path, child_env):
    """The whole loop on 2 "nodes" x 2 processes: a run stopped after step 1 on the flat mesh, resumed
    on the HSDP one (a mutable key: the checkpoint's full state loaded into the 2-D shards) to step 2; then a node whose run.dir is a folder of its own
    stops every rank with rank 0's one line (exit status 2), not a hang."""
    env = dict(child_env, OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    train = ["-m", "pcsd.train"]
    first = _two_nodes(
        lambda n: [*train, *_TINY_RUN, f"run.dir={run}", "run.stop_after=1", "dist.mesh=flat"], env, tmp_path, 900
    )
    assert all(rc == 0 for rc, _ in first), first[0][1][-3000:] + first[1][1][-3000:]
    assert json.loads((run / "summary.json").read_text())["stopped_after"] == 1
    again = _two_nodes(lambda n: [*train, "--resume", str(run), "dist.mesh=hsdp"], env, tmp_path, 900)
    assert all(rc == 0 for rc, _ in again), again[0][1][-3000:] + again[1][1][-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["world_size"] == 4 and summary["success_after"] is not None
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert steps == [1, 2]

    blind = _two_nodes(lambda n: [*train, *_TINY_RUN, f"run.dir={tmp_path / f'node{n}'}"], env, tmp_path, 900)
    assert [rc for rc, _ in blind] != [0, 0]
    lines = [ln for _, out in blind for ln in out.splitlines() if ln.startswith("pcsd.train: ")]
    assert len(lines) == 1, lines  # rank 0's, once
    assert "rank(s) 2, 3 on " in lines[0] and "cannot see the run folder rank 0 writes" in lines[0]


def test_a_rank_that_cannot_read_the_chosen_checkpoint_is_one_line(tmp_path):
    """resume_point's other ranks load the checkpoint rank 0 chose; one that cannot read it (its node
    does not see the folder) raises a CheckpointError marked for every rank, naming the folder."""
    from pcsd.train.checkpoint import CheckpointError
    from pcsd.train.job import Job, _load_chosen_checkpoint

    job = Job(cfg=None, run_dir=tmp_path, ctx=single_process(), console=None, t_start=0.0)
    gone = tmp_path / "checkpoints" / "step-00000001"
    with pytest.raises(CheckpointError, match="cannot read the checkpoint rank 0 chose: .*step-00000001") as info:
        _load_chosen_checkpoint(job, gone)
    assert info.value.all_ranks and "every node must see run.dir at the same path" in str(info.value)
    assert "\n" not in str(info.value)


def test_split_groups_covers_every_group_once():
    for n in range(0, 13):
        for world in range(1, 5):
            parts = [split_groups(n, DistContext(rank=r, world_size=world)) for r in range(world)]
            assert [g for p in parts for g in p] == list(range(n))
            assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_select_groups_keeps_whole_groups():
    from pcsd.tiny_model import synthetic_rollout_batch

    rb = synthetic_rollout_batch(num_groups=4, group_size=3, seed=1)
    sub = select_groups(rb, range(1, 3))
    assert sub.num_trajectories == 6
    assert sub.traj_group.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(sub.reward, rb.reward[3:9])
    rows = [i for i, t in enumerate(rb.traj_id.tolist()) if 3 <= t < 9]
    assert sub.response_ids == [rb.response_ids[i] for i in rows]
    assert sub.traj_id.tolist() == [rb.traj_id[i].item() - 3 for i in rows]
    with pytest.raises(ValueError, match="select no trajectory"):
        select_groups(rb, range(4, 5))


def test_bad_layouts_and_meshes_are_one_line(monkeypatch):
    from pcsd.train.config import ConfigError, load_config
    from pcsd.train.distributed import init_distributed, node_count

    with pytest.raises(ConfigError, match="dist.mesh"):
        load_config(["dist.mesh=ring"])
    with pytest.raises(ValueError, match="dist.mesh must be one of hsdp, flat, got 'ring'"):
        init_distributed(rank=0, world_size=1, mesh="ring")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3 must divide WORLD_SIZE=4"):
        node_count(0, 4, 3)
    assert node_count(3, 4, 2) == 2 and node_count(0, 1) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "1")  # torchrun's node rank: rank 0 cannot be on node 1
    with pytest.raises(ValueError, match="RANK=0 is on node GROUP_RANK=1, not node 0"):
        node_count(0, 4)
    assert node_count(2, 4) == 2


def test_bad_arguments():
    from pcsd.train.distributed import init_distributed

    with pytest.raises(ValueError, match="rank"):
        init_distributed(rank=2, world_size=2)
    with pytest.raises(ValueError, match="device"):
        init_distributed(rank=0, world_size=1, device="tpu")
    with pytest.raises(ValueError, match="num_groups"):
        split_groups(-1, single_process())
