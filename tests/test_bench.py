"""Smoke tests of the benchmarks CLI (``python -m pcsd.bench``): the harness, not the figures.

Each subcommand runs at tiny sizes and must write its JSON (machine line, arguments, rows with the
expected keys) and its PNG.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from pcsd.bench import common, op, prompts
from pcsd.bench import env as bench_env
from pcsd.bench.cli import main as bench_main


def _load(out, name):
    data = json.loads((out / f"{name}.json").read_text())
    assert data["benchmark"] == name
    assert "cores" in data["machine"] and "torch" in data["machine"]
    assert (out / f"{name}.png").stat().st_size > 0
    assert data["rows"], data
    return data


def test_worker_cpu_is_counted_thread_by_thread():
    """A pool's threads exiting between two readings (an earlier pool collected meanwhile) must not
    make the workers' CPU time negative (it once gave a serial share of nan under load)."""
    before = {10: 5_000, 11: 7_000, 12: 900_000}  # 12: a thread of a dropped pool
    after = {10: 8_000, 11: 7_500, 13: 1_000}  # 13: a thread started meanwhile
    assert common._worker_cpu_delta(before, after) == 3_000 + 500 + 1_000
    assert common._worker_cpu_delta(after, after) == 0
    per = common.pool_worker_cpu_by_thread()
    assert per is None or all(isinstance(t, int) and ns >= 0 for t, ns in per.items())


def test_measure_median_and_spread():
    calls = []
    m = common.measure(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and len(m["times_s"]) == 3
    assert m["min_s"] <= m["median_s"] <= m["max_s"]
    assert m["spread_s"] == pytest.approx(m["max_s"] - m["min_s"])
    with pytest.raises(ValueError, match="repeats"):
        common.measure(lambda: None, repeats=0)


def test_make_segments_cover_total():
    gap, cu, mask = op.make_segments(5000)
    assert gap.shape == mask.shape == (5000,)
    assert int(cu[0]) == 0 and int(cu[-1]) == 5000
    lengths = cu[1:] - cu[:-1]
    assert bool((lengths > 0).all()) and int(lengths[:-1].max()) <= 512


def test_bad_arguments_exit_with_a_named_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench_main(["env", "--sizes", "0"])
    assert e.value.code == 2
    assert "--sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["nope"])
    with pytest.raises(SystemExit) as e:
        bench_main(["env", "--tiny", "--no-real", "--sizes", "12", "--group-size", "8", "--out", "/tmp/x"])
    assert "--sizes" in str(e.value)
    with pytest.raises(SystemExit) as e:
        bench_main(["env", "--mp-envs", "0"])
    assert e.value.code == 2 and "--mp-envs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # more envs than a pool holds: refused before any game is made
        bench_main(["env", "--tiny", "--no-real", "--sizes", "100000000"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "argument --sizes: at most 1048576 envs per pool (the native pool's limit), got 100000000" in err


def test_op(tmp_path):
    bench_main(["op", "--tiny", "--no-compile", "--threads", "1", "--out", str(tmp_path)])
    data = _load(tmp_path, "op")
    row = data["rows"][0]
    for key in ("native_ms", "eager_ms", "copy_GBps", "native_GBps", "speedup_vs_eager", "max_abs_err_vs_ref"):
        assert key in row
    assert row["max_abs_err_vs_ref"] < 1e-4  # the kernel computes what the reference does


def test_env(tmp_path):
    bench_main(["env", "--tiny", "--threads", "1", "2", "--mp-steps", "1", "--real-steps", "2", "--out", str(tmp_path)])
    data = _load(tmp_path, "env")
    native = [r for r in data["rows"] if r["engine"] == "native pool"]
    assert {r["threads"] for r in native} == {1, 2}
    for key in ("sync_steps_per_s", "async_steps_per_s", "async_vs_sync", "sync_per_core", "sync_scaling_vs_1thr"):
        assert all(key in r for r in native)
    if common.pool_worker_cpu_ns() is not None:  # the CPU split (Linux /proc)
        for r in native:
            assert r["sync_serial_ns"] > 0 and r["sync_worker_ns"] > 0 and 0 < r["async_serial_share"] < 1
        two = next(r for r in native if r["threads"] == 2)
        assert 1 < two["sync_amdahl_bound"] <= 2
    have_engine = all(importlib.util.find_spec(p) for p in ("alfworld", "textworld"))
    single = [r for r in data["rows"] if r["engine"] == "alfworld, 1 env at a time"]
    mp_pool = [r for r in data["rows"] if r["engine"] == "alfworld mp pool"]
    if have_engine:
        assert len(single) == 1 and single[0]["sync_steps_per_s"] > 0
        assert {r["threads"] for r in mp_pool} == {1, 2}
        for key in ("sync_steps_per_s", "async_steps_per_s", "sync_per_core", "async_vs_sync", "sync_scaling_vs_1thr"):
            assert all(r[key] > 0 for r in mp_pool), key
        assert all(r["envs"] == 2 for r in mp_pool)  # --tiny: 2 real envs
        for key in ("per_core_vs_real", "sync_vs_mp", "async_vs_mp"):
            assert all(key in r for r in native), key
    else:
        assert not single and not mp_pool and any("skipped" in n for n in data["notes"])


def _real_streams(tmp_path, n_games, length):
    games = bench_env.make_games(tmp_path, n_games)
    return games, bench_env.command_streams(games, length)


def test_mp_pool_steps_like_one_env_at_a_time(tmp_path, real_alfworld):
    """The multiprocessing pool of real envs returns what the same envs return stepped in-process,
    in env order, for sync steps and for async send / recv_any."""
    games, streams = _real_streams(tmp_path, 3, 3)
    cmds = [[streams[e][j] for e in range(3)] for j in range(3)] + [[None] * 3]  # ... then a reset
    envs = [bench_env._start_real_env(g) for g in games]
    first = [bench_env._real_result(env.reset()) for env in envs]
    expect = [
        [bench_env._real_result(env.reset() if c is None else env.step(c)[0]) for env, c in zip(envs, step)]
        for step in cmds
    ]
    for env in envs:
        env.close()
    assert first[0] != first[1]  # different games: a slicing mistake cannot go unseen
    pool = bench_env.RealEnvProcessPool(games, workers=2)
    try:
        assert pool.slices == [[0, 1], [2]] or pool.slices == [[0], [1, 2]]
        assert [pool.step(step) for step in cmds] == expect
        for step, want in zip(cmds, expect):  # async: answers per worker, in any order
            for w, sl in enumerate(pool.slices):
                pool.send(w, [step[e] for e in sl])
            got: dict[int, list] = {}
            while len(got) < len(pool.slices):
                got.update(pool.recv_any())
            assert [x for w in range(len(pool.slices)) for x in got[w]] == want
    finally:
        pool.close()


def test_mp_pool_bad_input(tmp_path, real_alfworld):
    games, _ = _real_streams(tmp_path, 2, 1)
    with pytest.raises(ValueError, match="workers"):
        bench_env.RealEnvProcessPool(games, workers=3)
    with pytest.raises(ValueError, match="workers"):
        bench_env.RealEnvProcessPool(games, workers=0)
    with pytest.raises(RuntimeError, match="worker 0 failed"):
        bench_env.RealEnvProcessPool([str(tmp_path / "missing.tw-pddl")], workers=1)


def test_python_prompt_matches_rust(tmp_path):
    from pcsd.text.prompts import PromptBuilder

    games = bench_env.make_games(tmp_path, 2)
    reqs = [r for turn in prompts.prompt_stream(games, 2, 4) for r in turn]
    pb = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=None)
    assert any(r["step"] >= 3 for r in reqs)  # history longer than H is exercised
    for r in reqs:
        assert prompts.python_prompt(r, 2) == pb.build(
            r["task"], r["observation"], r["admissible"], r["history"], r["step"]
        )


def test_prompts(tmp_path):
    bench_main(["prompts", "--tiny", "--out", str(tmp_path)])
    rows = _load(tmp_path, "prompts")["rows"]
    assert [r["phase"].split(":")[0] for r in rows if r["threads"] == 1] == ["cold", "steady"]
    for row in rows:
        for key in ("rust_prompts_per_s", "python_prompts_per_s", "speedup", "mean_prompt_tokens"):
            assert key in row
        assert row["texts_equal"] and row["ids_equal"]
    assert all(r["cpu_speedup"] > 0 for r in rows if r["threads"] == 1)


def test_logprobs(tmp_path):
    bench_main(["logprobs", "--tiny", "--vocab", "20000", "--out", str(tmp_path)])
    rows = _load(tmp_path, "logprobs")["rows"]
    timed = [r for r in rows if r["pass_"] in ("fwd", "fwd+bwd")]
    assert {r["pass_"] for r in timed} == {"fwd", "fwd+bwd"}
    for key in (
        "fused_ms",
        "chunked_ms",
        "naive_ms",
        "time_fused_vs_naive",
        "fused_peak_KB_per_token",
        "fused_peak_vs_full_logits",
        "chunked_peak_KB_per_token",
        "naive_peak_KB_per_token",
        "max_abs_err",
    ):
        assert all(key in r for r in timed), key
    assert rows[0]["max_abs_err"] < 1e-4
    memory = [r for r in rows if r["pass_"].endswith("memory only")]  # --memory-tokens (32 at --tiny)
    assert {r["tokens"] for r in memory} == {32} and len(memory) == 2


def test_step(tmp_path):
    bench_main(["step", "--tiny", "--out", str(tmp_path)])
    rows = _load(tmp_path, "step")["rows"]
    assert [r["side"] for r in rows] == ["pcsd", "pcsd-joint", "pcsd-recompute", "straightforward"]
    for key in ("score_s", "update_s", "tokens_per_s", "peak_extra_MB", "speedup_vs_straightforward", "loss"):
        assert all(key in r for r in rows), key
    naive = rows[3]
    assert (
        naive["old_s"] > 0
        and naive["ref_s"] > 0
        and naive["teacher_s"] > 0
        and naive["speedup_vs_straightforward"] == 1
    )
    assert rows[0]["tokens"] == naive["tokens"] > rows[0]["response_tokens"] > 0
    for r in rows[:3]:  # the four compute the same step
        assert r["loss"] == pytest.approx(naive["loss"], rel=1e-3, abs=1e-7)


def test_lora(tmp_path):
    """``pcsd.bench lora --tiny``: the sync and the step, full and LoRA, and their ratios; the same
    bytes streamed (the merged model has the base's weights), LoRA trains a fraction of them."""
    bench_main(["lora", "--tiny", "--out", str(tmp_path)])
    rows = _load(tmp_path, "lora")["rows"]
    assert [(r["part"], r["side"]) for r in rows] == [
        ("sync (sink)", "full"),
        ("sync (sink)", "lora"),
        ("training step", "full"),
        ("training step", "lora"),
        ("sync (sink)", "lora / full"),
        ("training step", "lora / full"),
    ]
    assert rows[0]["bytes_streamed"] == rows[1]["bytes_streamed"] > 0 and rows[4]["bytes_streamed"] == 1
    assert 0 < rows[5]["trained_params"] < 0.2 and rows[3]["adamw_state_bytes"] < rows[2]["adamw_state_bytes"]
    assert all(r["median_s"] > 0 for r in rows)


def test_step_bad_arguments(tmp_path):
    with pytest.raises(SystemExit, match="--prompt-len: expected MIN <= MAX"):
        bench_main(["step", "--tiny", "--prompt-len", "9", "3", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        bench_main(["step", "--tiny", "--models", "huge"])
    assert e.value.code == 2


def test_rollout(tmp_path):
    bench_main(["rollout", "--tiny", "--no-vllm", "--out", str(tmp_path)])
    data = _load(tmp_path, "rollout")
    assert {(r["backend"], r["phase"]) for r in data["rows"]} == {("hf", "generate only"), ("hf", "rollout")}
    row = next(r for r in data["rows"] if r["phase"] == "rollout")
    for key in (
        "episodes_per_s",
        "turns_per_s",
        "gen_tokens_per_s",
        "generation_s",
        "env_s",
        "prompts_s",
        "parsing_s",
        "scoring_s",
        "outside_model_share",
    ):
        assert key in row
    assert row["episodes"] == 2 and 0.0 <= row["outside_model_share"] <= 1.0
    assert row["scoring_s"] > 0
    gen = next(r for r in data["rows"] if r["phase"] == "generate only")
    assert gen["episodes"] == 2 and gen["gen_tokens"] > 0 and gen["gen_tokens_per_s"] > 0


def test_rollout_vllm_column(tmp_path, vllm_available, child_env):
    """The vLLM backend runs beside HF (CLI entry point: vLLM's CPU build wants OMP_NUM_THREADS=1)."""
    res = subprocess.run(
        [sys.executable, "-m", "pcsd.bench", "rollout", "--tiny", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=child_env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    data = _load(tmp_path, "rollout")
    assert not [n for n in data["notes"] if "skipped" in n], data["notes"]
    rows = {(r["backend"], r["phase"]): r for r in data["rows"]}
    assert set(rows) == {(b, p) for b in ("hf", "vllm") for p in ("generate only", "rollout")}
    assert rows[("vllm", "rollout")]["episodes"] == 2 and rows[("vllm", "rollout")]["gen_tokens"] > 0
    assert rows[("vllm", "rollout")]["vllm_vs_hf"] > 0 and rows[("vllm", "generate only")]["vllm_vs_hf"] > 0
    assert "vllm" in res.stdout


def test_model_path_needs_a_checkpoint_and_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--model-path: expected a Hugging Face checkpoint"):
        bench_main(["rollout", "--tiny", "--model-path", str(tmp_path / "nope"), "--out", str(tmp_path)])
    (tmp_path / "config.json").write_text("{}")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the real-model path is selected, not refused")
    with pytest.raises(SystemExit, match="--model-path: .*needs a CUDA GPU"):
        bench_main(["rollout", "--tiny", "--model-path", str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--model-path: .*needs a CUDA GPU"):  # `all` refuses before it starts
        bench_main(["all", "--tiny", "--model-path", str(tmp_path), "--out", str(tmp_path)])
    assert not (tmp_path / "op.json").exists()


def test_cli_entry_point(tmp_path, child_env):
    res = subprocess.run(
        [sys.executable, "-m", "pcsd.bench", "op", "--tiny", "--no-compile", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=child_env,
    )
    assert res.returncode == 0, res.stderr
    assert "machine:" in res.stdout and (tmp_path / "op.json").is_file()
    res = subprocess.run(
        [sys.executable, "-m", "pcsd.bench", "logprobs", "--tokens", "x"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=child_env,
    )
    assert res.returncode == 2 and "--tokens" in res.stderr


# ----------------------------------------------------------------------------- gpu: the GPU path's proof
GPU_PARTS = ["op", "fused", "update", "paper_update", "flex", "hf_generation", "vllm", "train", "cuda_tests"]
#: what the CI run below takes: ``flex`` compiles FlexAttention (about 20 s of a 2-core CPU), tested
#: in-process with the eager kernel and by its own slow run (tests/test_flex.py)
CI_PARTS = [p for p in GPU_PARTS if p != "flex"]


def test_gpu_cpu_small_runs_every_part_that_can_run_on_a_cpu(tmp_path, child_env):
    """What CI runs: `python -m pcsd.bench gpu --device cpu --small` (a subprocess: vLLM's CPU build
    wants the entry point's OMP_NUM_THREADS=1)."""
    res = subprocess.run(
        [sys.executable, "-m", "pcsd.bench", "gpu", "--device", "cpu", "--small", "--out", str(tmp_path)]
        + ["--parts", *CI_PARTS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=child_env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["device"] == "cpu" and data["small"] is True
    assert {"torch", "cuda", "transformers", "native", "line"} <= set(data["machine"])
    status = {p["name"]: p["status"] for p in data["parts"]}
    assert list(status) == CI_PARTS
    from pcsd.bench import gpu

    assert list(gpu.PARTS) == GPU_PARTS  # every part, in order (the run above leaves out flex)
    want_pass = {"op", "fused", "paper_update", "hf_generation", "train"}
    if importlib.util.find_spec("vllm") is not None:
        want_pass.add("vllm")
    assert {k for k, v in status.items() if v == "pass"} == want_pass, status
    for p in data["parts"]:
        assert p["status"] == "pass" or p["reason"], p  # a skip says why
        assert p["status"] != "pass" or (p["checks"] and all(c["ok"] for c in p["checks"]))
    paper = next(p for p in data["parts"] if p["name"] == "paper_update")["figures"]
    for side in ("fused", "recompute"):
        assert paper[side]["tokens_per_s"] > 0 and paper[side]["predicted_GiB"] > 0
    train = next(p for p in data["parts"] if p["name"] == "train")
    assert train["figures"]["steps"] == 2 and train["figures"]["compared_weights"] > 0
    assert any("bit-identical" in c["what"] for c in train["checks"])
    assert "===== resumed (exit status 0)" in (tmp_path / "train.log").read_text()
    md = (tmp_path / "gpu.md").read_text()
    assert "| part | status | seconds | result |" in md and all(f"| {n} |" in md for n in CI_PARTS)


def test_gpu_train_part_cuda_driver_is_python_m_pcsd_train(monkeypatch, capsys):
    """On CUDA the train part runs ``python -m pcsd.train`` through a driver (``python -c``) that turns
    on deterministic kernels first: it must pass the arguments through as ``-m`` does (run here in
    this process, its switch put back after)."""
    from pcsd.bench.gpu import _DETERMINISTIC_MAIN

    args = ["preset=alfworld-qwen2.5-3b", "--plan", "--nodes", "2", "--gpus", "4", "--gpu-memory-gb", "80"]
    monkeypatch.setattr(sys, "argv", ["-c", *args])
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was = torch.are_deterministic_algorithms_enabled()
    try:
        with pytest.raises(SystemExit) as info:
            exec(_DETERMINISTIC_MAIN, {})
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was)
    out = capsys.readouterr().out
    assert info.value.code == 0 and "2 nodes x 4 GPU(s) of 80 GiB (dist.mesh=hsdp" in out and "verdict: fits" in out


def test_gpu_part_that_fails_does_not_stop_the_others(tmp_path, monkeypatch):
    from pcsd.bench import gpu

    def broken(part, ctx):
        raise RuntimeError("CUDA out of memory (a stand-in)")

    monkeypatch.setitem(gpu.PARTS, "fused", broken)
    with pytest.raises(SystemExit, match="1 part\\(s\\) failed"):
        bench_main(["gpu", "--device", "cpu", "--small", "--parts", "fused", "update", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "gpu.json").read_text())
    parts = {p["name"]: p for p in data["parts"]}
    assert parts["fused"]["status"] == "fail" and "CUDA out of memory" in parts["fused"]["reason"]
    assert "Traceback" in parts["fused"]["figures"]["traceback"]
    assert parts["update"]["status"] == "skipped" and "needs --device cuda" in parts["update"]["reason"]
    assert "| fused | fail |" in (tmp_path / "gpu.md").read_text()


def test_gpu_failed_check_fails_its_part(tmp_path):
    from pcsd.bench import gpu

    want = gpu.update_on("cpu")
    part = gpu.Part("update")
    assert gpu.compare_updates(part, want, want) == 0.0 and all(c["ok"] for c in part.checks)
    stats, grads = want
    off = dict(grads)
    name = next(iter(off))
    off[name] = off[name] + 1e-3 * off[name].abs().max()
    part = gpu.Part("update")
    gpu.compare_updates(part, (stats, off), want)
    failed = [c["what"] for c in part.checks if not c["ok"]]
    assert failed == ["every gradient equal within 0.0001 of its largest element"]


def test_gpu_compare_updates_near_zero_statistic_is_absolute():
    """pg is ~0 at the first step (ratio 1, centred advantages): the H100 gave 3.0e-8 against the
    CPU's 6.0e-8, rounding that a relative check called a failure. Near zero the check is absolute
    (tol * ZERO_FLOOR), and a real difference there still fails."""
    from pcsd.bench import gpu

    grads = {"w": torch.ones(3, dtype=torch.float64)}
    base = dict(loss=5.8e-4, pg=5.960464477539063e-08, kl=0.026, pcsd=0.032, grad_norm=1.1)
    part = gpu.Part("update")
    gpu.compare_updates(part, (dict(base, pg=2.9802322387695312e-08), grads), (base, grads))
    assert all(c["ok"] for c in part.checks), part.checks
    part = gpu.Part("update")
    gpu.compare_updates(part, (dict(base, pg=1e-6), grads), (base, grads))
    assert [c["what"].split()[0] for c in part.checks if not c["ok"]] == ["pg"]
    part = gpu.Part("update")  # away from zero the check stays relative
    gpu.compare_updates(part, (dict(base, kl=0.026 * (1 + 2e-4)), grads), (base, grads))
    assert [c["what"].split()[0] for c in part.checks if not c["ok"]] == ["kl"]


def test_gpu_bad_arguments(tmp_path, capsys):
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: no CUDA device here"):
            bench_main(["gpu", "--device", "cuda", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench_main(["gpu", "--parts", "nope", "--out", str(tmp_path)])
    assert "--parts: invalid choice: 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--repeats: the gpu benchmark times each part once"):
        bench_main(["gpu", "--device", "cpu", "--repeats", "3", "--out", str(tmp_path)])


def test_gpu_cuda_branches_run_with_a_stand_in_allocator(tmp_path, monkeypatch):
    """The parts' CUDA-only lines (peak memory beside the plan) run here with torch.cuda's memory
    counters standing in (no GPU): the figures are fake, the code paths and their keys are real."""
    from pcsd.bench import gpu

    class CudaCtx(gpu.Ctx):
        @property
        def cuda(self) -> bool:
            return True

        def sync(self) -> None:
            pass

    for fn, value in (
        ("reset_peak_memory_stats", None),
        ("memory_allocated", 2 << 30),
        ("max_memory_allocated", 3 << 30),
        ("max_memory_reserved", 4 << 30),
        ("synchronize", None),
        ("empty_cache", None),
    ):
        monkeypatch.setattr(torch.cuda, fn, lambda *a, _v=value, **k: _v)
    ctx = CudaCtx(torch.device("cpu"), True, tmp_path, None)
    parts = {name: gpu.run_part(name, ctx) for name in ("fused", "paper_update", "hf_generation")}
    for name, part in parts.items():
        assert part.status == "pass", (name, part.reason, part.figures.get("traceback"))
    paper = parts["paper_update"].figures
    assert paper["fused"]["peak_allocated_GiB"] == 3.0 and paper["fused"]["measured_vs_predicted"] > 0
    # static and the peak above it, each against its own lines (a goal apiece)
    assert paper["fused"]["static_GiB"] == 2.0 and paper["fused"]["increment_GiB"] == 1.0
    goals = [g["what"] for g in parts["paper_update"].goals]
    for side in ("fused", "recompute"):
        assert f"{side}: static total within 10% of the plan's lines" in goals
        assert f"{side}: peak increment within 10% of the plan's lines" in goals
        lines = paper[side]["predicted_lines"]
        assert paper[side]["predicted_static_GiB"] == pytest.approx(
            sum(
                lines[k] for k in ("master weights", "gradients", "AdamW state (2 moments)", "frozen teacher/reference")
            )
        )
    # the optimizer a run on this device makes (fused on CUDA), and the plan's line for it
    assert paper["adamw"] == "foreach" and "AdamW step temporaries (foreach)" in paper["fused"]["predicted_lines"]
    gen = parts["hf_generation"].figures
    assert gen["predicted_GiB"] > 0 and gen["static_GiB"] == 2.0 and gen["prefill_GiB"] == 1.0
    assert gen["predicted_prefill_GiB"] <= gen["predicted_increment_GiB"]
    assert parts["fused"].figures["fused_bf16_peak_allocated_GiB"] == 3.0


def test_step_sides_read_the_estimator_the_policy_loss_and_the_upper_clip():
    """``pcsd.bench step --estimator/--policy-loss/--clip-eps-high``: both sides compute the step of
    those settings (the straightforward side wrote GRPO and PPO's symmetric clip whatever was set,
    and the command had no way to set them). One epoch scores pi_old with the step's own weights, so
    the ratios are 1 and only the estimator moves the loss; the clips are the policy loss's own."""
    import argparse

    from pcsd.bench.step import DEFAULTS, algo_overrides, step_worker

    spec = {k: v[2] for k, v in DEFAULTS.items() if k != "models"}
    spec.update(algo=["algo.estimator=gigpo", "algo.policy_loss=gspo", "algo.clip_eps_high=0.28"])
    got = {side: step_worker(side, "tiny", spec) for side in ("pcsd", "straightforward")}
    assert got["pcsd"]["loss"] == pytest.approx(got["straightforward"]["loss"], rel=1e-3, abs=1e-7)
    plain = step_worker("straightforward", "tiny", dict(spec, algo=[]))
    assert plain["loss"] != pytest.approx(got["straightforward"]["loss"], rel=1e-3, abs=1e-7)
    ns = argparse.Namespace(estimator="gigpo", policy_loss=None, clip_eps_high=0.28)
    assert algo_overrides(ns) == ["algo.estimator=gigpo", "algo.clip_eps_high=0.28"]
