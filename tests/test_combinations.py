"""Every combination of the options a user combines works (issue 42, item 2; issue 27, part 5).

:data:`OPTIONS` lists the options and their values; :func:`pairwise` generates a table of rows (each
a value of every option) in which every PAIR of values of two options meets at least once (a
covering array, made greedily and deterministically). Each row runs through the job's own cheapest
path that reaches every option it sets: the job's models (:func:`pcsd.train.job.build_models`: LoRA
adapters or a frozen copy, FSDP2 sharding), :func:`pcsd.train.job.rl_step` (dynamic sampling, the
update, the step record) on a batch the real rollout loop played on a native env or a Python env
(GiGPO's anchors from each), the record's ``metrics.jsonl`` line and console line, and for
``resume`` a real checkpoint (:func:`pcsd.train.job.save`), resumed (:func:`resume_point`,
:func:`start`) and stepped again next to the uninterrupted job. A new option joins :data:`OPTIONS`
(and, where it needs one, :func:`_overrides`), not a test written by hand.

Rows on 2 FSDP2 ranks (gloo processes) are ``slow``, all run by one pair of processes
(:func:`two_rank_rows`: they import torch and join once; 0.5-30 s a row on 2 busy cores) under a
deadline (:func:`conftest.spawn_ranks`: a hang fails with each rank's stack); one FSDP2 case stays in the default run
(:func:`test_two_gloo_ranks_match_one_process`, which also checks that a non-finite update on one rank
is skipped on both). The crash of issue 42 (a teacher method's skipped step: ``KeyError: 'gap_mean'``,
and ``--resume`` the same) is one short end-to-end run."""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import free_port, spawn_ranks, tiny_run

from pcsd.ops.estimators import available_estimators
from pcsd.ops.policy_losses import available_policy_losses
from pcsd.train.methods import METHODS

TRAINED = [m for m, v in METHODS.items() if not m.endswith("-star") and v["overrides"].get("optim.steps") != 0]

#: the options a user combines, each with its values (the first: the default)
OPTIONS: dict[str, list[Any]] = {
    "method": TRAINED,
    "estimator": available_estimators(),
    "policy_loss": available_policy_losses(),
    "clip_high": [None, 0.28],
    "sampling": ["off", "dynamic", "skipped"],  # skipped: dynamic sampling finds no group with a signal
    "lora": [0, 4],
    "anchors": ["native", "python"],  # the env the batch was played on (GiGPO's anchor states)
    "ranks": [1, 2],
    "resume": [False, True],
}


def pairwise(options: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Rows (one value per option) covering every pair of values of two options: each row starts
    from the first pair not yet covered and takes, option by option, the value that covers the most
    uncovered pairs with the values chosen so far (ties: the earlier value)."""
    names = list(options)
    pos = {n: i for i, n in enumerate(names)}

    def key(a: str, va: Any, b: str, vb: Any) -> tuple:
        return (a, repr(va), b, repr(vb)) if pos[a] < pos[b] else (b, repr(vb), a, repr(va))

    todo = [
        key(a, va, b, vb) for i, a in enumerate(names) for b in names[i + 1 :] for va in options[a] for vb in options[b]
    ]
    uncovered = set(todo)
    rows = []
    while uncovered:
        a, va, b, vb = next(k for k in todo if k in uncovered)
        row = {a: next(v for v in options[a] if repr(v) == va), b: next(v for v in options[b] if repr(v) == vb)}
        for n in names:
            if n not in row:
                row[n] = max(options[n], key=lambda v: sum(key(m, row[m], n, v) in uncovered for m in row))
        rows.append(row)
        uncovered -= {key(m, row[m], n, row[n]) for m in names for n in names if pos[m] < pos[n]}
    return rows


TABLE = pairwise(OPTIONS)


def _row_id(row: dict[str, Any]) -> str:
    return "-".join(f"{k}={row[k]}" for k in OPTIONS)


def test_the_table_covers_every_pair():
    assert len(TABLE) >= len(TRAINED) * len(available_estimators())  # the two largest options' product
    for i, a in enumerate(OPTIONS):
        for b in list(OPTIONS)[i + 1 :]:
            met = {(repr(r[a]), repr(r[b])) for r in TABLE}
            assert met == {(repr(x), repr(y)) for x in OPTIONS[a] for y in OPTIONS[b]}, (a, b)


_SMALL = [
    "rollout.backend=hf",
    "optim.lr=1e-2",
    "optim.tokens_per_microbatch=1056",
    "rollout.max_prompt_tokens=1024",
    "rollout.max_response_tokens=32",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "optim.grad_clip=1e9",
    "optim.sft_steps=0",
    "run.tensorboard=false",
]


def _overrides(row: dict[str, Any]) -> list[str]:
    """The row's config overrides."""
    out = [f"method={row['method']}", f"algo.estimator={row['estimator']}", f"algo.policy_loss={row['policy_loss']}"]
    if row["clip_high"] is not None:
        out.append(f"algo.clip_eps_high={row['clip_high']}")
    if row["sampling"] != "off":
        out += ["rollout.dynamic_sampling=true", "rollout.max_sample_batches=2"]
    if row["lora"]:
        out.append(f"model.lora_rank={row['lora']}")
    return out


def _cfg(*extra: str, base: tuple[str, ...] = ()):
    from pcsd.train.config import ConfigWarning, load_config

    with warnings.catch_warnings():  # keys some methods do not read (e.g. the policy loss under opsd)
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(list(base or _SMALL) + list(extra))


def _ucfg(*extra: str):
    return _cfg(*extra, base=tuple(_UPDATE))


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """The tiny model's folder and, per env, a batch the rollout loop played (2 tasks x 2): the
    native dummy env's (anchors: its observations) and a Python env's (``info["anchor"]``), each
    with one winning trajectory per group added (a reward signal) and as played (none: dynamic
    sampling skips the step). Saved to files for the gloo processes."""
    from pcsd.envs.protocol import EnvFactory
    from pcsd.models import load_model
    from pcsd.rollout.backends import make_backend
    from pcsd.rollout.loop import collect_rollouts
    from pcsd.text.prompts import PromptBuilder
    from pcsd.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("combinations")
    path = make_tiny_model(root / "m", hidden_size=64, num_layers=1, seed=3)
    model = load_model(path, torch.device("cpu"), "float32")
    envs = {
        "native": ("alfworld", "dummy", 2, dict(episode_len=2)),
        "python": ("text", "gym", [5, 6], {"make_env": EnvFactory("textenv_faults:Anchored", kwargs={"length": 2})}),
    }
    files = {}
    for name, (family, kind, games, options) in envs.items():
        builder = PromptBuilder(family, history_length=1, max_prompt_tokens=1024, tokenizer_dir=path)
        eos = builder.tokenizer.encode("<|im_end|>")[0]
        rb = collect_rollouts(
            make_backend("hf", model=model, pad_token_id=eos),
            builder,
            games,
            2,
            max_steps=2,
            max_response_tokens=8,
            seed=1,
            stop_token_ids=[eos],
            env_kind=kind,
            env_options=options,
        )
        assert rb.anchor is not None and rb.num_rows > 0 and rb.prompt_overflows == 0
        flat = copy.deepcopy(rb)
        flat.reward = torch.zeros_like(rb.reward)  # every group's rewards equal: no signal
        flat.step_reward = torch.zeros_like(rb.step_reward)
        rb.reward, rb.step_reward = flat.reward.clone(), flat.step_reward.clone()
        for g in range(rb.num_groups):  # the group's first trajectory wins
            t = int((rb.traj_group == g).nonzero()[0])
            rb.reward[t] += 1.0
            rb.step_reward[max(i for i, x in enumerate(rb.traj_id.tolist()) if x == t)] += 1.0
        files[name] = root / f"{name}.pt"
        torch.save({"signal": rb, "flat": flat, "family": family}, files[name])
    return path, files


# ----------------------------------------------------------------------------- one row
class _Plays:
    """The job's ``play_batch`` replaced by the played batch (this rank's share of its groups)."""

    def __init__(self, rb):
        self.rb, self.calls = rb, 0

    def __call__(self, job, step, batch=0, played=None):
        from pcsd.train import distributed as du

        self.calls += 1
        mine = du.split_groups(self.rb.num_groups, job.ctx)
        if played is not None:
            played += [f"task {g}" for g in mine]
        return self.rb.take_groups(list(mine))


def _job(cfg, model_dir: Path, run_dir: Path, ctx, family: str):
    """A job with the models the job builds (the student from ``model_dir``; the frozen base, LoRA,
    FSDP2 sharding, the hf backend and AdamW by :func:`pcsd.train.job.build_models`)."""
    from rich.console import Console

    from pcsd.models import load_model
    from pcsd.text.prompts import PromptBuilder
    from pcsd.train import job as J

    job = J.Job(cfg, run_dir, ctx, Console(quiet=True), time.time())
    if cfg.run.resume:
        J.resume_point(job)
    job.model_dir = job.base_dir = model_dir
    job.student = load_model(model_dir, ctx.device, cfg.model.param_dtype)
    job.builder = PromptBuilder(family, history_length=1, max_prompt_tokens=1024, tokenizer_dir=model_dir)
    J.build_models(job)
    return job


def _trained(job) -> dict[str, torch.Tensor]:
    from pcsd.train import distributed as du

    return du.full_model_state(job.student, job.ctx, trainable_only=job.peft is not None)


def run_row(row: dict[str, Any], model_dir: Path, batch_file: Path, run_dir: Path, ctx=None) -> dict[str, Any]:
    """One row on this process (``ctx``: its rank): the job's step 1 (and with ``resume`` its
    checkpoint, a resumed job and step 2 on both); returns what the test checks."""
    from pcsd.train import job as J
    from pcsd.train.distributed import single_process
    from pcsd.train.metrics import UpdateStats, console_line

    ctx = ctx or single_process()
    data = torch.load(batch_file, weights_only=False)
    rb = data["flat" if row["sampling"] == "skipped" else "signal"]
    cfg = _cfg(*_overrides(row), f"run.dir={run_dir}", "optim.steps=2")
    job = _job(cfg, model_dir, run_dir, ctx, data["family"])
    start = _trained(job)
    real = J.play_batch
    J.play_batch = _Plays(rb)
    try:
        rec = J.rl_step(job, 0)
        after = _trained(job)  # collective under FSDP2: every rank gathers, rank 0 gets the weights
        out: dict[str, Any] = dict(
            line=rec.line(),
            console=console_line(rec, 2, J.uses_teacher(cfg)),
            skipped=rec.skipped,
            calls=J.play_batch.calls,
            moved=[k for k, v in after.items() if not torch.equal(v, start[k])],
            update_keys=set(UpdateStats.__annotations__),
        )
        if row["resume"]:
            J.save(job, 1)
            again = _job(
                _cfg(*_overrides(row), f"run.dir={run_dir}", "optim.steps=2", f"run.resume={run_dir}"),
                model_dir,
                run_dir,
                ctx,
                data["family"],
            )
            J.start(again)
            assert again.first_step == 1
            J.rl_step(job, 1)
            J.rl_step(again, 1)
            a, b = _trained(job), _trained(again)
            out["resumed_equal"] = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    finally:
        J.play_batch = real
    return out


def _check(row: dict[str, Any], got: dict[str, Any]) -> None:
    line, console = got["line"], got["console"]
    json.dumps(line, allow_nan=False)
    update_fields = {("entropy" if k == "entropy_proxy" else k) for k in got["update_keys"]}
    assert console.startswith("step 1/2 success ") and "\n" not in console
    if row["sampling"] == "skipped":  # the rule: no update field, skipped: true, "no update" on the console
        assert got["skipped"] and line["skipped"] is True and not update_fields & set(line), line
        assert "no update" in console and got["moved"] == [] and got["calls"] == 2
    else:
        assert not got["skipped"] and "skipped" not in line and update_fields <= set(line)
        assert line["nonfinite_updates"] == 0
        assert all(math.isfinite(line[k]) for k in update_fields), line
        assert got["moved"], "the update moved no trained weight"
        assert ("gap " in console) == METHODS[row["method"]]["overrides"]["algo.distill"], console
    if row["sampling"] != "off":
        assert {"sample_batches", "groups_kept", "groups_dropped"} <= set(line)
    assert ("anchor_groups" in line) == (row["estimator"] == "gigpo")
    if row["estimator"] == "gigpo" and row["sampling"] == "skipped":
        assert line["anchor_groups"] == 0.0
    if row["resume"]:
        assert got["resumed_equal"], "the resumed job's step 2 differs from the uninterrupted one's"


ONE_PROCESS = [r for r in TABLE if r["ranks"] == 1]
TWO_RANKS = [r for r in TABLE if r["ranks"] == 2]


@pytest.mark.parametrize("row", ONE_PROCESS, ids=[_row_id(r) for r in ONE_PROCESS])
def test_a_row_of_the_table(played, tmp_path, row):
    path, files = played
    _check(row, run_row(row, path, files[row["anchors"]], tmp_path / "run"))


def _rows_worker(rank: int, world: int, port: int, rows: list, model_dir: str, batches: dict, root: str) -> None:
    """One rank of :func:`two_rank_rows`: every row in turn in one process group (the ranks import
    torch and join once); rank 0 saves each row's result and its seconds as it ends."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.train import distributed as du

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        for i, row in enumerate(rows):
            t0 = time.perf_counter()
            got = run_row(row, Path(model_dir), Path(batches[row["anchors"]]), Path(root) / f"run-{i}", ctx)
            if ctx.is_main:
                torch.save(dict(got, seconds=time.perf_counter() - t0), Path(root) / f"row-{i}.pt")
    finally:
        du.shutdown(ctx)


@pytest.fixture(scope="module")
def two_rank_rows(played, request, tmp_path_factory):
    """``row id -> result`` of the two-rank rows this session runs (its selected tests), all on one
    pair of gloo processes, and why the ranks stopped early (None when they ran every row). A hang
    fails within :data:`conftest.RANKS_TIMEOUT_S` plus a minute a row, with the ranks' stacks."""
    path, files = played
    rows = [
        item.callspec.params["row"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_a_row_of_the_table_on_two_gloo_ranks"
    ]
    root = tmp_path_factory.mktemp("two-ranks")
    batches = {k: str(v) for k, v in files.items()}
    failure = None
    try:
        spawn_ranks(_rows_worker, (2, free_port(), rows, str(path), batches, str(root)), timeout_s=120 + 60 * len(rows))
    except (Exception, pytest.fail.Exception) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    got = {}
    for i, row in enumerate(rows):
        if (root / f"row-{i}.pt").is_file():
            got[_row_id(row)] = torch.load(root / f"row-{i}.pt", weights_only=False)
            print(f"two ranks: {got[_row_id(row)]['seconds']:.1f} s {_row_id(row)}")
    return got, failure


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="gloo is needed")
@pytest.mark.parametrize("row", TWO_RANKS, ids=[_row_id(r) for r in TWO_RANKS])
def test_a_row_of_the_table_on_two_gloo_ranks(two_rank_rows, row):
    got, failure = two_rank_rows
    if _row_id(row) not in got:
        pytest.fail(f"the two ranks stopped before this row ended: {failure}", pytrace=False)
    _check(row, got[_row_id(row)])


# ----------------------------------------------------------------------------- the crash of issue 42
def test_a_teacher_method_with_skipped_steps_trains_and_resumes(played, tmp_path, capsys):
    """method=pcsd with the upper clip and dynamic sampling on the untrained tiny model: no group
    has a reward signal, every step is skipped. Before the fix the first step's console line died
    with KeyError: 'gap_mean', and --resume the same; now both runs end, and each line follows the
    rule (no update field, skipped: true)."""
    from pcsd.train.cli import main
    from pcsd.train.metrics import UpdateStats

    run = tmp_path / "run"
    base = [
        f"model.path={played[0]}",
        f"run.dir={run}",
        "method=pcsd",
        "algo.clip_eps_high=0.28",
        "rollout.dynamic_sampling=true",
        "rollout.max_sample_batches=1",
        *tiny_run("rollout.tasks_per_step=2", "eval.before=false", "run.stop_after=1", "run.tensorboard=false"),
    ]
    assert main(base) == 0
    assert main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "step 1/2 success 0.0% reward 0.00 no update (no group with a reward signal)" in out
    assert "step 2/2 success 0.0% reward 0.00 no update (no group with a reward signal)" in out
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"]) for r in recs] == [(1, True), (2, True)]
    assert not {("entropy" if k == "entropy_proxy" else k) for k in UpdateStats.__annotations__} & set(recs[0])


# ----------------------------------------------------------------------------- FSDP2
#: the update on a hand-made batch (the FSDP2 comparison below)
_UPDATE = [
    "rollout.backend=hf",
    "optim.lr=1e-2",
    "optim.tokens_per_microbatch=96",
    "rollout.max_prompt_tokens=64",
    "rollout.max_response_tokens=32",
    "optim.grad_clip=1e9",
    "optim.ppo_epochs=2",  # a second epoch: ratios differ from 1, so ppo and gspo differ
    "algo.clip_eps_high=0.28",
]


@pytest.fixture(scope="module")
def models(played):
    return (played[0],)


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, extra: list, shares: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train import distributed as du
    from pcsd.train.update import update_step

    ctx = du.init_distributed(rank=rank, world_size=world, device="cpu")
    try:
        cfg = _ucfg(*extra)
        student, frozen = _load(model_dir)
        du.shard_model(student, ctx)
        du.shard_model(frozen, ctx)
        opt = torch.optim.SGD(student.parameters(), lr=0.5)
        mine = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7).take_groups(shares[rank])
        stats = update_step(student, frozen, opt, mine, cfg, step=0, ctx=ctx)
        state = du.full_model_state(student, ctx)
        # then one rank alone (one with groups) sees a loss that is not finite (its gradient is): every rank skips
        import pcsd.train.update as upd

        real = upd.micro_batch_loss
        if rank == (0 if shares[0] else 1):
            upd.micro_batch_loss = lambda *a, **k: (lambda lp: (lp[0] + float("inf"), lp[1]))(real(*a, **k))
        skipped = update_step(student, frozen, opt, mine, cfg, step=1, ctx=ctx)["nonfinite_updates"]
        upd.micro_batch_loss = real
        after = du.full_model_state(student, ctx)
        if ctx.is_main:
            same = all(torch.equal(after[k], v) for k, v in state.items())
            torch.save({"stats": stats, "state": state, "skipped": skipped, "unchanged": same}, out)
    finally:
        du.shutdown(ctx)


def _load(model_dir):
    from pcsd.models import load_model

    m = load_model(model_dir, torch.device("cpu"), "float32")
    frozen = copy.deepcopy(m).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in frozen.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
            p.requires_grad_(False)
    return m, frozen


@pytest.mark.skipif(not torch.distributed.is_available() or sys.platform == "win32", reason="gloo is needed")
@pytest.mark.parametrize(
    "extra, shares",
    [
        # dynamic sampling may leave a rank without a group: it joins the collectives with padding passes
        (["method=pcsd", "algo.estimator=gigpo", "algo.policy_loss=gspo"], [[0, 1, 2, 3, 4], []]),
        pytest.param(["method=sdar", "algo.estimator=rloo"], [[0, 1, 2], [3, 4]], marks=pytest.mark.slow),
    ],
    ids=["gigpo-gspo-a-rank-without-groups", "rloo"],
)
def test_two_gloo_ranks_match_one_process(models, tmp_path, extra, shares):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.distributed import single_process
    from pcsd.train.update import update_step

    path = str(models[0])
    out = tmp_path / "rank0.pt"
    spawn_ranks(_worker, (2, free_port(), path, str(out), extra, shares))
    got = torch.load(out, weights_only=False)
    student, frozen = _load(path)
    rb = synthetic_rollout_batch(num_groups=5, group_size=2, seed=7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = update_step(
            student, frozen, torch.optim.SGD(student.parameters(), lr=0.5), rb, _ucfg(*extra), 0, single_process()
        )
    finally:
        torch.set_num_threads(threads)
    for key in ("loss", "pg", "kl", "pcsd", "clip_frac", "tokens"):
        assert got["stats"][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert got["skipped"] == 2 and got["unchanged"]  # both passes skipped on every rank, no shard moved
    assert abs(ref["pg"]) > 1e-6
    for k, v in student.state_dict().items():
        if k in got["state"]:
            torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
