"""A run's work is never lost or mixed (issue 22, part 1): training games cost no disk, a run folder
belongs to one training, a damaged checkpoint is skipped, Ctrl-C before the first checkpoint loses
at most the warm-up in progress."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from conftest import tiny_run

from pcsd.train.rundir import LOCK_NAME, RunDirError, claim_run_dir

_TINY = tiny_run("optim.lr=1e-2")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=1, seed=3)


def _train(args: list[str], cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pcsd.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _one_line_error(stderr: str, *needles: str) -> str:
    """The ``pcsd.train:`` line of a refused run: exactly one, no traceback, naming what it must."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("pcsd.train:")]
    assert len(lines) == 1, stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


# ----------------------------------------------------------------------------- 1.1 training games
def test_training_games_are_generated_when_played_not_written(tmp_path):
    """``optim.steps=100000`` with 1000 tasks a step: 10**8 training games, none on disk, set up in
    seconds (file-based, this wrote ~44 KB per game before training)."""
    from pcsd.train.config import load_config
    from pcsd.train.job import setup

    cfg = load_config(["optim.steps=100000", "rollout.tasks_per_step=1000", f"run.dir={tmp_path}", "eval.episodes=4"])
    t0 = time.perf_counter()
    job = setup(cfg, tmp_path, None)
    assert time.perf_counter() - t0 < 30
    assert len(job.train_games) == 100_000 * 1000
    assert not (tmp_path / "games" / "train").exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) <= 4 and sum(p.stat().st_size for p in written) < 1 << 20  # the 4 evaluation games
    g = job.train_games[job.rng.randrange(len(job.train_games))]
    assert json.loads(g.text())["pcsd_gen"]["room"] in cfg.env.rooms


# ----------------------------------------------------------------------------- 1.2 the run folder
def test_two_trainings_on_one_run_dir_then_a_new_run_into_the_finished_one(tmp_path, tiny_dir, child_env, capsys):
    """A second training into a folder in use is refused (one line, exit 2) and the first finishes
    alone; a new run into the finished run's folder is refused; ``run.overwrite=true`` moves the old
    run aside (nothing deleted) and starts clean. The first training is a process of its own (it
    holds the folder's lock); the later commands run in this one (``python -m pcsd.train`` is
    ``sys.exit(main())``), which saves an interpreter start each."""
    from pcsd.train.cli import main

    run = tmp_path / "run"
    common = _TINY + [f"model.path={tiny_dir}", f"run.dir={run}"]
    first = subprocess.Popen(
        [sys.executable, "-m", "pcsd.train", *common, "optim.steps=4"],
        cwd=tmp_path,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (run / "config.yaml").exists():  # the first run holds the folder
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.2)
        capsys.readouterr()
        assert main(common) == 2  # a second training, while the first holds the folder
        _one_line_error(capsys.readouterr().err, f"run.dir={run} is in use by another training (pid {first.pid}")
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    assert _steps(run) == [1, 2, 3, 4]  # one run's records, not two interleaved
    finished = json.loads((run / "summary.json").read_text())

    assert main(common + ["optim.steps=1"]) == 2
    _one_line_error(
        capsys.readouterr().err,
        f"run.dir={run} is not empty: it holds a run",
        "checkpoints/",
        "--resume",
        "run.overwrite=true",
    )
    assert main(["--resume", str(run), "run.overwrite=true"]) == 2
    _one_line_error(capsys.readouterr().err, "give one of them")

    fresh = main(common + ["optim.steps=1", "run.overwrite=true"])
    out, err = capsys.readouterr()
    assert fresh == 0, err[-3000:]
    aside = list(tmp_path.glob("run.replaced-*"))
    assert len(aside) == 1 and f"moved to {aside[0]}" in out
    assert json.loads((aside[0] / "summary.json").read_text()) == finished  # the old run, whole
    assert _steps(aside[0]) == [1, 2, 3, 4] and (aside[0] / "checkpoints" / "step-00000004" / "COMPLETE").is_file()
    assert _steps(run) == [1] and json.loads((run / "summary.json").read_text())["steps"] == 1
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000001"]


def test_a_killed_training_leaves_no_stale_lock(tmp_path, child_env):
    """The lock is a flock: held while its process lives, released by the kernel when it dies
    (kill -9: no handler runs)."""
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pcsd.train.rundir import claim_run_dir\n"
            "claim_run_dir(sys.argv[1], resume=False)\nprint('locked', flush=True)\ntime.sleep(600)",
            str(run),
        ],
        cwd=tmp_path,
        env=child_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"in use by another training \(pid {holder.pid} on "):
            claim_run_dir(run, resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    lock, aside = claim_run_dir(run, resume=True)  # free again
    assert lock.held and aside is None and f"pid {os.getpid()}" in (run / LOCK_NAME).read_text()
    with pytest.raises(RunDirError, match="in use"):  # another open of the lock file, same process
        claim_run_dir(run, resume=True)
    lock.release()
    lock, _ = claim_run_dir(run, resume=False)  # only the lock file there: an empty folder
    lock.release()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"not empty: it holds files that are not a run \(notes.txt\)"):
        claim_run_dir(run, resume=False)
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        claim_run_dir(run / "notes.txt", resume=False)


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path, tiny_dir, capsys):
    from pcsd.train.cli import main

    if os.geteuid() == 0:  # root writes through permissions: use a read-only file system
        missing, existing = Path("/sys/pcsd-test-run"), Path("/sys/kernel")
        if not existing.is_dir():
            pytest.skip("no read-only /sys here to test with")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        existing, missing = ro, ro / "run"
        ro.chmod(0o555)
    assert main(_TINY + [f"model.path={tiny_dir}", f"run.dir={missing}"]) == 2
    _one_line_error(capsys.readouterr().err, f"run.dir={missing}: cannot create it")
    assert main(_TINY + [f"model.path={tiny_dir}", f"run.dir={existing}"]) == 2
    _one_line_error(capsys.readouterr().err, f"run.dir={existing}: cannot write there")


# ----------------------------------------------------------------------------- 1.3 damaged checkpoints
def test_resume_skips_a_damaged_checkpoint_with_one_warning(tmp_path, tiny_dir, capsys):
    """The newest checkpoint's weights truncated after it completed: ``--resume`` warns once and
    continues from the previous one, and the run ends as an uninterrupted one does."""
    from pcsd.train.cli import main

    run = tmp_path / "run"
    assert main(_TINY + [f"model.path={tiny_dir}", f"run.dir={run}", "optim.steps=3", "run.stop_after=2"]) == 0
    weights = run / "checkpoints" / "step-00000002" / "model" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    capsys.readouterr()
    assert main(["--resume", str(run), "run.stop_after=0"]) == 0
    out = capsys.readouterr().out
    warnings = [ln for ln in out.splitlines() if "warning:" in ln]
    assert warnings == [
        f"[pcsd] warning: checkpoint {run / 'checkpoints' / 'step-00000002'} is damaged "
        f"(model/model.safetensors has {size // 2} bytes, {size} when written (truncated)); skipped"
    ]
    assert f"resuming from {run / 'checkpoints' / 'step-00000001'} (step 1)" in out
    assert _steps(run) == [1, 2, 3] and json.loads((run / "summary.json").read_text())["steps"] == 3
    from pcsd.train.checkpoint import load_checkpoint

    assert load_checkpoint(run / "checkpoints" / "step-00000002").step == 2  # written again, intact


# ----------------------------------------------------------------------------- 1.4 the warm-up
def _until(
    proc: subprocess.Popen, text: str, seen: list[str], timeout: float = 1800, err_path: Optional[Path] = None
) -> None:
    deadline = time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return
        assert time.time() < deadline, "".join(seen[-20:])
    err = err_path.read_text() if err_path is not None else proc.stderr.read()
    raise AssertionError(f"{text!r} never came: " + "".join(seen[-20:]) + err[-3000:])


#: ``python -c`` body: the trainer, paused where a Ctrl-C is to land (``warm-up``: halfway through the
#: warm-up's steps; ``built``: after the warm-up was saved, before the models are built), printing
#: ``PAUSED`` and waiting for the signal there, so that where it lands does not depend on timing
_PAUSING = """
import sys, time
import pcsd.train.job as job

at, args = sys.argv[1], sys.argv[2:]


def pause():
    print("PAUSED", flush=True)
    while True:  # the SIGINT handler raises KeyboardInterrupt here: in a sleep, or before the next one
        time.sleep(0.05)  # (signal.pause() would miss a signal that came before it was entered)


if at == "warm-up":
    sft = job.sft_warmup

    def paused_sft(*a, progress=None, **k):
        def each(s, n, loss):
            if progress is not None:
                progress(s, n, loss)
            if s == n // 2:
                pause()

        return sft(*a, progress=each, **k)

    job.sft_warmup = paused_sft
else:
    build = job.build_models

    def paused_build(j):
        pause()
        return build(j)

    job.build_models = paused_build
from pcsd.train.cli import main

sys.exit(main(args))
"""


def _default_sigint() -> None:
    """In the child before it starts: SIGINT's default action, whatever the calling shell set (a
    background job of a non-interactive shell ignores SIGINT, and Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(args: list[str], at: str, cwd: Path, env: dict) -> tuple[list[str], str]:
    """Runs the trainer with ``args``, paused at ``at`` (:data:`_PAUSING`), and sends SIGINT (Ctrl-C)
    once it says it is waiting there."""
    env = dict(env, PYTHONUNBUFFERED="1")  # each line as it is printed
    err_path = cwd / f"interrupt-{at}.err"  # a file, not a pipe nobody reads while waiting (it could fill)
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PAUSING, at, *args],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=err_file,
            preexec_fn=_default_sigint,
        )
        seen: list[str] = []
        try:
            _until(proc, "PAUSED", seen, err_path=err_path)
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = err_path.read_text()
    assert proc.returncode == 130, err[-3000:]
    return seen + rest.splitlines(keepends=True), err


def test_ctrl_c_during_then_after_the_warm_up_and_resume(tmp_path, child_env):
    """Ctrl-C during the warm-up: one line, exit 130, and ``--resume`` starts over cleanly; Ctrl-C
    after the warm-up (no RL checkpoint yet): ``--resume`` continues from the saved warm-up without
    training it again."""
    run = tmp_path / "run"
    args = [
        f"run.dir={run}",
        *tiny_run(
            "optim.sft_steps=50",
            "optim.sft_games=4",
            "optim.steps=1",
            "optim.sft_batch_size=1",  # 50 steps are needed (progress is printed every 25th), not their size
            "model.tiny_hidden_size=64",
            "rollout.max_response_tokens=40",  # holds the warm-up's targets (a shorter budget is refused)
            "env.max_steps=2",
            "run.save_every=0",
            "run.tensorboard=false",
        ),
    ]
    out, err = _interrupt(args, "warm-up", tmp_path, child_env)  # during the warm-up
    assert "sft 25/50" in "".join(out) and "sft 50/50" not in "".join(out)
    assert "Traceback" not in err and f"interrupted; continue with python -m pcsd.train --resume {run}" in err
    assert not (run / "sft-model").exists() and not list(run.glob(".tmp-*"))

    out, err = _interrupt(["--resume", str(run)], "built", tmp_path, child_env)  # after it
    text = "".join(out)
    assert "the run starts over with the warm-up" in text and "sft 50/50" in text and "warm-up saved to" in text
    assert (run / "sft-model" / "COMPLETE").is_file() and not (run / "checkpoints").exists()

    done = _train(["--resume", str(run)], tmp_path, child_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RL starts at step 0 from the saved warm-up" in done.stdout and "sft 25/50" not in done.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["sft_examples"] > 0 and len(summary["sft_loss_first_last"]) == 2
    assert _steps(run) == [1]


# ----------------------------------------------------------------------------- issue 30, part 4
#: one command per class of error found "at config read" (the key's own value, an unknown key, a
#: value of the wrong type, a choice, a preset, the env kind's keys, its entry point that does not
#: import or build, a data folder, a skills folder, a model folder, the device), and the two checks
#: that need the run's generated tiny tokenizer (the prompt budget, the warm-up's targets)
_REFUSED = [
    (["rollout.max_prompt_tokens=0"], "rollout.max_prompt_tokens must be > 0"),
    (["algo.clip_eps=0"], "algo.clip_eps must be in (0, 1), got 0.0"),
    (["rollout.tasks_per_stepp=2"], "did you mean rollout.tasks_per_step"),
    (["rollout.group_size=abc"], "rollout.group_size"),
    (["rollout.backend=tpu"], "rollout.backend='tpu' is not valid; choose one of vllm, hf"),
    (["preset=nosuch"], "unknown preset 'nosuch'"),
    (["env.name=nosuch"], "env.name='nosuch' is not valid"),
    (["env.name=gym"], "env.name=gym needs exactly one of env.entry_point"),
    (["env.name=gym", "env.entry_point=nosuch_module:Env"], "no module named 'nosuch_module'"),
    (["env.name=gym", "env.entry_point=textenv_faults:NeedsArg"], "missing 1 required positional argument"),
    (["env.name=webshop", "env.webshop_data=/nonexistent/webshop"], "env.webshop_data=/nonexistent/webshop"),
    (["method=pcsd", "env.skills_dir=/nonexistent/skills"], "env.skills_dir=/nonexistent/skills"),
    (["model.path=/nonexistent/model"], "model.path=/nonexistent/model"),
    (["run.device=cuda"], "run.device=cuda"),
    (["rollout.max_prompt_tokens=50"], "rollout.max_prompt_tokens=50 cannot hold a single prompt"),  # tokenizer
    (["rollout.max_response_tokens=4"], "rollout.max_response_tokens=4 is shorter than the warm-up's targets"),
]


@pytest.mark.parametrize("overrides,what", _REFUSED, ids=[" ".join(o) for o, _ in _REFUSED])
def test_a_refused_run_writes_nothing_and_the_corrected_one_starts_there(
    tmp_path, capsys, monkeypatch, overrides, what
):
    """Every class of config-read error refuses the run before anything stays in ``run.dir``: the
    ones found when the config is read write nothing; the ones that need the run's generated tiny
    tokenizer (the prompt budget, the warm-up's targets) remove what the new run wrote, so that the
    corrected command is not refused as "not empty" (before: base-model/, config.yaml, games/ stayed)."""
    import torch

    from pcsd.train.cli import main
    from pcsd.train.rundir import claim_run_dir

    if "run.device=cuda" in overrides and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: run.device=cuda is valid")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # textenv_faults
    run = tmp_path / "run"
    small = ["rollout.backend=hf", "model.tiny_layers=1", "model.tiny_hidden_size=64", "eval.episodes=1"]
    warm = ["optim.sft_steps=2", "optim.sft_games=2", "env.max_steps=2"]
    assert main([*small, *warm, *overrides, f"run.dir={run}"]) == 2
    _one_line_error(capsys.readouterr().err, what)
    assert not run.exists()
    run.mkdir()  # an empty folder the user made: it stays, empty
    assert main([*small, *warm, *overrides, f"run.dir={run}"]) == 2
    assert [p.name for p in run.iterdir() if p.name != LOCK_NAME] == []
    lock, aside = claim_run_dir(run, resume=False)  # what the corrected command does first: accepted
    assert aside is None
    lock.release()


def test_resume_removes_what_an_interrupted_write_left(tmp_path, capsys, monkeypatch):
    """A kill during the warm-up's save leaves ``.tmp-sft-model-<pid>/`` (and during a checkpoint,
    ``checkpoints/.tmp-step-*``): ``--resume`` removes them, saying so, before the run goes on."""
    from omegaconf import OmegaConf

    from pcsd.train import cli
    from pcsd.train.config import load_config

    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(load_config([f"run.dir={run}", "rollout.backend=hf"]), run / "config.yaml", resolve=True)
    (run / ".tmp-sft-model-4242").mkdir()
    (run / ".tmp-sft-model-4242" / "model.safetensors").write_bytes(b"half")
    (run / "checkpoints" / ".tmp-step-00000003-77").mkdir(parents=True)
    (run / "sft-model").mkdir()  # what is not a temporary stays
    seen = {}
    monkeypatch.setattr("pcsd.train.job.train", lambda cfg, run_dir, ctx: seen.setdefault("ran", {"steps": 0}))
    assert cli.main(["--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert seen and not list(run.glob(".tmp-*")) and not list((run / "checkpoints").glob(".tmp-*"))
    assert (run / "sft-model").is_dir()
    assert f"[pcsd] removed {run / '.tmp-sft-model-4242'}, left by an interrupted write" in out
