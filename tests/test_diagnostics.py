"""``pcsd.diagnostics``: spike injection, Spearman, rank robustness and quality alignment on small
inputs, planted rules with known answers, the CLI's table/JSON/figures, and the recorded gaps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pcsd.diagnostics.robustness import (
    GapSet,
    gapset_from_records,
    inject_spikes,
    rank_robustness,
    spearman,
    synthetic_gaps,
    token_weights,
)
from pcsd.ops import weighting


@pytest.fixture
def planted():
    """Temporarily registered rules with known behaviour: ``planted-fixed`` ignores its input
    (weights fixed by position), ``planted-identity`` returns the gap itself."""
    names = []

    def reg(name, fn):
        weighting.register_rule(name, "weights")(fn)
        names.append(name)

    reg(
        "planted-fixed",
        lambda gap, cu, mask=None: (
            torch.linspace(0.1, 0.9, gap.numel()) * (mask.to(gap.dtype) if mask is not None else 1.0)
        ),
    )
    reg("planted-identity", lambda gap, cu, mask=None: gap.clone() * (mask.to(gap.dtype) if mask is not None else 1.0))
    yield
    for n in names:
        weighting._RULES.pop(n, None)


def test_spike_injection_touches_exactly_the_requested_fraction():
    gs = synthetic_gaps(num_segments=40, seed=3, masked_share=0.1)
    assert 0 < gs.num_valid < gs.gap.size
    for frac in (0.0, 0.01, 0.05, 0.10, 1.0):
        for sign in ("both", "positive", "negative"):
            pert, pos = inject_spikes(gs, frac, magnitude=3.0, seed=11, sign=sign)
            changed = np.flatnonzero(pert != gs.gap)
            assert changed.size == pos.size == round(frac * gs.num_valid)
            assert np.array_equal(changed, pos) and gs.mask[changed].all()  # only valid positions
            diff = pert[changed] - gs.gap[changed]
            np.testing.assert_allclose(np.abs(diff), 3.0, rtol=1e-6)
            if sign != "both":
                assert (np.sign(diff) == (1 if sign == "positive" else -1)).all()
    # the same seed draws the same positions (every rule sees the same perturbation)
    assert np.array_equal(inject_spikes(gs, 0.05, seed=4)[1], inject_spikes(gs, 0.05, seed=4)[1])
    assert not np.array_equal(inject_spikes(gs, 0.05, seed=4)[1], inject_spikes(gs, 0.05, seed=5)[1])
    with pytest.raises(ValueError, match="fraction"):
        inject_spikes(gs, 1.5)


def test_identical_inputs_give_correlation_one():
    x = np.random.default_rng(0).normal(size=200)
    assert spearman(x, x.copy()) == pytest.approx(1.0)
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)  # ranks only
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert spearman(np.full(5, 0.5), np.full(5, 0.5)) == 1.0  # a constant rule keeps its ranking
    assert np.isnan(spearman(np.full(5, 0.5), np.arange(5.0)))
    # no spikes: every rule's weights are unchanged
    res = rank_robustness(synthetic_gaps(num_segments=12, seed=1), fractions=(0.0,), repeats=2)
    for rule, d in res["rules"].items():
        assert d["0"]["mean"] == pytest.approx(1.0), rule


def test_planted_rules_give_the_expected_values(planted):
    gs = synthetic_gaps(num_segments=30, seed=2)
    res = rank_robustness(gs, ["planted-fixed", "planted-identity", "sdar"], fractions=(0.05, 0.1), repeats=3, seed=9)
    for f in ("0.05", "0.1"):
        assert res["rules"]["planted-fixed"][f]["values"] == [1.0, 1.0, 1.0]  # ignores its input
        # the identity rule: Spearman of the gaps themselves, draw by draw
        want = []
        for k in range(3):
            pert, _ = inject_spikes(gs, float(f), seed=9 * 1_000_003 + k)
            want.append(spearman(gs.gap[gs.mask], pert[gs.mask]))
        np.testing.assert_allclose(res["rules"]["planted-identity"][f]["values"], want)
        # SDAR is a monotone map of the gap: same ranks up to float32 ties of the saturated sigmoid
        np.testing.assert_allclose(res["rules"]["sdar"][f]["values"], want, atol=5e-3)
        assert res["rules"]["planted-identity"][f]["std"] == pytest.approx(np.std(want, ddof=1))
    assert res["rules"]["planted-fixed"]["0.1"]["mean"] == 1.0


def test_token_weights_of_every_kind():
    gs = synthetic_gaps(num_segments=6, seed=0, masked_share=0.2)
    args = (gs.gap, gs.mask, gs.cu_seqlens)
    w = token_weights("sdar", *args)
    np.testing.assert_allclose(w, torch.sigmoid(5 * torch.tensor(gs.gap)).double().numpy() * gs.mask, atol=1e-6)
    # rlsd: the factor on a positive advantage at step 0 (lambda 0.5)
    want = (0.5 + 0.5 * np.clip(np.exp(gs.gap.astype(np.float64)), 0.8, 1.2)) * gs.mask
    np.testing.assert_allclose(token_weights("rlsd", *args), want, rtol=1e-5)
    # skill-sd (a loss): the pull on the token's log-prob on policy is the signed gap
    np.testing.assert_allclose(token_weights("skill-sd", *args), gs.gap * gs.mask, atol=1e-5)
    assert (token_weights("pcsd", *args)[~gs.mask] == 0).all()


def test_gapset_checks_its_segments():
    with pytest.raises(ValueError, match="cu_seqlens"):
        GapSet(np.zeros(4), np.ones(4, bool), np.array([0, 3]))
    with pytest.raises(ValueError, match="one shape"):
        GapSet(np.zeros(4), np.ones(3, bool), np.array([0, 4]))


def test_cli_rank_robustness_writes_table_json_and_figures(tmp_path, capsys):
    from pcsd.diagnostics.cli import main

    out = tmp_path / "out"
    assert main(["rank-robustness", "--synthetic", "--segments", "20", "--repeats", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Rank robustness" in printed and "pcsd" in printed and "0.985 / 0.934 / 0.887" in printed
    d = json.loads((out / "diagnostics.json").read_text())["rank_robustness"]
    assert set(d["rules"]) == set(weighting.available_rules())
    assert d["fractions"] == ["0.01", "0.05", "0.1"] and d["repeats"] == 2
    for f in ("rank_robustness.png", "rank_robustness_all_rules.png"):
        assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("diag") / "m", hidden_size=64, num_layers=1, seed=5)


def test_cli_quality_alignment_writes_table_json_and_figure(tmp_path, tiny_model, capsys):
    from pcsd.diagnostics.cli import main

    out = tmp_path / "out"
    assert (
        main(["quality-alignment", "--model", str(tiny_model), "--games", "2", "--max-pairs", "6", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "Teacher-quality alignment" in printed and "-0.489 / -0.208" in printed
    d = json.loads((out / "diagnostics.json").read_text())["quality_alignment"]
    assert d["num_pairs"] == 6 and set(d["rules"]) == set(weighting.available_rules())
    assert len(d["dQ"]["removed"]) == 6 and len(d["rules"]["pcsd"]["shuffled"]["dW"]) == 6
    assert (out / "quality_alignment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # then rank robustness on the same model's expert-trajectory gaps, into the same JSON
    assert (
        main(
            [
                "rank-robustness",
                "--model",
                str(tiny_model),
                "--games",
                "2",
                "--max-pairs",
                "6",
                "--gaps-from",
                "expert",
                "--repeats",
                "2",
                "--rules",
                "pcsd,sdar",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    d = json.loads((out / "diagnostics.json").read_text())
    assert "quality_alignment" in d and d["rank_robustness"]["source"].startswith("expert trajectories")


def test_cli_quality_alignment_with_the_skill_following_expert(tmp_path, tiny_model):
    from pcsd.diagnostics.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "quality-alignment",
                "--model",
                str(tiny_model),
                "--games",
                "2",
                "--max-pairs",
                "4",
                "--expert",
                "skills",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    d = json.loads((out / "diagnostics.json").read_text())["quality_alignment"]
    assert d["num_pairs"] == 4 and "expert that follows the skills" in d["episodes_source"]


def test_quality_alignment_reads_a_skills_folder(tmp_path, tiny_model):
    """With a user's skills folder (env.skills_dir), the teacher context is that folder's block and
    the shuffled context the block of another task whose retrieved skills differ; a folder that
    retrieves the same text for every task cannot be shuffled."""
    from pcsd.diagnostics.alignment import ExpertPair, score_contexts
    from pcsd.models import eos_id, load_model
    from pcsd.text.prompts import PromptBuilder, SkillRepository

    folder = tmp_path / "skills"
    (folder / "keywords").mkdir(parents=True)
    (folder / "keywords" / "apple.md").write_text("Apples are kept in the fridge.")
    (folder / "keywords" / "mug.md").write_text("Mugs are kept in the cabinets.")
    repo = SkillRepository(folder)
    builder = PromptBuilder("alfworld", tokenizer_dir=tiny_model, skills=repo)
    tasks = ["put some apple in garbagecan", "put some mug in coffeemachine", "put some apple on table"]
    pairs = [
        ExpertPair(
            dict(
                task=t, observation="You arrive at fridge 1.", admissible=["look", "go to fridge 1"], history=[], step=0
            ),
            "pick_and_place_simple",
            "go to fridge 1",
            i,
        )
        for i, t in enumerate(tasks)
    ]
    model = load_model(tiny_model, torch.device("cpu"), "float32").eval()
    sc = score_contexts(model, builder, pairs, eos_id(builder), seed=0)
    assert all(repo.retrieve(o) != repo.retrieve(t) for o, t in zip(sc.shuffled_types, tasks))
    assert not np.array_equal(sc.logp["teacher"], sc.logp["student"])
    assert not np.array_equal(sc.logp["shuffled"], sc.logp["teacher"])
    (folder / "keywords" / "mug.md").unlink()
    (folder / "general.md").write_text("Look everywhere.")
    (folder / "keywords" / "apple.md").unlink()
    same = PromptBuilder("alfworld", tokenizer_dir=tiny_model, skills=SkillRepository(folder))
    with pytest.raises(ValueError, match="retrieves the same skills for every task"):
        score_contexts(model, same, pairs, eos_id(same), seed=0)


def test_cli_rank_robustness_on_fresh_rollouts(tmp_path, tiny_model):
    """Without recorded gaps the model plays fresh rollouts and scores them with and without skills."""
    from pcsd.diagnostics.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "rank-robustness",
                "--model",
                str(tiny_model),
                "--games",
                "1",
                "--group-size",
                "2",
                "--max-steps",
                "3",
                "--max-response-tokens",
                "8",
                "--repeats",
                "2",
                "--rules",
                "pcsd,sdar",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    d = json.loads((out / "diagnostics.json").read_text())["rank_robustness"]
    assert d["source"].startswith("fresh rollouts") and d["rollouts"] == 2 and d["num_tokens"] > 0


def test_quality_alignment_of_planted_rules(planted, tiny_model):
    """An input-ignoring rule never changes its weights (dW = 0: no correlation, NaN); the identity
    rule's dW is the change of the action tokens' mean gap; removing the skills gives dQ = Q_student -
    Q_teacher exactly (the teacher without skills reads the student prompt)."""
    from pcsd.diagnostics.alignment import expert_pairs, quality_alignment, score_contexts
    from pcsd.envs.procedural import write_games
    from pcsd.models import eos_id, load_model
    from pcsd.text.prompts import PromptBuilder
    from pcsd.train.sft import expert_episodes

    games = write_games(tiny_model.parent / "games", 2, 77, task_types=("pick_and_place_simple",))
    pairs = expert_pairs(expert_episodes(games, 4), max_pairs=5)
    model = load_model(tiny_model, torch.device("cpu"), "float32")
    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=1024, tokenizer_dir=tiny_model)
    sc = score_contexts(model, builder, pairs, eos_id(builder), seed=1)
    assert all(t != "pick_and_place_simple" for t in sc.shuffled_types)  # another task type's skill
    assert sc.action_mask.any() and not np.array_equal(sc.logp["teacher"], sc.logp["student"])
    res = quality_alignment(sc, ["planted-fixed", "planted-identity"])
    fixed = res["rules"]["planted-fixed"]
    for p in ("removed", "shuffled"):
        assert fixed[p]["dW"] == [0.0] * 5 and np.isnan(fixed[p]["spearman"])
    seg = np.repeat(np.arange(len(pairs)), np.diff(sc.cu_seqlens))
    am = sc.action_mask
    gap_t = sc.logp["teacher"] - sc.logp["student"]
    mean_gap = np.bincount(seg[am], gap_t[am]) / np.bincount(seg[am])
    np.testing.assert_allclose(res["rules"]["planted-identity"]["removed"]["dW"], -mean_gap, rtol=1e-5, atol=1e-6)
    q = lambda c: np.bincount(seg[am], np.exp(sc.logp[c][am])) / np.bincount(seg[am])  # noqa: E731
    np.testing.assert_allclose(res["dQ"]["removed"], q("student") - q("teacher"), rtol=1e-6, atol=1e-9)


def test_recorded_gaps_round_trip(tmp_path):
    """GapRecorder writes one npz per logged step; load_gap_records and gapset_from_records read
    them back in step order with the segments shifted."""
    from pcsd.train.gaps import GapRecorder, load_gap_records

    rec = GapRecorder(tmp_path, "pcsd", log_every=2)
    assert rec.for_step(1) is None
    rng = np.random.default_rng(0)
    sizes = {2: [3, 5], 4: [4]}
    for step, lens in sizes.items():
        T = sum(lens)
        gap = rng.normal(size=T).astype(np.float32)
        rec.for_step(step)(
            dict(
                gap=gap,
                weights=gap * 0 + 0.5,
                mask=np.ones(T, bool),
                student_logp=-np.ones(T),
                teacher_logp=gap - 1,
                cu_seqlens=np.concatenate([[0], np.cumsum(lens)]),
                row_traj=np.arange(len(lens)),
                row_turn=np.zeros(len(lens)),
                traj_reward=np.zeros(2),
            )
        )
    recs = load_gap_records(tmp_path)
    assert [r.step for r in recs] == [2, 4] and recs[0].rule == "pcsd"
    gs = gapset_from_records(recs)
    assert gs.cu_seqlens.tolist() == [0, 3, 8, 12] and gs.gap.size == 12
    assert gapset_from_records(recs, max_tokens=10).gap.size == 8  # whole steps only
    with pytest.raises(FileNotFoundError, match="record_gaps"):
        load_gap_records(tmp_path / "nothing")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rank-robustness", "--synthetic", "--rules", "pcsd,nope"], "unknown rule"),
        (["rank-robustness", "--synthetic", "--fractions", "0.1,2"], "--fractions"),
        (["rank-robustness", "--synthetic", "--fractions", "a"], "--fractions"),
        (["rank-robustness", "--synthetic", "--repeats", "0"], "--repeats"),
        (["quality-alignment"], "--model DIR or --run-dir"),
    ],
    ids=["rule", "fraction-range", "fraction-text", "repeats", "no-model"],
)
def test_cli_bad_input_names_the_argument(tmp_path, argv, message):
    from pcsd.diagnostics.cli import main

    with pytest.raises(SystemExit, match=message):
        main(argv + ["--out", str(tmp_path)])


def test_quality_alignment_without_models_in_the_run_dir(tmp_path):
    from pcsd.diagnostics.cli import main

    (tmp_path / "config.yaml").write_text("preset: tiny-cpu\n")
    with pytest.raises(SystemExit, match="no sft-model/, base-model/ or final-model/"):
        main(["quality-alignment", "--run-dir", str(tmp_path)])
