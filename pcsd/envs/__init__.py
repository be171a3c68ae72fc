"""Environments: the native ALFWorld engine (:class:`AlfworldGame`), the native WebShop
(:class:`WebShop`, in :mod:`pcsd.envs.webshop`) and the batched env pool."""

from pcsd.envs.alfworld import TASK_TYPES, AlfworldGame
from pcsd.envs.webshop import WebShop, WebShopEnv

__all__ = ["AlfworldGame", "TASK_TYPES", "WebShop", "WebShopEnv"]
