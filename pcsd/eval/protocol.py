"""Which episodes an evaluation plays: the two protocols (``full``, ``paper``: verl-agent's
validation draws), the stratified subset and the 95 % interval (``docs/eval-protocol.md``). The
draws over game files live with the ALFWorld kind (:mod:`pcsd.envs.games`), the interval with the
tables (:mod:`pcsd.envs.tables`); re-exported here."""

from __future__ import annotations

from pcsd.envs.games import (
    PAPER_EPISODES,
    PROTOCOLS,
    VALIDATION_SEED_OFFSET,
    paper_episodes,
    protocol_games,
    stratified_subset,
)
from pcsd.envs.tables import wilson_interval

__all__ = [
    "PROTOCOLS",
    "PAPER_EPISODES",
    "VALIDATION_SEED_OFFSET",
    "paper_episodes",
    "stratified_subset",
    "wilson_interval",
    "protocol_games",
]
