"""The batched multi-turn rollout loop over an env pool (the native one, or Python envs in worker
processes), the same for every environment.

B games x G rollouts (a GRPO group shares its game); every turn the Rust prompt builder renders
and tokenises the student prompts (and the teacher prompts, same context plus skills) of all
active environments in parallel, the backend samples one response per environment, the parser
extracts the action, and the pool steps every active environment at once. An environment that
finishes leaves the batch immediately, so each turn only generates for environments still playing.

What differs between environments lives below the loop: how the pool is built and what an
episode's reward is (the env kind's :class:`pcsd.envs.kind.Pools`), and what the prompt shows and
how a response becomes an action (:mod:`pcsd.text.formats`, by the prompt builder's family).

The teacher's prompt of a turn carries the env's privileged text (``StepBatch.privileged``: a
Python env's ``info["privileged"]`` at reset, replaced when a step's info gives it, cleared when a
step gives ``""``) beside its skills; the student's never does.

Env errors: where the kind says so, an env error (an exception, hang or crash of a Python env, a
step the original WebShop raises on) ends that episode unwon; the batch keeps each one's message
(``RolloutBatch.env_error``) and counts them. Every env of the batch failing at reset is an
:class:`pcsd.envs.kind.EnvFailure` naming the first env and its error.

Over-long prompts: the prompt builder drops the interaction history of a prompt over
``max_prompt_tokens`` (the no-history template, as verl-agent's WebShop manager does over 13,000
characters); a prompt still over the budget ends that episode, unwon, before its turn is generated
(``RolloutBatch.prompt_overflow``, counted in the step's metrics and the evaluation's results). The
run goes on: verl-agent/SDAR's scripts (``data.truncation='error'``) would stop the whole run, and
cutting tokens from a prompt would hide the task or the admissible actions from the policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from pcsd.envs.kind import EnvFailure, Pools
from pcsd.rollout.backends import GenerationBackend

__all__ = ["EnvFailure", "RolloutBatch", "collect_rollouts", "RolloutTimings"]


@dataclass
class RolloutTimings:
    generation: float = 0.0
    env: float = 0.0
    prompts: float = 0.0
    parsing: float = 0.0
    total: float = 0.0

    def outside_model_share(self) -> float:
        return (self.env + self.prompts + self.parsing) / max(self.total, 1e-9)


@dataclass
class RolloutBatch:
    """One batch of experience. R turn-samples (rows), N trajectories, T response tokens."""

    # --- per turn-sample (R rows) ---
    prompt_ids: list[list[int]]  # (R, P_r) student prompt tokens (chat-formatted)
    teacher_prompt_ids: list[list[int]]  # (R, P'_r) same context with skills prepended
    response_ids: list[list[int]]  # (R, L_r) sampled response tokens
    behaviour_logprobs: list[list[float]]  # (R, L_r) log pi_old(y) at sampling time
    traj_id: Tensor  # (R,) int64 trajectory of each row
    group_id: Tensor  # (R,) int64 GRPO group (= game) of each row
    turn: Tensor  # (R,) int64 turn index within the trajectory, from 0
    action_valid: Tensor  # (R,) bool well-formed and admissible action
    actions: list[str]  # (R,) the parsed action sent to the env
    # --- per trajectory (N) ---
    reward: Tensor  # (N,) float32: success_reward on success, 0 otherwise (+ optional penalties)
    won: Tensor  # (N,) bool
    length: Tensor  # (N,) int64 number of turns
    traj_group: Tensor  # (N,) int64 group of each trajectory
    task_type: list[str]  # (N,)
    task: list[str]  # (N,)
    # --- bookkeeping ---
    timings: RolloutTimings = field(default_factory=RolloutTimings)
    # (N,) float64 task score: WebShop's purchase reward at the episode's end (0 without a purchase),
    # ALFWorld's won as 0/1, a Python env's summed reward; None where the batch was not made by
    # collect_rollouts
    score: Optional[Tensor] = None
    env_errors: int = 0  # episodes ended by an env error (WebShop: a step the original raises on)
    # (N,) bool: the episode ended because its prompt exceeded max_prompt_tokens even without history
    prompt_overflow: Optional[Tensor] = None
    # (N,) the env error that ended each episode ("" none) and the episode step it came at
    env_error: list[str] = field(default_factory=list)
    env_error_step: list[int] = field(default_factory=list)
    # (R,) int64 anchor state of each row (GiGPO): the env's observation the row's response answered,
    # without history; rows with equal ids saw identical observations. None where the batch was not
    # made by collect_rollouts
    anchor: Optional[Tensor] = None
    # (R,) float32 reward of each row's step: the env's step reward (ALFWorld, WebShop: 0 but on the
    # winning step, which carries success_reward) minus the step's invalid-action penalty; a
    # trajectory's rows sum to its reward (its last row carries any difference, e.g. an episode an env
    # error ended). None where the batch was not made by collect_rollouts
    step_reward: Optional[Tensor] = None
    # (R,) bool: the row's teacher prompt holds a privileged context (algo.teacher_context=group-success:
    # skills, the env's privileged text or a peer's success; pcsd.rollout.teacher_context). None: every
    # row's does (the default context)
    teacher_context: Optional[Tensor] = None
    # (R,) the observation each row's response answered, as the prompt shows it (the env's text after
    # the prompt family's view; no history). Empty where the batch was not made by collect_rollouts
    observation: list[str] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.response_ids)

    @property
    def num_trajectories(self) -> int:
        return int(self.reward.numel())

    def cu_seqlens(self) -> Tensor:
        """(R+1,) int64 offsets of the responses packed back to back: the PCSD op's segments."""
        lengths = torch.tensor([len(r) for r in self.response_ids], dtype=torch.int64)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        cu[1:] = lengths.cumsum(0)
        return cu

    def token_traj_ids(self) -> Tensor:
        """(T,) int64 trajectory of every packed response token."""
        lengths = torch.tensor([len(r) for r in self.response_ids], dtype=torch.int64)
        return torch.repeat_interleave(self.traj_id, lengths)

    def num_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    @property
    def prompt_overflows(self) -> int:
        """Episodes ended by an over-long prompt."""
        return 0 if self.prompt_overflow is None else int(self.prompt_overflow.sum())

    def row_step_rewards(self) -> Tensor:
        """(R,) float32 ``step_reward``; for a batch without it, each trajectory's reward on its last
        row (its other rows 0), so a trajectory's steps still sum to its reward."""
        if self.step_reward is not None:
            return self.step_reward
        out = torch.zeros(self.num_rows, dtype=torch.float32)
        last: dict[int, int] = {}
        for i, (t, k) in enumerate(zip(self.traj_id.tolist(), self.turn.tolist())):
            if t not in last or k > self.turn[last[t]]:
                last[t] = i
        for t, i in last.items():
            out[i] = self.reward[t]
        return out

    @property
    def num_groups(self) -> int:
        return int(self.traj_group.max()) + 1 if self.traj_group.numel() else 0

    def take_groups(self, groups: Sequence[int]) -> "RolloutBatch":
        """The sub-batch of the groups ``groups`` (indices of ``traj_group``): groups renumbered from 0
        in the order given, trajectories in that order of their groups, rows in their order here;
        every field kept (timings: the whole batch's)."""
        order = [int(g) for g in groups]
        new_group = {g: k for k, g in enumerate(order)}
        if len(new_group) != len(order):
            raise ValueError(f"groups must be distinct, got {order}")
        trajs = sorted(
            (t for t, g in enumerate(self.traj_group.tolist()) if g in new_group),
            key=lambda t: (new_group[int(self.traj_group[t])], t),
        )
        new_traj = {t: k for k, t in enumerate(trajs)}
        rows = [i for i, t in enumerate(self.traj_id.tolist()) if t in new_traj]  # rows keep their order
        ridx = torch.tensor(rows, dtype=torch.int64)
        tidx = torch.tensor(trajs, dtype=torch.int64)
        pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
        traj_id = torch.tensor([new_traj[t] for t in self.traj_id[ridx].tolist()], dtype=torch.int64)
        traj_group = torch.tensor([new_group[g] for g in self.traj_group[tidx].tolist()], dtype=torch.int64)
        return RolloutBatch(
            prompt_ids=pick(self.prompt_ids),
            teacher_prompt_ids=pick(self.teacher_prompt_ids),
            response_ids=pick(self.response_ids),
            behaviour_logprobs=pick(self.behaviour_logprobs),
            traj_id=traj_id,
            group_id=traj_group[traj_id] if len(rows) else torch.zeros(0, dtype=torch.int64),
            turn=self.turn[ridx],
            action_valid=self.action_valid[ridx],
            actions=pick(self.actions),
            reward=self.reward[tidx],
            won=self.won[tidx],
            length=self.length[tidx],
            traj_group=traj_group,
            task_type=[self.task_type[t] for t in trajs],
            task=[self.task[t] for t in trajs],
            timings=self.timings,
            score=None if self.score is None else self.score[tidx],
            # per batch, not per group: kept when every group is taken
            env_errors=self.env_errors if len(order) == self.num_groups else 0,
            prompt_overflow=None if self.prompt_overflow is None else self.prompt_overflow[tidx],
            anchor=None if self.anchor is None else self.anchor[ridx],
            step_reward=None if self.step_reward is None else self.step_reward[ridx],
            teacher_context=None if self.teacher_context is None else self.teacher_context[ridx],
            env_error=[self.env_error[t] for t in trajs] if self.env_error else [],
            env_error_step=[self.env_error_step[t] for t in trajs] if self.env_error_step else [],
            observation=pick(self.observation) if self.observation else [],
        )

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """The batches one after another: trajectories, groups and anchor ids of batch ``b`` follow
        those of the batches before it (anchors of different batches never compare equal); timings
        and env errors summed. An optional field is kept when every batch has it."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        t_off = g_off = a_off = 0
        traj, group, tgroup, anchor = [], [], [], []
        for b in batches:
            traj.append(b.traj_id + t_off)
            group.append(b.group_id + g_off)
            tgroup.append(b.traj_group + g_off)
            if b.anchor is not None:
                anchor.append(b.anchor + a_off)
                a_off += int(b.anchor.max()) + 1 if b.anchor.numel() else 0
            t_off += b.num_trajectories
            g_off += b.num_groups
        cat = lambda name: [x for b in batches for x in getattr(b, name)]  # noqa: E731

        def opt(name: str) -> Optional[Tensor]:
            parts = [getattr(b, name) for b in batches]
            return None if any(p is None for p in parts) else torch.cat(parts)

        timings = RolloutTimings()
        for b in batches:
            for f in ("generation", "env", "prompts", "parsing", "total"):
                setattr(timings, f, getattr(timings, f) + getattr(b.timings, f))
        return RolloutBatch(
            prompt_ids=cat("prompt_ids"),
            teacher_prompt_ids=cat("teacher_prompt_ids"),
            response_ids=cat("response_ids"),
            behaviour_logprobs=cat("behaviour_logprobs"),
            traj_id=torch.cat(traj),
            group_id=torch.cat(group),
            turn=torch.cat([b.turn for b in batches]),
            action_valid=torch.cat([b.action_valid for b in batches]),
            actions=cat("actions"),
            reward=torch.cat([b.reward for b in batches]),
            won=torch.cat([b.won for b in batches]),
            length=torch.cat([b.length for b in batches]),
            traj_group=torch.cat(tgroup),
            task_type=cat("task_type"),
            task=cat("task"),
            timings=timings,
            score=opt("score"),
            env_errors=sum(b.env_errors for b in batches),
            prompt_overflow=opt("prompt_overflow"),
            anchor=torch.cat(anchor) if len(anchor) == len(batches) else None,
            step_reward=opt("step_reward"),
            teacher_context=opt("teacher_context"),
            env_error=cat("env_error") if all(b.env_error for b in batches) else [],
            env_error_step=cat("env_error_step") if all(b.env_error_step for b in batches) else [],
            observation=cat("observation") if all(b.observation for b in batches) else [],
        )


def _encode_within_budget(builder, requests: list[dict], teacher: bool) -> list[Optional[list[int]]]:
    """``builder.encode_batch``; where a prompt is over the budget even without history
    (``PromptTooLongError``), that request's entry is None (the others are encoded one by one:
    only when a batch holds such a prompt)."""
    from pcsd.text import prompts

    too_long = prompts.PromptTooLongError
    try:
        return list(builder.encode_batch(requests, teacher=teacher))
    except too_long:
        out: list[Optional[list[int]]] = []
        for r in requests:
            try:
                out.append(builder.encode_batch([r], teacher=teacher)[0])
            except too_long:
                out.append(None)
        return out


def collect_rollouts(
    backend: GenerationBackend,
    builder,  # pcsd.text.prompts.PromptBuilder with a tokenizer
    games: Sequence[str] | int,
    group_size: int,
    *,
    max_steps: int = 50,
    max_response_tokens: int = 512,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_token_ids: Sequence[int] = (),
    success_reward: float = 10.0,
    invalid_action_penalty: float = 0.0,
    student_skills: bool = False,
    teacher_prompts: bool = True,
    num_threads: int = 0,
    env_kind: str = "alfworld",
    env_options: Optional[dict] = None,
    progress=None,
    pools: Optional[Pools] = None,
    teacher_context: str = "env",
    teacher_context_tokens: int = 1024,
) -> RolloutBatch:
    """Plays ``len(games) * group_size`` episodes to the end (done or ``max_steps``).

    Args:
        backend: a generation backend (``vllm`` or ``hf``).
        builder: the prompt builder (student and teacher prompts, chat template, tokeniser).
        games: one game per group; environment ``i`` plays ``games[i // group_size]``: game files
            (``alfworld``), goal indices of the shop in ``env_options["shop"]`` (``webshop``), reset
            seeds (Python kinds such as ``gym``: ``env_options["make_env"]`` is the env factory or
            running :class:`pcsd.envs.pypool.EnvWorkers`), or the number of groups (``dummy``).
        pools: the env kind's pools (:class:`pcsd.envs.kind.Pools`: a training run's, built once);
            without them ``env_kind`` names the kind and ``env_options`` its pool options.
        env_kind: a name of :mod:`pcsd.envs.registry` (``alfworld``, the default; ``webshop``,
            ``gym``, ...). WebShop runs as verl-agent's wrapper does (:mod:`pcsd.text.formats`: the
            task is the page's instruction, the page and its clickables reformatted, the response
            projected, not checked for admissibility) and ``won`` is score 1. Where the kind says so
            (WebShop, Python envs) an env error (a step the original WebShop raises on; an
            exception, hang or crash of a Python env) ends that episode unwon, counted in
            ``env_errors``; ALFWorld's engine errors stop the rollout. Python envs: the
            trajectory's reward is the env's summed reward (not ``success_reward``), ``score`` the
            same, ``won`` the env's ``info["won"]`` or the pool's success threshold.
        student_skills: the student sees the skills too (Skill-GRPO and the starred evaluations).
        teacher_prompts: also build the teacher prompts (needed for distillation).
        teacher_context: ``env`` (the teacher reads the skills and the env's privileged text) or
            ``group-success`` (also a successful episode of the same group, never the row's own, at
            most ``teacher_context_tokens`` tokens: :mod:`pcsd.rollout.teacher_context`; the teacher
            prompts are built once the group has played, and ``RolloutBatch.teacher_context`` says
            which rows have any context).
        progress: optional callable ``progress(done_envs, total_envs)``.
    """
    from pcsd.text.formats import text_format

    if pools is None:
        from pcsd.envs.registry import get as get_env

        pools = get_env(env_kind).pools(env_options)
    spec = pools.kind
    fmt = text_format(builder.env)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if teacher_context not in ("env", "group-success"):
        raise ValueError(f"teacher_context must be env or group-success, got {teacher_context!r}")
    from_group = teacher_prompts and teacher_context == "group-success"
    rows_treq: list[dict] = []  # group-success: each row's teacher request, encoded once the groups have played
    num_groups = games if isinstance(games, int) else len(games)
    if num_groups < 1:
        raise ValueError("games must name at least one game")
    t_start = time.perf_counter()
    timings = RolloutTimings()
    n_envs = num_groups * group_size
    t0 = time.perf_counter()
    pool = pools.make(n_envs, group_size, games, max_steps=max_steps, num_threads=num_threads, seed=seed)
    try:
        first = pool.reset()
    except BaseException:
        pool.close()
        raise
    timings.env += time.perf_counter() - t0
    ids = first.env_id.tolist()
    tasks: dict[int, tuple[str, str]] = {}  # (task_type, task as the prompts state it)
    obs: dict[int, str] = {}
    anchors: dict[str, int] = {}  # GiGPO's anchor states: the env's observation (no history) -> id
    anchor_now: dict[int, int] = {}  # each live env's current anchor id
    adm: dict[int, list[str]] = {}
    secret: dict[int, str] = {}  # the env's privileged text (the teacher's prompt only)
    errors = [""] * n_envs
    error_step = [0] * n_envs
    env_errors = 0
    active = []
    privileged = first.privileged
    for k, e in enumerate(ids):
        task_type, task = pool.task_of(e)
        if first.error[k]:  # an env that failed to reset: its episode ends before it starts
            if not spec.errors_end_episode:
                pool.close()
                raise EnvFailure(f"environment {e} failed: {first.error[k]}")
            tasks[e] = (task_type, task)
            errors[e] = first.error[k]
            env_errors += 1
            continue
        tasks[e] = (task_type, fmt.task(task, first.obs[k]))
        anchor_now[e] = anchors.setdefault(_anchor_of(first, k), len(anchors))
        obs[e], adm[e] = fmt.view(first.obs[k], first.admissible[k], tasks[e][1], first.has_search_bar[k])
        if privileged is not None and privileged[k]:
            secret[e] = privileged[k]
        active.append(e)
    if not active:
        pool.close()
        raise EnvFailure(
            f"every environment failed at reset ({n_envs} of {pools.describe()}), e.g. environment {ids[0]}: "
            f"{first.error[0]}"
        )
    history: dict[int, list[tuple[str, str]]] = {e: [] for e in range(n_envs)}
    won = torch.zeros(n_envs, dtype=torch.bool)
    score = torch.zeros(n_envs, dtype=torch.float64)
    overflow = torch.zeros(n_envs, dtype=torch.bool)
    length = torch.zeros(n_envs, dtype=torch.int64)
    penalty = torch.zeros(n_envs, dtype=torch.float32)
    rows_prompt, rows_teacher, rows_resp, rows_lp = [], [], [], []
    rows_traj, rows_turn, rows_valid, rows_action = [], [], [], []
    rows_anchor: list[int] = []
    rows_obs: list[str] = []
    rows_env_reward: list[float] = []  # the env's reward of the row's step (Python envs; 0 for the others)
    rows_penalty: list[float] = []
    turn = 0
    try:
        while active:
            t0 = time.perf_counter()
            reqs = [
                dict(
                    task=tasks[e][1],
                    observation=obs[e],
                    admissible=adm[e],
                    history=history[e],
                    step=len(history[e]),
                    task_type=tasks[e][0],
                )
                for e in active
            ]
            encoded = _encode_within_budget(builder, reqs, student_skills)
            if any(ids is None for ids in encoded):  # over the budget without history: the episode ends
                keep = [k for k, ids in enumerate(encoded) if ids is not None]
                for k, e in enumerate(active):
                    overflow[e] = encoded[k] is None
                active, reqs = [active[k] for k in keep], [reqs[k] for k in keep]
                encoded = [encoded[k] for k in keep]
                if not active:
                    timings.prompts += time.perf_counter() - t0
                    if progress is not None:
                        progress(n_envs, n_envs)
                    break
            student = [ids for ids in encoded if ids is not None]
            if teacher_prompts:  # the env's privileged text goes to the teacher's prompts only
                t_reqs = [dict(r, privileged=secret[e]) if e in secret else r for r, e in zip(reqs, active)]
                if from_group:  # the history as it is now (it grows), the prompt once the group has played
                    rows_treq += [dict(r, history=list(history[e])) for r, e in zip(t_reqs, active)]
                    teacher = student
                else:
                    teacher = builder.encode_batch(t_reqs, teacher=True)
            else:
                teacher = student
            timings.prompts += time.perf_counter() - t0

            t0 = time.perf_counter()
            out = backend.generate(
                student,
                n=1,
                max_tokens=max_response_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=(seed * 1_000_003 + turn * 7919) % 2**63,  # a seed torch/vLLM take
                stop_token_ids=stop_token_ids,
            )
            timings.generation += time.perf_counter() - t0

            t0 = time.perf_counter()
            actions = []
            for k, e in enumerate(active):
                s = out[k][0]
                text = builder.tokenizer.decode(s.token_ids)
                parsed = fmt.parse(text, adm[e])
                actions.append(parsed.action)
                rows_prompt.append(student[k])
                rows_teacher.append(teacher[k])
                rows_resp.append(s.token_ids)
                rows_lp.append(s.logprobs)
                rows_traj.append(e)
                rows_turn.append(turn)
                rows_valid.append(parsed.is_valid)
                rows_action.append(parsed.action)
                rows_anchor.append(anchor_now[e])
                rows_obs.append(obs[e])
                rows_env_reward.append(0.0)
                rows_penalty.append(0.0 if parsed.is_valid else invalid_action_penalty)
                if not parsed.is_valid:
                    penalty[e] += invalid_action_penalty
            timings.parsing += time.perf_counter() - t0

            t0 = time.perf_counter()
            first_row = len(rows_resp) - len(active)
            row_of = {e: first_row + k for k, e in enumerate(active)}
            res = pool.step(actions, env_ids=active)
            timings.env += time.perf_counter() - t0
            still = []
            privileged = res.privileged
            for k, e in enumerate(res.env_id.tolist()):
                if res.error[k] and not spec.errors_end_episode:
                    raise EnvFailure(f"environment {e} failed: {res.error[k]}")
                history[e].append((obs[e], actions[k]))
                length[e] += 1
                if res.error[k]:  # e.g. where the original WebShop raises (search[<a> ...]): episode over
                    errors[e], error_step[e] = res.error[k], int(length[e])
                    env_errors += 1
                    continue
                obs[e], adm[e] = fmt.view(res.obs[k], res.admissible[k], tasks[e][1], res.has_search_bar[k])
                if privileged is not None:  # the env's latest text: a step's "" clears the reset's
                    if privileged[k]:
                        secret[e] = privileged[k]
                    else:
                        secret.pop(e, None)
                if spec.env_reward:
                    rows_env_reward[row_of[e]] = float(res.reward[k])
                anchor_now[e] = anchors.setdefault(_anchor_of(res, k), len(anchors))
                if res.done[k]:
                    won[e] = bool(res.won[k])
                    score[e] = float(res.score[k]) if spec.task_score == "score" else float(won[e])
                else:
                    still.append(e)
            active = still
            turn += 1
            if progress is not None:
                progress(n_envs - len(active), n_envs)
    finally:
        pool.close()
    context = None
    if from_group:
        t0 = time.perf_counter()
        rows_teacher, context = _group_success_prompts(
            builder, rows_treq, rows_traj, rows_prompt, won.tolist(), history, group_size, teacher_context_tokens
        )
        timings.prompts += time.perf_counter() - t0
    timings.total = time.perf_counter() - t_start
    outcome = score.to(torch.float32) if spec.env_reward else won.to(torch.float32) * success_reward
    reward = outcome - penalty
    traj = torch.tensor(rows_traj, dtype=torch.int64)
    step_reward = _step_rewards(rows_traj, rows_env_reward, rows_penalty, outcome)
    return RolloutBatch(
        prompt_ids=rows_prompt,
        teacher_prompt_ids=rows_teacher,
        response_ids=rows_resp,
        behaviour_logprobs=rows_lp,
        traj_id=traj,
        group_id=traj // group_size,
        turn=torch.tensor(rows_turn, dtype=torch.int64),
        action_valid=torch.tensor(rows_valid, dtype=torch.bool),
        actions=rows_action,
        reward=reward,
        won=won,
        length=length,
        traj_group=torch.arange(n_envs, dtype=torch.int64) // group_size,
        task_type=[tasks[e][0] for e in range(n_envs)],
        task=[tasks[e][1] for e in range(n_envs)],
        timings=timings,
        score=score,
        env_errors=env_errors,
        prompt_overflow=overflow,
        env_error=errors,
        env_error_step=error_step,
        anchor=torch.tensor(rows_anchor, dtype=torch.int64),
        step_reward=step_reward,
        teacher_context=context,
        observation=rows_obs,
    )


def _group_success_prompts(
    builder, requests: list[dict], rows_traj: list[int], student: list[list[int]], won: list[bool], history, G, budget
) -> tuple[list[list[int]], Tensor]:
    """The teacher prompts of ``algo.teacher_context=group-success`` (one encoding of every row's
    request with its peer's success, :mod:`pcsd.rollout.teacher_context`) and ``(R,)`` bool: the
    row's teacher prompt differs from its student prompt (skills, privileged text or a success)."""
    from pcsd.rollout.teacher_context import pick_peers, success_text, with_success

    peers = pick_peers(won, G)
    count = lambda text: len(builder.tokenizer.encode(text))  # noqa: E731
    texts: dict[int, str] = {}
    for p in peers:
        if p is not None and p not in texts:
            texts[p] = success_text(history[p], count, budget)
    reqs = [with_success(r, _peer_text(texts, peers[e])) for r, e in zip(requests, rows_traj)]
    teacher = list(builder.encode_batch(reqs, teacher=True)) if reqs else []
    context = torch.tensor([t != s for t, s in zip(teacher, student)], dtype=torch.bool)
    return teacher, context


def _peer_text(texts: dict[int, str], peer: Optional[int]) -> Optional[str]:
    return None if peer is None else texts.get(peer)


def _anchor_of(batch, k: int) -> str:
    """Entry ``k``'s anchor state: the env's ``info["anchor"]`` where a Python env gives one, else
    its observation as the env returned it (no history, before the prompt family reformats it)."""
    given = getattr(batch, "anchor", None)
    if given is not None and given[k] is not None:
        return given[k]
    return batch.obs[k]


def _step_rewards(rows_traj: list[int], env_reward: list[float], penalty: list[float], outcome: Tensor) -> Tensor:
    """(R,) float32 step rewards: the env's reward of each row's step minus its penalty, the last
    row of each trajectory also carrying ``outcome - (the env's step rewards)`` so that a
    trajectory's rows sum to ``outcome - penalties``, its reward."""
    r = torch.tensor(env_reward, dtype=torch.float64) - torch.tensor(penalty, dtype=torch.float64)
    last: dict[int, int] = {}
    got: dict[int, float] = {}
    for i, t in enumerate(rows_traj):
        last[t] = i  # rows of a trajectory come in turn order
        got[t] = got.get(t, 0.0) + env_reward[i]
    for t, i in last.items():
        r[i] += float(outcome[t]) - got[t]
    return r.to(torch.float32)
