"""Playing the evaluation games and reporting them: per-game results, success per category and
Overall (:func:`evaluate`, which the trainer calls before and after RL too), and the markdown table
in the layout of the paper's Table 1 (:func:`render_table`).

WebShop (``env="webshop"``): the "games" are goal indices of one shop; each result carries the
episode's task score ``q`` (the purchase reward, 0 without a purchase), and the report gives the
paper's Score = 100 x mean ``q`` and Acc = 100 x share of episodes with ``q == 1`` (appendix,
eq. ``webshop_metrics``), in Table 1's WebShop columns next to ALFWorld's.

Python text environments (``env="gym"``, ...; :mod:`pcsd.envs.registry`): the "games" are reset
seeds, each result carries the episode's summed reward as its ``score``, and the report gives
Success (% of episodes won: the env's ``info["won"]``, else the reward threshold) and the mean
reward, in a table of their own under Table 1's."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from pcsd.envs.alfworld import CATEGORIES, CATEGORY_ORDER
from pcsd.eval.games import DEFAULT_SEED, EvalError, game_seed


# ----------------------------------------------------------------------------- results
@dataclass
class GameResult:
    game: str  # path of the game file
    task_type: str  # ALFWorld task type
    category: str  # the paper's column name
    won: bool
    steps: int  # environment actions taken
    seed: int  # sampling seed of the batch the game was played in
    actions: list[str] = field(default_factory=list)  # the actions sent to the game, in order
    score: Optional[float] = (
        None  # WebShop: the task score q in [0, 1]; a Python env's summed reward; None for ALFWorld
    )
    # the episode ended (unwon) because a prompt exceeded max_prompt_tokens even without history
    prompt_overflow: bool = False


@dataclass
class EvalResult:
    """One row of the table: a model evaluated on one fixed list of games."""

    label: str
    split: str
    games: list[GameResult]
    settings: dict[str, Any] = field(default_factory=dict)
    env: str = "alfworld"  # alfworld | webshop | a Python env kind (gym, ...)

    @property
    def table1(self) -> bool:
        """ALFWorld's categories (and WebShop's Score/Acc) are Table 1's columns; other envs get
        Success and mean reward."""
        return self.env in ("alfworld", "webshop")

    @property
    def mean_reward(self) -> Optional[float]:
        """A Python env's mean summed reward per episode (None for ALFWorld and WebShop)."""
        if self.table1:
            return None
        return sum(float(g.score or 0.0) for g in self.games) / max(len(self.games), 1)

    def counts(self) -> dict[str, int]:
        if self.env != "alfworld":
            return {}
        out = {c: 0 for c in CATEGORY_ORDER}
        for g in self.games:
            out[g.category] += 1
        return out

    @property
    def score(self) -> Optional[float]:
        """WebShop's Score: 100 x the mean task score (None for ALFWorld)."""
        if self.env != "webshop":
            return None
        return 100.0 * sum(float(g.score or 0.0) for g in self.games) / max(len(self.games), 1)

    @property
    def acc(self) -> Optional[float]:
        """WebShop's Acc: 100 x the share of episodes with task score 1 (None for ALFWorld)."""
        if self.env != "webshop":
            return None
        return 100.0 * sum(g.score == 1.0 for g in self.games) / max(len(self.games), 1)

    def per_category(self) -> dict[str, Optional[float]]:
        """Success rate (%) per paper category; None for a category with no games."""
        if self.env != "alfworld":
            return {}
        won = {c: 0 for c in CATEGORY_ORDER}
        for g in self.games:
            won[g.category] += int(g.won)
        n = self.counts()
        return {c: (100.0 * won[c] / n[c] if n[c] else None) for c in CATEGORY_ORDER}

    @property
    def overall(self) -> float:
        """Instance-level success rate (%) over all games (the paper's Overall)."""
        if not self.games:
            return 0.0
        return 100.0 * sum(g.won for g in self.games) / len(self.games)

    @property
    def overall_ci95(self) -> tuple[float, float]:
        """95 % Wilson score interval of Overall (%): how much two runs can differ by chance."""
        from pcsd.eval.protocol import wilson_interval

        return wilson_interval(sum(g.won for g in self.games), len(self.games))

    @property
    def prompt_overflows(self) -> int:
        """Episodes ended (unwon) by a prompt over the token budget."""
        return sum(g.prompt_overflow for g in self.games)

    def to_dict(self) -> dict[str, Any]:
        extra = (
            dict(score=self.score, acc=self.acc)
            if self.env == "webshop"
            else {}
            if self.table1
            else dict(mean_reward=self.mean_reward)
        )
        return dict(
            label=self.label,
            split=self.split,
            env=self.env,
            overall=self.overall,
            overall_ci95=list(self.overall_ci95),
            per_category=self.per_category(),
            **extra,
            counts=self.counts(),
            episodes=len(self.games),
            prompt_overflows=self.prompt_overflows,
            settings=self.settings,
            games=[asdict(g) for g in self.games],
        )


# ----------------------------------------------------------------------------- playing
def play_games(
    backend,
    builder,
    games: Sequence[str],
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
    env: str = "alfworld",
    env_options: Optional[dict] = None,
) -> list[GameResult]:
    """Plays every game once (one episode each) and returns the results in the order of ``games``.

    Args:
        temperature: sampling temperature; 0 = greedy.
        skills: the student sees the skills (the starred variants of Table 1).
        batch_size: games played together (0 = all); see the module notes on seeds.
        progress: ``progress(done_games, total_games)`` after every turn.
        env: ``alfworld`` (``games`` are game files), ``webshop`` (``games`` are goal indices of
            the shop in ``env_options["shop"]``) or a Python env kind (``games`` are reset seeds,
            ``env_options`` the pool's: ``make_env``, ``success_threshold``, ...).
    """
    from pcsd.envs.registry import get as get_env
    from pcsd.rollout.loop import collect_rollouts

    if not games:
        raise EvalError("games is empty: nothing to evaluate")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise EvalError(f"batch_size={batch_size!r}: expected a non-negative int (0 = all games at once)")
    if temperature < 0:
        raise EvalError(f"temperature={temperature}: expected >= 0 (0 = greedy)")
    keeps_score = get_env(env).task_score == "score"
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
            env_kind=env,
            env_options=env_options,
        )
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
                    category=CATEGORIES.get(tt, tt),
                    won=bool(rb.won[i]),
                    steps=int(rb.length[i]),
                    seed=s,
                    actions=acts[i],
                    score=q,
                    prompt_overflow=bool(rb.prompt_overflow[i]),
                )
            )
    return results


def evaluate(
    backend,
    builder,
    games: Sequence[str],
    cfg,
    seed: int = DEFAULT_SEED,
    *,
    label: str = "",
    split: str = "",
    progress=None,
    env_options: Optional[dict] = None,
) -> dict[str, Any]:
    """The trainer's evaluation (before and after RL): every game once, fixed order and seed, with
    ``cfg.eval`` settings. Returns the :class:`EvalResult` as a dict (``overall``, ``per_category``,
    per-game ``games``) plus ``per_task`` (success by ALFWorld task type). ``cfg.env.name=webshop``:
    ``games`` are goal indices of ``env_options["shop"]`` and the dict also holds ``score``/``acc``."""
    from pcsd.models import eos_id

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
        env=str(cfg.env.get("name", "alfworld")),
        env_options=env_options,
    )
    er = EvalResult(
        label=label,
        split=split,
        games=res,
        env=str(cfg.env.get("name", "alfworld")),
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


def render_text_env_table(rows: Sequence[dict]) -> str:
    """The table of Python text environments: one row per evaluation, Success (%) and the mean
    summed reward, a section row per environment."""
    lines = ["| **Method** | **Success** | **Mean reward** |", "|:---|---:|---:|"]
    envs: list[str] = []
    for r in rows:
        if r["split"] not in envs:
            envs.append(r["split"])
    notes = []
    for sp in envs:
        lines.append(f"| *{sp}* | | |")
        group = [r for r in rows if r["split"] == sp]
        for r in group:
            lines.append(f"| {r['label'] or 'model'} | {_fmt(r['overall'])} | {r['mean_reward']:.3f} |")
        s = group[0].get("settings", {})
        lo, hi = group[0].get("overall_ci95") or _wilson_of(group[0])
        notes.append(
            f"{sp}: {group[0]['episodes']} episodes on fixed evaluation seeds, each once, {_how(s)}, seed "
            f"{s.get('seed')}; Success = % of episodes won (info['won'], else summed reward >= the success "
            f"threshold), 95 % Wilson interval of the first row [{lo:.1f}, {hi:.1f}]"
        )
    return "\n".join(lines) + "\n\n" + "; ".join(notes) + ".\n"


# ----------------------------------------------------------------------------- the table
def _fmt(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.1f}"


def render_table(results: Sequence[EvalResult | dict]) -> str:
    """Markdown in the layout of the paper's Table 1: one row per method, the six ALFWorld category
    columns and Overall (success %, one decimal); a section row per split, like the paper's
    per-backbone rows. ``–``: no game of that category was evaluated. With WebShop results the
    table also has Table 1's two WebShop columns, Score and Acc, left of ALFWorld's: a WebShop
    result shares the row of the ALFWorld result with the same label (else it gets its own row)."""
    rows = [r.to_dict() if isinstance(r, EvalResult) else r for r in results]
    tx = [r for r in rows if r.get("env", "alfworld") not in ("alfworld", "webshop")]
    if tx:  # Python text environments: a table of their own, under Table 1's
        rest = [r for r in rows if r not in tx]
        return (render_table(rest) + "\n" if rest else "") + render_text_env_table(tx)
    ws = [r for r in rows if r.get("env") == "webshop"]
    al = [r for r in rows if r.get("env") != "webshop"]
    head = ["Method", *(["Score", "Acc"] if ws else []), *CATEGORY_ORDER, "Overall"]
    lines = [
        "| " + " | ".join(f"**{h}**" for h in head) + " |",
        "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    used: set[int] = set()

    def webshop_cells(label: str) -> list[str]:
        if not ws:
            return []
        for i, w in enumerate(ws):
            if i not in used and (w["label"] or "model") == label:
                used.add(i)
                return [_fmt(w["score"]), _fmt(w["acc"])]
        return ["–", "–"]

    splits: list[str] = []
    for r in al:
        if r["split"] not in splits:
            splits.append(r["split"])
    for sp in splits:
        if sp:
            lines.append("| " + " | ".join([f"*{sp}*"] + [""] * (len(head) - 1)) + " |")
        for r in al:
            if r["split"] != sp:
                continue
            label = r["label"] or "model"
            cells = [label] + webshop_cells(label) + [_fmt(r["per_category"][c]) for c in CATEGORY_ORDER]
            cells.append(_fmt(r["overall"]))
            lines.append("| " + " | ".join(cells) + " |")
    rest = [w for i, w in enumerate(ws) if i not in used]
    if rest and al:
        lines.append("| " + " | ".join(["*WebShop*"] + [""] * (len(head) - 1)) + " |")
    for w in rest:
        lines.append(
            "| "
            + " | ".join([w["label"] or "model", _fmt(w["score"]), _fmt(w["acc"])] + ["–"] * (len(CATEGORY_ORDER) + 1))
            + " |"
        )
    notes, cis = [], []
    for sp in splits:
        r = next(r for r in al if r["split"] == sp)
        n = ", ".join(f"{c} {r['counts'][c]}" for c in CATEGORY_ORDER)
        s = r.get("settings", {})
        how = _how(s)
        if s.get("protocol") == "paper":
            drawn = (
                f"drawn with replacement as verl-agent validates (protocol paper, validation "
                f"{s.get('validation_index', 0)}, draw seed {s.get('draw_seed', 0)})"
            )
            notes.append(f"{sp or 'games'}: {r['episodes']} episodes ({n}); {drawn}, {how}, seed {s.get('seed')}")
        else:
            notes.append(f"{sp or 'games'}: {r['episodes']} games ({n}); each once, {how}, seed {s.get('seed')}")
    for r in al:
        lo, hi = r.get("overall_ci95") or _wilson_of(r)
        where = f" ({r['split']})" if len(splits) > 1 else ""
        cis.append(f"{r['label'] or 'model'}{where} [{lo:.1f}, {hi:.1f}]")
    if ws:
        s = ws[0].get("settings", {})
        which = (
            "fixed goals (draw 0)"
            if s.get("protocol") != "paper"
            else f"validation {s.get('validation_index', 0)}'s draw"
        )
        notes.append(
            f"WebShop: {ws[0]['episodes']} episodes on distinct validation goals of the seed "
            f"{s.get('draw_seed', 0)} + 1000 shop, {which}, {_how(s)}, seed {s.get('seed')}; "
            f"Score = 100 x mean task score, Acc = % of episodes with score 1"
        )
        for w in ws:
            lo, hi = w.get("overall_ci95") or _wilson_of(w)
            cis.append(f"{w['label'] or 'model'} (WebShop Acc) [{lo:.1f}, {hi:.1f}]")
    what = "Success rate (%). " if al else ""
    cut = [
        f"{r['label'] or 'model'} ({r.get('split') or r.get('env')}) {r['prompt_overflows']}"
        for r in rows
        if r.get("prompt_overflows")
    ]
    over = (
        (
            "Episodes ended unwon because a prompt exceeded the token budget even without history: "
            + "; ".join(cut)
            + " (raise rollout.max_prompt_tokens / --max-prompt-tokens).\n"
        )
        if cut
        else ""
    )
    return (
        "\n".join(lines)
        + "\n\n"
        + what
        + "; ".join(notes)
        + ". * = skills at evaluation.\n"
        + ("Overall" if al else "Acc")
        + ", 95 % Wilson interval: "
        + "; ".join(cis)
        + ".\n"
        + over
    )


def _how(settings: dict) -> str:
    temp = settings.get("temperature")
    return "greedy" if temp == 0 else f"temperature {temp}"


def _wilson_of(r: dict) -> tuple[float, float]:
    from pcsd.eval.protocol import wilson_interval

    n = int(r.get("episodes", 0))
    return wilson_interval(int(round(r["overall"] * n / 100.0)), n)
