"""Playing the evaluation games and reporting them: per-game results, Success overall and the
figures of the env's kind (:func:`evaluate`, which the trainer calls before and after RL too), and
the tables (:func:`render_table`).

What a "game" is, what else a result holds and which table it goes in is the env kind's
(:mod:`pcsd.envs.kind`): game files and Table 1's success per category, goal indices with Score and
Acc beside them, reset seeds with Success and the mean summed reward (:mod:`pcsd.envs.tables`).
Every result counts the episodes an over-long prompt or an env error ended, with the first error's
message, and the tables say so under them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from pcsd.envs.games import DEFAULT_SEED, game_seed
from pcsd.envs.kind import EnvKind, Pools
from pcsd.envs.kind import TaskError as EvalError

__all__ = ["EvalResult", "GameResult", "evaluate", "play_games", "render_table"]


def _kind(name: Optional[str]) -> EnvKind:
    from pcsd.envs import registry

    return registry.default() if name is None else registry.get(name)


# ----------------------------------------------------------------------------- results
@dataclass
class GameResult:
    game: str  # the task: a game file's path, a goal index, a reset seed
    task_type: str
    category: str  # the column of the kind's table (ALFWorld: the paper's column name)
    won: bool
    steps: int  # environment actions taken
    seed: int  # sampling seed of the batch the game was played in
    actions: list[str] = field(default_factory=list)  # the actions sent to the game, in order
    # the task score: WebShop's q in [0, 1], a Python env's summed reward; None where the kind keeps none
    score: Optional[float] = None
    # the episode ended (unwon) because a prompt exceeded max_prompt_tokens even without history
    prompt_overflow: bool = False
    env_error: str = ""  # the env error that ended the episode ("" none)


@dataclass
class EvalResult:
    """One row of a table: a model evaluated on one fixed list of games of one env kind."""

    label: str
    split: str
    games: list[GameResult]
    settings: dict[str, Any] = field(default_factory=dict)
    env: Optional[str] = None  # the env kind's name (None: the default kind)

    def __post_init__(self) -> None:
        self.env = _kind(self.env).name

    @property
    def kind(self) -> EnvKind:
        return _kind(self.env)

    def fields(self) -> dict[str, Any]:
        """The kind's figures of these games (:meth:`pcsd.envs.kind.EnvKind.result_fields`)."""
        return self.kind.result_fields(self.games)

    @property
    def mean_reward(self) -> Optional[float]:
        return self.fields().get("mean_reward")

    @property
    def score(self) -> Optional[float]:
        return self.fields().get("score")

    @property
    def acc(self) -> Optional[float]:
        return self.fields().get("acc")

    def counts(self) -> dict[str, int]:
        return self.fields().get("counts", {})

    def per_category(self) -> dict[str, Optional[float]]:
        """Success rate (%) per category of the kind's table; None for a category with no games."""
        return self.fields().get("per_category", {})

    @property
    def overall(self) -> float:
        """Instance-level success rate (%) over all games (the paper's Overall)."""
        if not self.games:
            return 0.0
        return 100.0 * sum(g.won for g in self.games) / len(self.games)

    @property
    def overall_ci95(self) -> tuple[float, float]:
        """95 % Wilson score interval of Overall (%): how much two runs can differ by chance."""
        from pcsd.envs.tables import wilson_interval

        return wilson_interval(sum(g.won for g in self.games), len(self.games))

    @property
    def prompt_overflows(self) -> int:
        """Episodes ended (unwon) by a prompt over the token budget."""
        return sum(g.prompt_overflow for g in self.games)

    @property
    def env_errors(self) -> int:
        """Episodes ended (unwon) by an env error."""
        return sum(bool(g.env_error) for g in self.games)

    def to_dict(self) -> dict[str, Any]:
        fields = self.fields()
        return dict(
            label=self.label,
            split=self.split,
            env=self.env,
            overall=self.overall,
            overall_ci95=list(self.overall_ci95),
            per_category=fields.pop("per_category", {}),
            **{k: v for k, v in fields.items() if k != "counts"},
            counts=fields.get("counts", {}),
            episodes=len(self.games),
            prompt_overflows=self.prompt_overflows,
            env_errors=self.env_errors,
            settings=self.settings,
            games=[asdict(g) for g in self.games],
        )


# ----------------------------------------------------------------------------- playing
def play_games(
    backend,
    builder,
    games: Sequence[Any],
    *,
    max_steps: int = 50,
    max_response_tokens: int = 512,
    temperature: float = 0.4,
    seed: int = DEFAULT_SEED,
    skills: bool = False,
    batch_size: int = 0,
    num_threads: int = 0,
    stop_token_ids: Sequence[int] = (),
    progress: Optional[Callable[[int, int], Any]] = None,
    env: Optional[str] = None,
    env_options: Optional[dict] = None,
    pools: Optional[Pools] = None,
    on_batch: Optional[Callable[[Any], Any]] = None,
) -> list[GameResult]:
    """Plays every game once (one episode each) and returns the results in the order of ``games``.

    Args:
        temperature: sampling temperature; 0 = greedy.
        skills: the student sees the skills (the starred variants of Table 1).
        batch_size: games played together (0 = all); see the module notes on seeds.
        progress: ``progress(done_games, total_games)`` after every turn.
        pools: the env kind's pools (:class:`pcsd.envs.kind.Pools`); without them, ``env`` names
            the kind (default: the default kind, ALFWorld's game files) and ``env_options`` its
            pool options (:meth:`pcsd.envs.kind.EnvKind.pools`).
        on_batch: called with each batch's :class:`pcsd.rollout.loop.RolloutBatch` (trajectory
            ``i``: the batch's game ``i``), e.g. to record its failed episodes (``run.log_eval_failures``).
    """
    from pcsd.rollout.loop import collect_rollouts

    if not games:
        raise EvalError("games is empty: nothing to evaluate")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise EvalError(f"batch_size={batch_size!r}: expected a non-negative int (0 = all games at once)")
    if temperature < 0:
        raise EvalError(f"temperature={temperature}: expected >= 0 (0 = greedy)")
    if pools is None:
        pools = _kind(env).pools(env_options)
    kind = pools.kind
    keeps_score = kind.task_score == "score"
    size = batch_size or len(games)
    results: list[GameResult] = []
    total = len(games)
    for b0 in range(0, total, size):
        chunk = list(games[b0 : b0 + size])
        s = game_seed(str(chunk[0]), seed)
        cb = None if progress is None else (lambda d, n, b0=b0: progress(b0 + d, total))
        rb = collect_rollouts(
            backend,
            builder,
            chunk,
            1,
            max_steps=max_steps,
            max_response_tokens=max_response_tokens,
            temperature=temperature,
            seed=s,
            stop_token_ids=stop_token_ids,
            student_skills=skills,
            teacher_prompts=False,
            num_threads=num_threads,
            progress=cb,
            pools=pools,
        )
        if on_batch is not None:
            on_batch(rb)
        acts: list[list[str]] = [[] for _ in chunk]
        for e, a in zip(rb.traj_id.tolist(), rb.actions):  # rows are in turn order
            acts[e].append(a)
        for i, g in enumerate(chunk):
            tt = rb.task_type[i]
            q = float(rb.score[i]) if keeps_score and rb.score is not None else None
            results.append(
                GameResult(
                    game=str(g),
                    task_type=tt,
                    category=kind.category(tt),
                    won=bool(rb.won[i]),
                    steps=int(rb.length[i]),
                    seed=s,
                    actions=acts[i],
                    score=q,
                    prompt_overflow=rb.prompt_overflow is not None and bool(rb.prompt_overflow[i]),
                    env_error=rb.env_error[i] if rb.env_error else "",
                )
            )
    return results


def evaluate(
    backend,
    builder,
    games: Sequence[Any],
    cfg,
    seed: int = DEFAULT_SEED,
    *,
    label: str = "",
    split: str = "",
    progress=None,
    env_options: Optional[dict] = None,
    pools: Optional[Pools] = None,
    on_batch: Optional[Callable[[Any], Any]] = None,
) -> dict[str, Any]:
    """The trainer's evaluation (before and after RL): every game once, fixed order and seed, with
    ``cfg.eval`` settings, on the pools of the kind ``cfg.env.name`` (``pools``, else built from
    ``env_options``). Returns the :class:`EvalResult` as a dict (``overall``, the kind's figures,
    per-game ``games``) plus ``per_task`` (success by task type). ``on_batch``: as for :func:`play_games`."""
    from pcsd.models import eos_id

    if pools is None:
        pools = _kind(str(cfg.env.get("name") or _kind(None).name)).pools(env_options)
    temp = 0.0 if cfg.eval.greedy else float(cfg.eval.temperature)
    res = play_games(
        backend,
        builder,
        games,
        max_steps=cfg.env.max_steps,
        max_response_tokens=cfg.rollout.max_response_tokens,
        temperature=temp,
        seed=seed,
        skills=bool(cfg.eval.skills),
        batch_size=int(cfg.eval.get("batch_size", 0)),
        num_threads=cfg.env.num_threads,
        stop_token_ids=[eos_id(builder)],
        progress=progress,
        pools=pools,
        on_batch=on_batch,
    )
    er = EvalResult(
        label=label,
        split=split,
        games=res,
        env=pools.kind.name,
        settings=dict(
            temperature=temp, seed=seed, skills=bool(cfg.eval.skills), protocol=str(cfg.eval.get("protocol", "full"))
        ),
    )
    out = er.to_dict()
    per: dict[str, list[bool]] = {}
    for g in res:
        per.setdefault(g.task_type, []).append(g.won)
    out["per_task"] = {k: 100.0 * sum(v) / len(v) for k, v in sorted(per.items())}
    return out


# ----------------------------------------------------------------------------- the tables
def render_table(results: Sequence[EvalResult | dict]) -> str:
    """Markdown tables of ``results``: each row in the table of its env kind
    (:mod:`pcsd.envs.tables`: Table 1's layout for ALFWorld, with WebShop's Score and Acc; Success
    and mean reward for Python envs), the tables one after the other."""
    from pcsd.envs.tables import render

    rows = [r.to_dict() if isinstance(r, EvalResult) else r for r in results]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(_kind(r.get("env")).table, []).append(r)
    return render(groups)
