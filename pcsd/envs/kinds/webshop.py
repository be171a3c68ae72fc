"""WebShop (``env.name=webshop``): the config checks, the two shops, the goals of every phase, the
warm-up's expert and Table 1's Score and Acc (moved here from ``pcsd/train/webshop.py``).

How the GiGPO / verl-agent (ZJU-REAL/SDAR) setup draws its goals, and how pcsd maps it onto one
native shop per split (``docs/webshop.md``):

* verl-agent runs one WebShop process per environment. Training worker ``i`` is built with seed
  ``env.seed + i // group_n`` and validation worker ``i`` with ``env.seed + 1000 + i``; the seed
  fixes the worker's goal order and its price draws. At every reset the environment manager draws
  ``RandomState(manager seed).choice(idxs, env_num, replace=False)`` (one persistent generator;
  manager seed ``env.seed`` for training, ``env.seed + 1000`` for validation) from
  ``idxs = range(500, 6910)`` (training) or ``range(500)`` (validation), and worker ``i`` plays its
  own goal list's entry ``idx[i]``.
* pcsd loads ONE shop per split: training ``WebShop.load(seed=s, variant="verl")`` and validation
  ``WebShop.load(seed=s + 1000, variant="verl")``, and takes the same index draws
  (:func:`pcsd.envs.webshop.draw_goals`): step ``t`` plays draw ``t`` of ``RandomState(s)`` over
  ``range(500, 6910)``; validation ``v`` plays draw ``v`` of ``RandomState(s + 1000)`` over
  ``range(500)`` (``eval.protocol=paper``) or always draw 0 (``eval.protocol=full``: 128 fixed
  goals, the same before and after RL). Group / validation env 0 thus plays exactly verl-agent's
  goal; the others play the same index in the split's one goal list instead of in a list shuffled
  with their own worker seed: the same goal distribution (every goal list is a seeded permutation
  of the same 6,910 goals) without 16 + 128 loaded shops.
* Reward: ``algo.success_reward`` (10) when the episode ends with score 1 (``won``), else 0, minus
  ``rollout.invalid_action_penalty`` per invalid response (verl-agent's WebShop scripts: 0.1).
* The warm-up imitates the native expert (search with the instruction, open the goal's product,
  choose its options, buy) on training goals; only its won episodes are examples.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from pcsd.envs.kind import EnvKind, EnvRun, EvalPlan, Key, NativePools, Pools, TaskError, Warmup

__all__ = [
    "WEBSHOP",
    "WebShopKind",
    "load_shops",
    "train_goals",
    "warmup_goals",
    "warmup_steps_problem",
    "webshop_data_dir",
    "webshop_expert_episodes",
    "webshop_validation_goals",
]

#: the seed of the warm-up's goal draw
SFT_GOALS_SEED = 500_000
#: the steps the config check follows the expert's play for (longer than any: it searches at most
#: twice, pages through at most a few result pages, opens one product, picks its options, buys)
EXPERT_PLAY_CAP = 100
PAPER_EPISODES = 128


def webshop_data_dir(cfg: Any) -> str:
    """``env.webshop_data`` or ``$WEBSHOP_DATA``, checked (ValueError naming env.webshop_data)."""
    from pcsd.envs.webshop import resolve_data_dir

    return resolve_data_dir(cfg.env.get("webshop_data"), "env.webshop_data")


def load_shops(cfg: Any) -> tuple[Any, Any]:
    """The training shop (seed ``run.seed``) and the validation shop (seed ``run.seed + 1000``)."""
    from pcsd.envs.webshop import VALIDATION_SEED_OFFSET, WebShop

    root = webshop_data_dir(cfg)
    seed = int(cfg.run.seed)
    variant = str(cfg.env.webshop_variant)
    return (
        WebShop.load(root, goals="synthetic", seed=seed, variant=variant),
        WebShop.load(root, goals="synthetic", seed=seed + VALIDATION_SEED_OFFSET, variant=variant),
    )


def train_goals(cfg: Any, shop: Any, step: int) -> list[int]:
    """The ``rollout.tasks_per_step`` goal indices RL step ``step`` plays (draw ``step`` of
    ``RandomState(run.seed)`` over the training goals)."""
    from pcsd.envs.webshop import draw_goals, train_goal_indices

    return draw_goals(train_goal_indices(shop.num_goals), int(cfg.rollout.tasks_per_step), int(cfg.run.seed), step)


def webshop_validation_goals(protocol: str, episodes: int = 0, seed: int = 0, validation_index: int = 0) -> list[int]:
    """The WebShop goal indices (of the validation shop, seed ``seed + 1000``) validation number
    ``validation_index`` plays: ``episodes`` (0 = 128) distinct goals of ``range(500)`` drawn with
    ``RandomState(seed + 1000)`` as verl-agent's validation manager draws them; ``paper`` takes
    draw ``validation_index`` of that generator, ``full`` always draw 0 (fixed goals)."""
    from pcsd.envs.webshop import VALIDATION_GOALS, VALIDATION_SEED_OFFSET, draw_goals

    if protocol not in ("full", "paper"):
        raise TaskError(f"protocol={protocol!r}: expected one of full, paper")
    n = episodes or PAPER_EPISODES
    try:
        return draw_goals(
            VALIDATION_GOALS, n, seed + VALIDATION_SEED_OFFSET, validation_index if protocol == "paper" else 0
        )
    except (TypeError, ValueError) as exc:
        raise TaskError(f"episodes={episodes!r}, seed={seed!r}, validation_index={validation_index!r}: {exc}") from None


def warmup_goals(shop: Any, count: int) -> list[int]:
    """The ``count`` (``optim.sft_games``) training goal indices of ``shop`` the warm-up's expert plays."""
    from pcsd.envs.webshop import draw_goals, train_goal_indices

    return draw_goals(train_goal_indices(shop.num_goals), count, SFT_GOALS_SEED)


@functools.lru_cache(maxsize=8)
def expert_play_lengths(root: str, seed: int, variant: str, count: int) -> tuple[Optional[int], ...]:
    """The steps of the expert's play on each of the warm-up's ``count`` goals of the training shop
    (``root``, seed ``seed``, ``variant``), None for a play it does not win; played once a process
    (the shop's index cache makes the load quick). The expert is deterministic, so its play cut at
    ``env.max_steps`` wins exactly when this length is at most ``env.max_steps``."""
    from pcsd.envs.webshop import WebShop, run_expert, train_goal_indices

    shop = WebShop.load(root, goals="synthetic", seed=seed, variant=variant)
    available = len(train_goal_indices(shop.num_goals))
    if count > available:
        raise LookupError(
            f"optim.sft_games={count}: the warm-up plays distinct training goals, and the shop has {available} "
            f"(expected at most {available})"
        )
    env = shop.env()
    out: list[Optional[int]] = []
    for g in warmup_goals(shop, count):
        actions, reward, done = run_expert(env, g, EXPERT_PLAY_CAP)
        out.append(len(actions) if done and reward == 1.0 else None)
    return tuple(out)


def warmup_steps_problem(cfg: Any) -> Optional[str]:
    """Why the warm-up would have no example (``optim.sft_steps`` > 0): ``env.max_steps`` shorter than
    every play of the expert on the warm-up's goals (naming the least that fits), or no play won at
    all; else None. Plays the expert at config read (:func:`expert_play_lengths`), before the run
    writes anything."""
    if cfg.optim.get("sft_steps", 0) <= 0:
        return None
    count, max_steps = int(cfg.optim.sft_games), int(cfg.env.max_steps)
    warm = f"the warm-up (optim.sft_steps={cfg.optim.sft_steps}) would have no example"
    root = webshop_data_dir(cfg)
    try:
        lengths = expert_play_lengths(root, int(cfg.run.seed), str(cfg.env.webshop_variant), count)
    except LookupError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"env.webshop_data={root}: the warm-up's expert cannot play its training goals ({exc})"
    won = [n for n in lengths if n is not None]
    if not won:
        return (
            f"optim.sft_games={count}: the WebShop expert wins none of the warm-up's {count} goals, so {warm}; "
            "raise optim.sft_games or set optim.sft_steps=0"
        )
    least = min(won)
    if max_steps >= least:
        return None
    return (
        f"env.max_steps={max_steps} is shorter than any episode of the WebShop expert the warm-up imitates (search, "
        f"open the product, its options, buy: the shortest of its {count} plays, optim.sft_games, takes {least} "
        f"steps), so {warm}; raise env.max_steps to at least {least} (verl-agent's WebShop: 15) or set "
        "optim.sft_steps=0"
    )


def webshop_expert_episodes(shop: Any, goals: Sequence[int], max_steps: int) -> list[Any]:
    """One episode of the native WebShop's scripted expert (:meth:`pcsd.envs.webshop.WebShopEnv.
    expert_action`: search with the instruction, open the goal's product, choose its options, buy)
    per goal index of ``shop``, recorded as the agent sees it (verl-agent's text, as the rollouts
    build it): ``task`` the instruction, each step's observation reformatted and its admissible
    ``search[...]`` / ``click[...]`` list; ``won`` = score 1."""
    from pcsd.envs.experts import ExpertEpisode
    from pcsd.text.prompts import format_webshop_observation, webshop_actions, webshop_task

    env = shop.env()
    out = []
    for g in goals:
        obs, info = env.reset(int(g))
        task = webshop_task(obs)
        ep = ExpertEpisode(task=task, task_type="webshop")
        done, reward = False, 0.0
        while not done and len(ep.steps) < max_steps:
            action = env.expert_action()
            if action is None:
                break
            av = info["available_actions"]
            ep.steps.append(
                (
                    format_webshop_observation(obs, task),
                    webshop_actions(av["has_search_bar"], av["clickables"]),
                    action.lower(),
                )
            )
            obs, reward, done, info = env.step(action)
        ep.won = bool(done) and float(reward) == 1.0
        out.append(ep)
    return out


def webshop_pools(kind: EnvKind, shop: Any) -> Pools:
    """The native pools of WebShop sessions on one loaded shop (tasks: its goal indices)."""
    from pcsd.envs.webshop import WebShop

    if not isinstance(shop, WebShop):
        raise ValueError(f"shop: env kind 'webshop' needs shop=<a loaded WebShop>, got {type(shop).__name__}")
    return NativePools(kind, "goals", "one goal index", shop=shop)


class WebShopKind(EnvKind):
    name = "webshop"
    title = "WebShop"
    description = "the native WebShop (goal indices of a loaded shop)"
    prompt = "webshop"
    task_score = "score"
    table = "table1"
    eval_splits = ("webshop",)
    keys = (
        Key("webshop_data", Optional[str], None, "the folder holding data/ and facts/ (null: $WEBSHOP_DATA)"),
        Key(
            "webshop_variant",
            str,
            "verl",
            "verl (verl-agent/SDAR's seeding, the paper's) | upstream",
            ("verl", "upstream"),
        ),
    )

    def check(self, cfg: Any) -> Optional[str]:
        from pcsd.envs.webshop import VALIDATION_GOALS

        if cfg.optim.get("sft_teacher_demos", "same") == "skills":
            return (
                "optim.sft_teacher_demos=skills uses the ALFWorld expert that follows the skills; "
                "env.name=webshop has only the plain expert (expected optim.sft_teacher_demos=same)"
            )
        try:
            webshop_data_dir(cfg)
        except ValueError as exc:
            return str(exc)
        if cfg.eval.episodes > len(VALIDATION_GOALS):
            return (
                f"eval.episodes={cfg.eval.episodes}: WebShop validates on distinct goals drawn from the "
                f"{len(VALIDATION_GOALS)} validation goals; expected at most {len(VALIDATION_GOALS)} (0 = 128)"
            )
        return warmup_steps_problem(cfg)

    def pools(self, options: Optional[Mapping[str, Any]] = None) -> Pools:
        opts = dict(options or {})
        shop = opts.pop("shop", None)
        if opts:
            raise ValueError(f"{next(iter(opts))}: not an option of env kind 'webshop' (its options: shop)")
        return webshop_pools(self, shop)

    def open(self, cfg: Any, run_dir: Path, *, main: bool, barrier: Callable[[], None]) -> EnvRun:
        return WebShopRun(self, cfg)

    # ---- results
    def result_fields(self, games: Sequence[Any]) -> dict[str, Any]:
        n = max(len(games), 1)
        return dict(
            per_category={},
            score=100.0 * sum(float(g.score or 0.0) for g in games) / n,
            acc=100.0 * sum(g.score == 1.0 for g in games) / n,
            counts={},
        )

    def describe_result(self, result: Mapping[str, Any]) -> str:
        return f" (WebShop Score {result['score']:.1f}, Acc {result['acc']:.1f})"

    def summary_fields(self, result: Mapping[str, Any], when: str) -> dict[str, Any]:
        return {f"score_{when}": result["score"], f"acc_{when}": result["acc"]}

    def validation_fields(self, result: Mapping[str, Any]) -> dict[str, Any]:
        return dict(val_score=result["score"], val_acc=result["acc"])

    def step_fields(self, batch: Any) -> dict[str, Any]:
        if batch.score is None:
            return {}
        # this rank's batch: WebShop Score (100 x mean task score)
        return dict(score=100.0 * float(batch.score.mean()), env_errors=batch.env_errors)

    # ---- python -m pcsd.eval
    def add_eval_arguments(self, parser: Any) -> None:
        g = parser.add_argument_group("WebShop (--split webshop)")
        g.add_argument(
            "--webshop-data",
            default=None,
            help="split=webshop: the WebShop folder (default: the run's env.webshop_data, else $WEBSHOP_DATA)",
        )

    def eval_plan(
        self, split: str, args: Any, run_dir: Optional[Path], run_cfg: Mapping[str, Any], out_dir: Path
    ) -> EvalPlan:
        """The validation goals to play (the validation shop, verl-agent's draws)."""
        from pcsd.envs.webshop import VALIDATION_SEED_OFFSET, WebShop, resolve_data_dir

        if args.games_file or args.task_types:
            raise TaskError(
                "games_file / task_types select ALFWorld games; split=webshop plays validation goals "
                "(use --episodes / --count)"
            )
        run_env = run_cfg.get("env", {}) or {}
        try:
            root = resolve_data_dir(args.webshop_data or run_env.get("webshop_data"), "webshop_data")
        except ValueError as exc:
            raise TaskError(str(exc)) from None
        seed = args.draw_seed
        goals = webshop_validation_goals(args.protocol, args.episodes, seed, args.validation_index)
        if args.count:
            goals = goals[: args.count]
        shop = WebShop.load(
            root,
            goals="synthetic",
            seed=seed + VALIDATION_SEED_OFFSET,
            variant=str(run_env.get("webshop_variant") or "verl"),
        )
        # defaults for a model that was not trained on WebShop: 15 steps, prompts of 4,096 tokens
        return EvalPlan(tasks=goals, pools=webshop_pools(self, shop), split=split, max_steps=15, max_prompt_tokens=4096)


class WebShopRun(EnvRun):
    """WebShop's side of a training run: the training shop (seed s) and the validation shop
    (s + 1000); tasks are goal indices of those shops."""

    split = "webshop"

    def __init__(self, kind: WebShopKind, cfg: Any) -> None:
        super().__init__(kind, cfg)
        self.train_shop, self.val_shop = load_shops(cfg)
        self._train, self._eval = webshop_pools(kind, self.train_shop), webshop_pools(kind, self.val_shop)

    @property
    def train_pools(self) -> Pools:
        return self._train

    @property
    def eval_pools(self) -> Pools:
        return self._eval

    def step_tasks(self, step: int, rng: Any, batch: int = 0) -> list[Any]:
        """The step's first batch: draw ``step`` of verl-agent's training manager (the run's task
        sampler is not used); a further batch of ``rollout.dynamic_sampling``: distinct training goals
        from the run's task sampler."""
        if batch == 0:
            return train_goals(self.cfg, self.train_shop, step)
        from pcsd.envs.webshop import train_goal_indices

        return rng.sample(list(train_goal_indices(self.train_shop.num_goals)), int(self.cfg.rollout.tasks_per_step))

    def eval_tasks(self, index: int) -> list[Any]:
        cfg = self.cfg
        return webshop_validation_goals(cfg.eval.protocol, int(cfg.eval.episodes), int(cfg.run.seed), index)

    def warmup(self, count: int, *, skills: Any) -> Warmup:
        goals = warmup_goals(self.train_shop, count)
        return Warmup(webshop_expert_episodes(self.train_shop, goals, self.cfg.env.max_steps))

    def demonstrations(self, episodes: list[Any]) -> list[Any]:
        return [ep for ep in episodes if ep.won]

    def tokenizer_words(self) -> list[str]:
        # every product id one token (as the clickables write them), so that a click copies one
        # token from the action list instead of an id cut digit by digit
        return sorted({a.lower() for a in self.train_shop.product_ids})


WEBSHOP = WebShopKind()
