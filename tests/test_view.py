"""Episode records (run.log_episodes, pcsd.train.episodes), the run's page (python -m pcsd.view) in a
real browser (headless Chromium), the episode tables in TensorBoard and Weights & Biases (run.wandb).
The records of a real training run against the update's arrays: tests/test_train.py."""

from __future__ import annotations

import json
import os
import re
import string
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from pcsd.rollout.loop import RolloutBatch
from pcsd.text.prompts import PRIVILEGED_FOOTER, PRIVILEGED_HEADER
from pcsd.train.episodes import (
    EpisodeLog,
    cut_episodes,
    episode_records,
    episode_rows,
    pick_episodes,
    prompt_parts,
)
from pcsd.view.cli import main as view_main
from pcsd.view.files import episode_files

VOCAB = list(string.ascii_letters + string.digits + " \n<>|.[]")


def decode(ids) -> str:
    return "".join(VOCAB[i % len(VOCAB)] for i in ids)


def encode(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


HEAD, TAIL = encode("<|user|>\n"), encode("<|end|>\n")
SKILLS = encode(f"skills. {PRIVILEGED_HEADER}\nthe key is in the drawer.\n{PRIVILEGED_FOOTER}\n\n")


def batch() -> RolloutBatch:
    """2 groups x 2 trajectories, 1 to 3 turns each; the teacher's prompt is the student's with the
    skills between the chat header and the student's text."""
    traj_turns = [(0, 2), (1, 1), (2, 3), (3, 1)]  # (trajectory, turns)
    won = torch.tensor([False, True, True, False])
    rows = [(t, k) for t, n in traj_turns for k in range(n)]
    student = [HEAD + encode(f"task {t} turn {k}\n") + TAIL for t, k in rows]
    teacher = [HEAD + SKILLS + encode(f"task {t} turn {k}\n") + TAIL for t, k in rows]
    resp = [encode(f"go to {k} ") + [27] for t, k in rows]
    return RolloutBatch(
        prompt_ids=student,
        teacher_prompt_ids=teacher,
        response_ids=resp,
        behaviour_logprobs=[[-1.0] * len(r) for r in resp],
        traj_id=torch.tensor([t for t, _ in rows]),
        group_id=torch.tensor([t // 2 for t, _ in rows]),
        turn=torch.tensor([k for _, k in rows]),
        action_valid=torch.tensor([k != 1 for _, k in rows]),
        actions=[f"go to {k}" for _, k in rows],
        reward=won.float() * 10,
        won=won,
        length=torch.tensor([n for _, n in traj_turns]),
        traj_group=torch.tensor([0, 0, 1, 1]),
        task_type=["pick", "pick", "look", "look"],
        task=[f"task {t}" for t in range(4)],
        score=won.double(),
        env_error=["", "", "", "shop down"],
        env_error_step=[0, 0, 0, 1],
        observation=[f"you see {t}.{k}" for t, k in rows],
    )


def arrays(rb: RolloutBatch, seed: int = 0) -> dict:
    """Per-token arrays as the update hands them to its record callback (pcsd.train.update._record_arrays)."""
    g = np.random.default_rng(seed)
    T = rb.num_tokens()
    old = -g.random(T).astype(np.float32) * 3
    teacher = -g.random(T).astype(np.float32) * 3
    cu = rb.cu_seqlens().numpy()
    return dict(
        gap=teacher - old,
        weights=g.random(T).astype(np.float32),
        mask=np.ones(T, dtype=bool),
        student_logp=old,
        teacher_logp=teacher,
        cu_seqlens=cu,
        row_traj=rb.traj_id.numpy(),
        row_turn=rb.turn.numpy(),
        traj_reward=rb.reward.numpy(),
    )


def test_pick_alternates_failed_and_won_over_the_groups():
    rb = batch()
    assert pick_episodes(rb, 2) == [0, 2]  # group 0's failed one, group 1's won one
    assert pick_episodes(rb, 4) == [0, 2, 1, 3]
    assert pick_episodes(rb, 9) == [0, 2, 1, 3] and pick_episodes(rb, 0) == []


def test_prompt_parts_mark_what_only_the_teacher_sees():
    p = prompt_parts(HEAD + encode("abc") + TAIL, HEAD + SKILLS + encode("abc") + TAIL, decode)
    assert p["head"] + p["student_only"] + p["tail"] == decode(HEAD + encode("abc") + TAIL)
    assert p["head"] + p["teacher_only"] + p["tail"] == decode(HEAD + SKILLS + encode("abc") + TAIL)
    assert p["teacher_only"] == decode(SKILLS) and p["student_only"] == ""
    same = prompt_parts([1, 2, 3], [1, 2, 3], decode)
    assert same["head"] == decode([1, 2, 3]) and same["teacher_only"] == same["tail"] == ""


def test_records_hold_the_turns_and_the_updates_token_values():
    rb, arr = batch(), arrays(batch())
    recs = episode_records(rb, [2, 3], decode, arr, True, kind="train", step=7)
    a, b = recs
    assert (a["step"], a["traj"], a["group"], a["won"], a["task_type"]) == (7, 2, 1, True, "look")
    assert b["env_error"] == "shop down" and b["env_error_step"] == 1 and not b["won"]
    assert [t["turn"] for t in a["turns"]] == [0, 1, 2]
    cu = arr["cu_seqlens"]
    rows = [i for i, t in enumerate(rb.traj_id.tolist()) if t == 2]
    for turn, i in zip(a["turns"], rows):
        assert turn["observation"] == rb.observation[i] and turn["action"] == rb.actions[i]
        assert turn["valid"] == bool(rb.action_valid[i]) and turn["response"] == decode(rb.response_ids[i])
        assert turn["tokens"] == [decode([x]) for x in rb.response_ids[i]]
        for name, key in (("gap", "gap"), ("weight", "weights"), ("student_logp", "student_logp")):
            # the same float32 numbers, exactly
            np.testing.assert_array_equal(np.float32(turn[name]), arr[key][cu[i] : cu[i + 1]])
    # the teacher's skills once, then "as before"
    assert a["turns"][0]["prompt"]["teacher_only"] == decode(SKILLS)
    assert all(t["prompt"].get("teacher_only_as_before") for t in a["turns"][1:])
    bad = dict(arr, cu_seqlens=arr["cu_seqlens"][:-1])
    with pytest.raises(ValueError, match="rows"):
        episode_records(rb, [0], decode, bad)


def test_log_caps_the_folder_and_a_resume_cuts_what_it_replays(tmp_path):
    rb = batch()
    warned: list[str] = []
    log = EpisodeLog(tmp_path, decode, per_step=4, eval_failures=1, max_mb=1e9, warn=warned.append)
    for step in (1, 2, 3):
        log.update_callback(step)(arrays(rb, step))
        log.log_step(step, rb, rb)
    sink = log.eval_sink()
    sink(rb)
    sink(rb)  # a second batch: the bound (1) is reached
    log.log_eval("after RL", 3, sink)
    files = episode_files(tmp_path)
    assert [(s, n) for s, n, _ in files] == [(1, "train"), (2, "train"), (3, "train"), (3, "after-RL")]
    ev = [json.loads(x) for x in files[-1][2].read_text().splitlines()]
    assert len(ev) == 1 and not ev[0]["won"] and ev[0]["eval"] == "after RL" and not ev[0]["token_values"]
    one = files[0][2].stat().st_size
    # a cap of 2.5 steps' files: the oldest training step goes, with one warning
    log.max_bytes = 2.5 * one + files[-1][2].stat().st_size
    log.update_callback(4)(arrays(rb, 4))
    log.log_step(4, rb, rb)
    assert [s for s, n, _ in episode_files(tmp_path) if n == "train"] == [3, 4] and len(warned) == 1
    log.max_bytes = 1e12
    # a skipped step (no update): its played episodes, without token values
    log.log_step(5, rb, rb)
    assert (
        json.loads((tmp_path / "episodes" / "step_000005.jsonl").read_text().splitlines()[0])["token_values"] is False
    )
    # resuming from step 3: the later files go, the step played again is written once
    (tmp_path / "episodes" / ".tmp-step_000004.jsonl.1").write_text("partial")
    cut_episodes(tmp_path, 3)
    assert [(s, n) for s, n, _ in episode_files(tmp_path)] == [(3, "train"), (3, "after-RL")]
    assert not list((tmp_path / "episodes").glob(".tmp-*"))
    log.update_callback(4)(arrays(rb, 4))
    log.log_step(4, rb, rb)
    log.update_callback(4)(arrays(rb, 4))
    log.log_step(4, rb, rb)
    assert [s for s, n, _ in episode_files(tmp_path)].count(4) == 1
    assert len((tmp_path / "episodes" / "step_000004.jsonl").read_text().splitlines()) == 4


def make_run(root: Path, name: str = "run", steps: int = 2) -> Path:
    """A run folder as a training leaves it: config.yaml, metrics, evaluations, episode records."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        "preset: tiny-cpu\nmethod: pcsd\nrule: pcsd\nenv: {name: alfworld}\nrun: {seed: 0}\n"
    )
    rb = batch()
    log = EpisodeLog(run, decode, per_step=4, eval_failures=4)
    metrics = []
    for step in range(1, steps + 1):
        log.update_callback(step)(arrays(rb, step))
        log.log_step(step, rb, rb)
        metrics.append(dict(step=step, success=50.0, reward=5.0, gap_mean=0.1 * step, weight_mean=0.4, kl=0.01))
    sink = log.eval_sink()
    sink(rb)
    log.log_eval("before RL", 0, sink)
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 3, "succ')
    (run / "evals.jsonl").write_text(json.dumps(dict(name="before", step=0, overall=25.0, per_category={})) + "\n")
    return run


def test_the_page_holds_the_records_and_the_bad_inputs_write_none(tmp_path, capsys):
    run = make_run(tmp_path)
    assert view_main([str(run)]) == 0
    page = run / "view" / "index.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html  # no external asset
    blob = html.split('<script id="pcsd-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    data = json.loads(blob)
    (r,) = data["runs"]
    assert r["method"] == "pcsd" and [s["step"] for s in r["steps"]] == [1, 2]  # the cut line left out
    assert [(e["kind"], e["step"]) for e in r["episodes"]] == [("eval", 0), ("eval", 0)] + [("train", 1)] * 4 + [
        ("train", 2)
    ] * 4
    # two runs side by side
    other = make_run(tmp_path, "grpo", steps=1)
    assert view_main([str(run), str(other)]) == 0
    assert (
        len(json.loads((run / "view" / "vs-grpo.html").read_text().split('json">', 1)[1].split("</script>")[0])["runs"])
        == 2
    )
    capsys.readouterr()

    # bad inputs: one line, exit 2, no page
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("preset: tiny-cpu\n")
    damaged = make_run(tmp_path, "damaged", steps=1)
    with open(damaged / "episodes" / "step_000001.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 1, "turns": [\n')
    notarun = tmp_path / "notarun"
    notarun.mkdir()
    badyaml = make_run(tmp_path, "badyaml", steps=1)
    (badyaml / "config.yaml").write_text("a: [unclosed\n")
    for bad, what in (
        (tmp_path / "missing", "no such folder"),
        (notarun, "not a pcsd run folder"),
        (badyaml, "config.yaml is damaged"),
        (damaged, "step_000001.jsonl:5: damaged episode record"),
        (empty, "no episode records"),
    ):
        assert view_main([str(bad)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and what in err and "Traceback" not in err, err
        assert not (bad / "view").exists()
    # a good run beside a bad one: no page either
    assert view_main([str(run), str(tmp_path / "missing")]) == 2 and not (run / "view" / "vs-missing.html").exists()


def test_the_page_in_a_real_browser(tmp_path):
    """Headless Chromium loads the page from the file system: the first episode's tokens are in the
    DOM with their values on hover, the colour switch changes their colours (the page's self-test
    clicks it), and a screenshot is not blank."""
    from pcsd.view.browser import dump_dom, find_chromium, pixel_stats, screenshot

    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium in CI: bash run.sh test installs the Debian package chromium")
        pytest.skip("no Chromium here (apt-get install chromium)")
    run = make_run(tmp_path)
    assert view_main([str(run)]) == 0
    url = (run / "view" / "index.html").resolve().as_uri()
    data = json.loads((run / "episodes" / "step_000001.jsonl").read_text().splitlines()[0])
    # episode 2: the first of step 1 (the evaluation before RL lists its two failures first)
    dom = dump_dom(url + "#colour=gap&selftest=1&ep0=2")
    out = json.loads(_unescape(dom.rsplit('<pre id="selftest">', 1)[1].split("</pre>", 1)[0]))
    first_turn = data["turns"][0]
    n = len(first_turn["tokens"])
    assert out["episode"] == 2 and out["tokens"][:n] == first_turn["tokens"]
    assert (
        f"gap {first_turn['gap'][0]:.4f}" in out["titles"][0]
        and f"weight {first_turn['weight'][0]:.4f}" in out["titles"][0]
    )
    assert out["first"] == "gap" and out["second"] == "weight" and "colour=weight" in out["hash"]
    assert out["colours_first"] != out["colours_second"]
    assert len(set(out["colours_first"])) > 1  # coloured by value, not one colour
    # the teacher's prompt: its teacher-only part marked, the env's privileged text within it
    assert re.search(
        r'<mark class="teacher-only"[^>]*>skills\. <mark class="privileged"[^>]*>' + re.escape(PRIVILEGED_HEADER), dom
    )
    png = screenshot(url + "#colour=weight&ep0=2", tmp_path / "page.png")
    st = pixel_stats(png)
    assert st["width"] == 1400 and st["std"] > 0.05 and st["colours"] > 50, st


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_episode_tables_go_to_tensorboard_and_wandb(tmp_path, monkeypatch):
    """The episode table in TensorBoard's Text tab; with run.wandb the scalars and the table go to
    W&B (a stand-in module records the calls: wandb is an optional extra)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pcsd.train.metrics import MetricsLogger

    rb = batch()
    recs = episode_records(rb, pick_episodes(rb, 4), decode, arrays(rb), True, kind="train", step=1)
    columns, rows = episode_rows(recs)
    assert columns[0] == "where" and rows[0][0] == "step 1" and rows[0][6] == "go to 0 > !go to 1"

    calls: list[tuple] = []

    class Run:
        id = "abc123"

        def log(self, data, step=None):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or Run()  # type: ignore[attr-defined]
    fake.Table = lambda columns, data: ("Table", columns, data)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with MetricsLogger(tmp_path, wandb=dict(project="pcsd", config={"a": 1})) as m:
        m.log(dict(step=1, reward=2.0, gap_mean=0.5))
        log = EpisodeLog(tmp_path, decode)
        log.update_callback(1)(arrays(rb))
        log.log_step(1, rb, rb)  # before the logger is attached (the evaluation before RL): kept for it
        log.attach(m)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    (ev,) = acc.Tensors("episodes/step_1/text_summary")
    text = ev.tensor_proto.string_val[0].decode()
    assert text.startswith("| where | task_type |") and "| step 1 | pick | task 0 | False |" in text
    assert calls[0][0] == "init" and calls[0][1]["dir"] == str(tmp_path) and calls[0][1]["project"] == "pcsd"
    assert ("log", {"train/reward": 2.0, "pcsd/gap_mean": 0.5}, 1) in calls
    assert ("log", {"episodes/step_1": ("Table", columns, rows)}, 1) in calls and calls[-1] == ("finish",)
    assert (tmp_path / "wandb-id").read_text().strip() == "abc123"  # a resumed run continues it


def test_wandb_without_the_package_is_refused_at_config_read(monkeypatch):
    from pcsd.train import metrics
    from pcsd.train.config import ConfigError, load_config

    assert load_config([]).run.wandb is False and load_config([]).run.log_episodes == 4
    monkeypatch.setattr(metrics, "wandb_missing", lambda: True)
    with pytest.raises(ConfigError, match=r"run.wandb=true needs the wandb package.*pip install 'pcsd\[wandb\]'"):
        load_config(["run.wandb=true"])
    for bad, key in (("run.log_episodes=-1", "run.log_episodes"), ("run.episodes_max_mb=0", "run.episodes_max_mb")):
        with pytest.raises(ConfigError, match=key):
            load_config([bad])
