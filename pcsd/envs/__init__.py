"""Environments: the native ALFWorld engine (:mod:`pcsd.envs.alfworld`, with the task categories of
the paper's Table 1), procedural ALFWorld games from the native generator
(:mod:`pcsd.envs.procedural`), the native WebShop (:mod:`pcsd.envs.webshop`), scripted experts
(:mod:`pcsd.envs.experts`) and the batched env pool (:mod:`pcsd.envs.pool`); any Python text
environment through the protocol of :mod:`pcsd.envs.protocol`, run in worker processes by
:mod:`pcsd.envs.pypool`; every kind by name in :mod:`pcsd.envs.registry`.

Imports only the native module: nothing of ops, text, rollout, eval or train.
"""

from pcsd.envs.alfworld import CATEGORIES, CATEGORY_ORDER, TASK_TYPES, AlfworldGame
from pcsd.envs.webshop import WebShop, WebShopEnv

__all__ = ["AlfworldGame", "CATEGORIES", "CATEGORY_ORDER", "TASK_TYPES", "WebShop", "WebShopEnv"]
