"""The built-in environment kinds, one module each (:mod:`pcsd.envs.kind` says what a kind owns):

* :mod:`pcsd.envs.kinds.alfworld`: ``alfworld``, the native ALFWorld engine on procedural games or
  the dataset's game files (the default kind); ``dummy``, the native pool's test game;
* :mod:`pcsd.envs.kinds.webshop`: ``webshop``, the native WebShop (goal indices of a loaded shop);
* :mod:`pcsd.envs.kinds.text`: ``gym``, ``textarena``, ``openenv``, Python text environments in
  worker processes (:mod:`pcsd.envs.pypool`).

:data:`BUILTIN` is what :mod:`pcsd.envs.registry` registers, in this order (the first is the
default).
"""

from __future__ import annotations

from pcsd.envs.kind import EnvKind
from pcsd.envs.kinds.alfworld import ALFWORLD, DUMMY
from pcsd.envs.kinds.text import GYM, OPENENV, TEXTARENA
from pcsd.envs.kinds.webshop import WEBSHOP

__all__ = ["BUILTIN"]

#: the built-in kinds, the default first
BUILTIN: tuple[EnvKind, ...] = (ALFWORLD, WEBSHOP, DUMMY, GYM, TEXTARENA, OPENENV)
