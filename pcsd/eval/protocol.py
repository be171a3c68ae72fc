"""Which episodes an evaluation plays: the two protocols, the stratified subset, the 95 % interval.

* ``full`` (the default of ``python -m pcsd.eval``): every game of the split once, sorted order,
  fixed seeds (:func:`pcsd.eval.games.split_games`). ``episodes=N`` keeps a stratified subset
  (:func:`stratified_subset`: every category keeps its share) instead of the first N sorted games.
* ``paper``: 128 episodes drawn the way the GiGPO / verl-agent setup (and its fork ZJU-REAL/SDAR,
  whose scripts the paper follows) draws its validation episodes; see ``docs/eval-protocol.md``.
  There, validation environment ``i`` (``i = 0..127``) is a TextWorld batch env of one game over the
  whole split, seeded with ``env.seed + 1000 + i``; seeding shuffles the split's game list with
  ``numpy.random.RandomState(seed)`` and TextWorld's ``shuffled_cycle`` then yields that order, and
  a new shuffle (same generator) after each full pass. Every validation run resets each
  environment once, so validation ``v`` (0 = before training) plays element ``v`` of that stream.
  Environments are independent, so the 128 episodes are drawn with replacement.
  :func:`paper_episodes` reproduces this draw exactly for a given game list order.

Both report Overall with a 95 % Wilson score interval (:func:`wilson_interval`).
"""

from __future__ import annotations

import math
import random
from typing import Iterator, Sequence

from pcsd.eval.games import EvalError, game_task_type

__all__ = [
    "PROTOCOLS",
    "PAPER_EPISODES",
    "VALIDATION_SEED_OFFSET",
    "paper_episodes",
    "stratified_subset",
    "wilson_interval",
    "protocol_games",
    "webshop_validation_goals",
]

PROTOCOLS = ("full", "paper")
PAPER_EPISODES = 128  # data.val_batch_size in verl-agent's / SDAR's ALFWorld scripts
VALIDATION_SEED_OFFSET = 1000  # verl-agent seeds its validation envs with env.seed + 1000 (+ i)


def _shuffled_cycle(elements: list, rng) -> Iterator:
    """TextWorld's ``textworld.gym.envs.utils.shuffled_cycle``: the elements in order, then
    reshuffled with ``rng`` before every further pass."""
    yield from elements
    while True:
        rng.shuffle(elements)
        yield from elements


def paper_episodes(
    games: Sequence[str], episodes: int = PAPER_EPISODES, seed: int = 0, validation_index: int = 0
) -> list[str]:
    """The ``episodes`` games verl-agent's validation run number ``validation_index`` plays, for
    ``env.seed = seed`` and the split's game list ``games`` (in the order its loader lists them).

    Environment ``i`` is seeded with ``seed + 1000 + i``: ``RandomState(s).shuffle`` of a copy of
    the list, then :func:`_shuffled_cycle` with the same generator; validation ``v`` takes the
    ``v``-th game of that stream."""
    import numpy as np

    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise EvalError(f"episodes={episodes!r}: expected a positive int")
    if isinstance(validation_index, bool) or not isinstance(validation_index, int) or validation_index < 0:
        raise EvalError(f"validation_index={validation_index!r}: expected a non-negative int")
    if not games:
        raise EvalError("games is empty: nothing to draw from")
    out = []
    for i in range(episodes):
        rng = np.random.RandomState(seed + VALIDATION_SEED_OFFSET + i)
        order = list(games)
        rng.shuffle(order)  # TextworldBatchGymEnv.seed
        stream = _shuffled_cycle(order, rng)
        for _ in range(validation_index):
            next(stream)
        out.append(next(stream))
    return out


def stratified_subset(games: Sequence[str], count: int, seed: int = 0) -> list[str]:
    """``count`` of ``games`` with every task type keeping its share (largest remainders), the games
    of a type picked with ``random.Random(seed)``; the list's order is kept. ``count`` >= the list's
    length returns it whole."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise EvalError(f"count={count!r}: expected a positive int")
    if count >= len(games):
        return list(games)
    by_type: dict[str, list[int]] = {}
    for i, g in enumerate(games):
        by_type.setdefault(game_task_type(g), []).append(i)
    quota = {t: count * len(ix) / len(games) for t, ix in by_type.items()}
    take = {t: int(math.floor(q)) for t, q in quota.items()}
    left = count - sum(take.values())
    for t in sorted(quota, key=lambda t: (-(quota[t] - take[t]), t))[:left]:
        take[t] += 1
    rng = random.Random(seed)
    keep: set[int] = set()
    for t in sorted(by_type):
        keep.update(rng.sample(by_type[t], take[t]))
    return [g for i, g in enumerate(games) if i in keep]


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate, in percent: ``(low, high)``."""
    if n <= 0:
        return (0.0, 100.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (100.0 * max(0.0, mid - half), 100.0 * min(1.0, mid + half))


def protocol_games(
    games: Sequence[str], protocol: str, episodes: int = 0, seed: int = 0, validation_index: int = 0
) -> list[str]:
    """The episodes of one evaluation: ``full`` every game (or a stratified subset of ``episodes``),
    ``paper`` ``episodes`` (default 128) drawn as :func:`paper_episodes` does."""
    if protocol == "full":
        return stratified_subset(games, episodes, seed) if episodes else list(games)
    if protocol == "paper":
        return paper_episodes(games, episodes or PAPER_EPISODES, seed, validation_index)
    raise EvalError(f"protocol={protocol!r} is unknown: expected one of {', '.join(PROTOCOLS)}")


def webshop_validation_goals(protocol: str, episodes: int = 0, seed: int = 0, validation_index: int = 0) -> list[int]:
    """The WebShop goal indices (of the validation shop, seed ``seed + 1000``) validation number
    ``validation_index`` plays: ``episodes`` (0 = 128) distinct goals of ``range(500)`` drawn with
    ``RandomState(seed + 1000)`` as verl-agent's validation manager draws them; ``paper`` takes
    draw ``validation_index`` of that generator, ``full`` always draw 0 (fixed goals). See
    :mod:`pcsd.train.webshop` for how this maps verl-agent's per-worker seeds onto one shop."""
    from pcsd.envs.webshop import VALIDATION_GOALS, VALIDATION_SEED_OFFSET, draw_goals

    if protocol not in PROTOCOLS:
        raise EvalError(f"protocol={protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    n = episodes or PAPER_EPISODES
    try:
        return draw_goals(
            VALIDATION_GOALS, n, seed + VALIDATION_SEED_OFFSET, validation_index if protocol == "paper" else 0
        )
    except (TypeError, ValueError) as exc:
        raise EvalError(f"episodes={episodes!r}, seed={seed!r}, validation_index={validation_index!r}: {exc}") from None
