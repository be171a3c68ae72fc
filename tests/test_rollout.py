"""The multi-turn rollout loop over the env pool with the HF backend on the generated tiny model
(dummy env: the loop's machinery without a real game)."""

from __future__ import annotations

import pytest
import torch

from pcsd.rollout.backends import make_backend
from pcsd.rollout.loop import collect_rollouts
from pcsd.text.prompts import PromptBuilder
from pcsd.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=1024, tokenizer_dir=path)
    eos = builder.tokenizer.encode("<|im_end|>")[0]
    return make_backend("hf", model=model, pad_token_id=eos), builder, eos, model


def run(setup, seed=0, episode_len=3, max_steps=5, groups=2, g=3, **kw):
    backend, builder, eos, _ = setup
    return collect_rollouts(
        backend,
        builder,
        groups,
        g,
        max_steps=max_steps,
        max_response_tokens=12,
        seed=seed,
        stop_token_ids=[eos],
        env_kind="dummy",
        env_options=dict(episode_len=episode_len),
        **kw,
    )


def test_batch_layout_and_groups(setup):
    rb = run(setup)
    assert rb.num_trajectories == 6
    assert rb.traj_group.tolist() == [0, 0, 0, 1, 1, 1]
    assert (rb.group_id == rb.traj_id // 3).all()
    # dummy episodes last exactly episode_len steps: every trajectory has 3 turns
    assert rb.length.tolist() == [3] * 6 and rb.num_rows == 18
    for t in range(6):
        assert rb.turn[rb.traj_id == t].tolist() == [0, 1, 2]
    cu = rb.cu_seqlens()
    assert cu[-1] == rb.num_tokens() and cu.numel() == rb.num_rows + 1
    assert rb.token_traj_ids().numel() == rb.num_tokens()
    assert all(len(a) == len(b) for a, b in zip(rb.response_ids, rb.behaviour_logprobs))
    # the teacher prompt is the student prompt with the skills block in front
    tok = setup[1].tokenizer
    for sp, tp in zip(rb.prompt_ids[:3], rb.teacher_prompt_ids[:3]):
        assert len(tp) > len(sp)
        assert "[End of Skill Information]" in tok.decode(tp) or "Skill" in tok.decode(tp)
    # a group shares its game: same task text
    assert rb.task[0] == rb.task[1] == rb.task[2]
    assert rb.reward.dtype == torch.float32 and set(rb.reward.tolist()) <= {0.0, 10.0}


def test_rows_carry_anchor_states_and_step_rewards(setup):
    """A native env's anchor is its observation: a group's envs start in one state (one id), the dummy
    game's later observations depend on the answers; step rewards sum to the reward, which the
    winning step carries (success_reward)."""
    rb = run(setup, episode_len=3, invalid_action_penalty=0.5)
    assert rb.anchor.shape == rb.step_reward.shape == (rb.num_rows,)
    first = rb.anchor[rb.turn == 0]
    assert first[:3].unique().numel() == 1 and first[3:].unique().numel() == 1
    sums = torch.zeros(rb.num_trajectories).index_add(0, rb.traj_id, rb.step_reward)
    torch.testing.assert_close(sums, rb.reward)
    last = rb.turn == rb.length[rb.traj_id] - 1
    pen = (~rb.action_valid).float() * 0.5
    torch.testing.assert_close(rb.step_reward[~last], -pen[~last])
    torch.testing.assert_close(rb.step_reward[last], rb.won.float()[rb.traj_id[last]] * 10.0 - pen[last])


def test_take_groups_and_concat(setup):
    a, b = run(setup, seed=1), run(setup, seed=2, groups=3, g=2)
    both = type(a).concat([a, b])
    assert both.num_trajectories == 12 and both.num_groups == 5 and both.num_rows == a.num_rows + b.num_rows
    assert both.traj_group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4]
    assert both.response_ids == a.response_ids + b.response_ids
    assert set(both.anchor[: a.num_rows].tolist()).isdisjoint(both.anchor[a.num_rows :].tolist())
    back = both.take_groups([2, 3, 4])
    assert back.response_ids == b.response_ids and torch.equal(back.traj_id, b.traj_id)
    assert torch.equal(back.group_id, b.group_id) and torch.equal(back.reward, b.reward)
    assert torch.equal(back.step_reward, b.step_reward) and back.task == b.task
    one = a.take_groups([1])
    assert one.num_trajectories == 3 and one.traj_group.tolist() == [0, 0, 0]
    assert one.response_ids == [r for r, t in zip(a.response_ids, a.traj_id.tolist()) if t >= 3]
    assert torch.equal(one.traj_id, a.traj_id[a.traj_id >= 3] - 3)
    # each trajectory's env error (and its step) follows its trajectory through both
    a.env_error, a.env_error_step = ["", "", "boom", "", "late", ""], [0, 0, 2, 0, 3, 0]
    b.env_error, b.env_error_step = [""] * 5 + ["last"], [0] * 5 + [1]
    both = type(a).concat([a, b])
    assert both.env_error == a.env_error + b.env_error and both.env_error_step == a.env_error_step + b.env_error_step
    assert a.take_groups([1]).env_error == ["", "late", ""] and both.take_groups([4, 0]).env_error_step == [
        0,
        1,
        0,
        0,
        2,
    ]


def test_seeded_rollouts_repeat(setup):
    a, b = run(setup, seed=4), run(setup, seed=4)
    assert a.response_ids == b.response_ids and a.actions == b.actions
    c = run(setup, seed=5)
    assert c.response_ids != a.response_ids


def test_the_largest_run_seed_gives_valid_sampling_seeds(setup):
    """run.seed may be 2**31 - 1: the trainer's rollout seed (seed * 100_000 + step) times the
    loop's per-turn factor passes 2**64, and is reduced to a seed the generators take."""
    rb = run(setup, seed=(2**31 - 1) * 100_000, episode_len=1, groups=1, g=2)
    assert rb.num_rows == 2


def test_turn_one_end_and_step_limit(setup):
    one = run(setup, episode_len=1)
    assert one.length.tolist() == [1] * 6 and one.num_rows == 6
    capped = run(setup, episode_len=50, max_steps=2)
    assert capped.length.tolist() == [2] * 6 and not capped.won.any()


def test_vllm_rollout_on_alfworld_games(setup, tmp_path, vllm_available):
    """The same loop with the vLLM backend on procedural ALFWorld games: behaviour log-probs agree
    with HF scoring of the same tokens, and the split of wall time is reported."""
    from pcsd.envs.procedural import write_game
    from pcsd.ops.scoring import score_packed

    _, builder, eos, model = setup
    model_dir = builder.tokenizer.tokenizer_dir
    games = [
        str(write_game(tmp_path / f"g{i}.tw-pddl", tt, i))
        for i, tt in enumerate(["pick_and_place_simple", "look_at_obj_in_light"])
    ]
    vb = make_backend("vllm", model_path=model_dir, dtype="float32", max_model_len=2048, kv_cache_bytes=128 << 20)
    try:
        rb = collect_rollouts(vb, builder, games, 2, max_steps=3, max_response_tokens=16, seed=1, stop_token_ids=[eos])
    finally:
        vb.close()
    assert rb.num_trajectories == 4 and rb.length.tolist() == [3, 3, 3, 3]
    assert rb.task_type[:2] == ["pick_and_place_simple"] * 2
    with torch.no_grad():
        lp = torch.cat(score_packed(model, rb.prompt_ids, rb.response_ids))
    beh = torch.tensor([x for row in rb.behaviour_logprobs for x in row])
    torch.testing.assert_close(beh, lp, rtol=0, atol=1e-4)
    t = rb.timings
    assert t.total > 0 and t.generation > 0 and 0 <= t.outside_model_share() <= 1


def test_an_over_long_prompt_ends_its_episode_not_the_run(setup):
    """Games whose first prompt is over the budget even without history: those episodes end at once,
    unwon and counted (RolloutBatch.prompt_overflow, the evaluation's prompt_overflows and its table
    note); the others play on, every prompt within the budget. Before: PromptTooLongError ended all."""
    from pcsd.envs.pool import EnvPool
    from pcsd.envs.procedural import ProceduralGames
    from pcsd.eval.run import EvalResult, play_games, render_table

    backend, _, eos, _ = setup
    path = setup[1].tokenizer.tokenizer_dir
    games = list(ProceduralGames(8, 300, distractors=30))
    unbounded = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=None, tokenizer_dir=path)
    with EnvPool("alfworld", len(games), games=games) as pool:
        first = pool.reset()
        tasks = [pool.task_of(e)[1] for e in range(len(games))]
    size = [
        len(unbounded.encode_batch([dict(task=tasks[e], observation=first.obs[k], admissible=first.admissible[k])])[0])
        for k, e in enumerate(first.env_id.tolist())
    ]
    budget = sorted(size)[len(size) // 2]
    over = [n > budget for n in size]
    assert 0 < sum(over) < len(games)
    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=budget, tokenizer_dir=path)
    rb = collect_rollouts(backend, builder, games, 1, max_steps=3, max_response_tokens=8, seed=0, stop_token_ids=[eos])
    for e, o in enumerate(over):
        if o:  # ended before its first turn
            assert rb.prompt_overflow[e] and rb.length[e] == 0 and not rb.won[e] and e not in rb.traj_id.tolist()
        else:
            assert rb.length[e] >= 1
    assert rb.prompt_overflows >= sum(over) and rb.prompt_overflows == int(rb.prompt_overflow.sum())
    assert all(len(p) <= budget for p in rb.prompt_ids)
    res = play_games(backend, builder, games, max_steps=3, max_response_tokens=8, temperature=0.4, stop_token_ids=[eos])
    assert all(g.prompt_overflow and not g.won and g.steps == 0 for g, o in zip(res, over) if o)
    doc = EvalResult(label="m", split="procedural", games=res).to_dict()
    assert doc["prompt_overflows"] >= sum(over)
    assert (
        "Episodes ended unwon because a prompt exceeded the token budget even without history: m (procedural)"
        in render_table([doc])
    )
