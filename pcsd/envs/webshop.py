"""The native WebShop.

:class:`WebShop` loads the product set the agent setups use (princeton-nlp/WebShop's
``items_shuffle_1000.json`` with its attribute and human-instruction files), builds the search
index in memory and generates the goals exactly as the original does for a seed; :meth:`WebShop.env`
opens a browser session on it (:class:`WebShopEnv`) that behaves like the original's
``WebAgentTextEnv(observation_mode='text')``: same observation text, available actions, action
grammar and no-ops, rewards and done flags, byte for byte (checked on every recorded step of the
original in ``tests/test_webshop.py``). No Java, pyserini, spaCy or Flask: the engine is Rust
(``rust_envpool/src/envs/webshop``); the reward's spaCy nouns come from a table
(``spacy_nouns_1k.json`` beside the catalogue, which ``pcsd-data webshop`` builds, or the shared
``facts/spacy_nouns_1k.json`` made on the original).

Example::

    from pcsd.envs.webshop import WebShop

    shop = WebShop.load(data_dir, goals="synthetic", seed=0, variant="upstream", show_attrs=False)
    env = shop.env()
    obs, info = env.reset(0)   # info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    obs, reward, done, info = env.step("search[red running shoes]")

Where the original raises (``search[<a> ...]``, a bare ``search[<c>]``, a query of more than 1,024
distinct terms, a page whose product a failed search dropped), ``step`` raises
:class:`WebShopStepError` whose message starts with the original's exception type; the env then
holds the state the original holds.

``variant="verl"`` follows the verl-agent / SDAR copy: prices, price bounds and the goal order from
``seed``, and a finished episode resets itself to a weight-sampled goal (the step still returns the
done page; its ``available_actions`` are the new search page's). Randomness the original draws
from Python's global ``random`` after construction (``search[<r>]``, that auto-reset) comes from a
per-env copy of that state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pcsd import _native

if TYPE_CHECKING:  # bound on first use by __getattr__ (the native module loads lazily)
    from pcsd._envpool import WebShopStepError

__all__ = [
    "WebShop",
    "WebShopEnv",
    "WebShopStepError",
    "GOAL_SETS",
    "VARIANTS",
    "run_expert",
    "VALIDATION_GOALS",
    "TRAIN_GOALS_START",
    "VALIDATION_SEED_OFFSET",
    "train_goal_indices",
    "draw_goals",
    "resolve_data_dir",
    "scan_catalogue",
    "json_length",
]

GOAL_SETS = ("synthetic", "human")
VARIANTS = ("upstream", "verl")

log = logging.getLogger("pcsd.envs.webshop")


def _mod() -> Any:
    return _native.require("_envpool")


def __getattr__(name: str) -> Any:
    if name == "WebShopStepError":
        return _mod().WebShopStepError
    raise AttributeError(name)


def _data_folder(data_dir: Any) -> str:
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a str or os.PathLike, got {type(data_dir).__name__}")
    p = Path(os.fspath(data_dir))
    if not p.is_dir():
        raise FileNotFoundError(f"data_dir: expected a folder holding items_shuffle_1000.json, got {p}")
    return str(p)


def _int_arg(name: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


class WebShopEnv:
    """One browser session on a :class:`WebShop` (see the module docs).

    ``reset(goal_index)`` -> ``(obs, info)``; ``info`` holds ``available_actions``
    (``{"has_search_bar": bool, "clickables": [str, ...]}``), ``goal`` (the original's goal dict),
    ``goal_index`` and ``url``. ``step(action)`` -> ``(obs, reward, done, info)``: ``reward`` is the
    int ``0`` for a no-op (as in the original), a float otherwise; on a purchase ``info`` also
    holds ``reward_info`` (the reward's parts).
    """

    __slots__ = {
        "_e": "the native env",
        "reset": """``reset(goal_index=None)`` -> ``(obs, info)``: the search page of goal ``goal_index``
        (``None``: a weight-sampled goal). A bool, a non-int or an index out of range is refused
        with one line naming ``goal_index`` (TypeError / ValueError). The native env's own method,
        bound per env: a reset is one call, with no Python frame of ours around it.""",
    }

    reset: Callable[..., tuple[str, dict[str, Any]]]

    def __init__(self, _native_env: Any) -> None:
        self._e = _native_env
        self.reset = _native_env.reset

    def step(self, action: str) -> tuple[str, Any, bool, dict[str, Any]]:
        """One action. A str that is not valid text (a lone surrogate such as ``"\\ud800"``, which
        has no UTF-8 form) is a ValueError and is not sent to the env, as the env pool reports it
        as that env's error."""
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if not action.isascii():
            try:
                action.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"action is not valid text (UnicodeEncodeError: {exc}); the action was not sent to the env"
                ) from None
        return self._e.step(action)

    def observe(self) -> tuple[str, dict[str, Any]]:
        """The current page as ``(obs, info)`` without acting."""
        return self._e.observe()

    def expert_action(self) -> str | None:
        """The scripted expert's next action: search with the instruction (then with the product's
        title when the 50 hits lack it), open the goal's product, choose the goal's options, buy
        (``None`` on the done page). Reaches reward 1 on ~92% of the synthetic goals in <= 9 steps."""
        return self._e.expert_action()

    @property
    def goal(self) -> dict[str, Any]:
        return self._e.goal

    @property
    def goal_index(self) -> int:
        return self._e.goal_index

    @property
    def instruction_text(self) -> str:
        return self._e.instruction_text

    @property
    def steps(self) -> int:
        """Steps since the last reset (no-ops included)."""
        return self._e.steps

    @property
    def url(self) -> str:
        return self._e.url


class WebShop:
    """One loaded shop: catalogue, search index and goals, shared read-only by its envs."""

    __slots__ = ("_s",)

    def __init__(self, _native_shop: Any) -> None:
        self._s = _native_shop

    @classmethod
    def load(
        cls,
        data_dir: str | os.PathLike[str],
        goals: str = "synthetic",
        seed: int = 0,
        variant: str = "upstream",
        show_attrs: bool = False,
        *,
        num_products: int | None = None,
        nouns: str | os.PathLike[str] | None = None,
        cache: str | os.PathLike[str] | bool | None = None,
    ) -> "WebShop":
        """Loads a shop (the GIL is released while reading and indexing).

        ``data_dir``: the folder holding ``items_shuffle_1000.json``, ``items_ins_v2_1000.json`` and
        ``items_human_ins.json`` (``$WEBSHOP_DATA/data``), or the WebShop root holding ``data/``.
        ``nouns``: the product-name noun table (default: ``spacy_nouns_1k.json`` — ``spacy_nouns.json``
        for the full set — beside the catalogue, else ``facts/spacy_nouns_1k.json`` next to ``data/``). ``goals``: ``"synthetic"`` (6,910 on the 1k set) or ``"human"`` (13).
        ``seed``: ``random.seed(seed)`` before construction (upstream) / the env seed (verl).
        ``num_products``: only the first N products (the original's ``num_products``).
        ``cache``: the index cache (``docs/webshop.md``, "The index cache"): ``None`` follows
        ``$WEBSHOP_CACHE`` (unset: beside the catalogue, or the user's cache folder
        ``~/.cache/pcsd/webshop-index`` when the catalogue's folder is read-only; ``off``: none; else
        that folder), ``False`` builds the shop in memory without a cache, a path uses that folder.
        The first load writes the image of the products, index and nouns; later loads map it.
        A stale, foreign or damaged cache is rebuilt and a folder that cannot take it passed over,
        each with one warning line on the ``pcsd.envs.webshop`` logger; a load never fails for the
        cache's sake.
        """
        folder = _data_folder(data_dir)
        if goals not in GOAL_SETS:
            raise ValueError(f"goals must be one of {GOAL_SETS}, got {goals!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        _int_arg("seed", seed)
        if not isinstance(show_attrs, bool):
            raise TypeError(f"show_attrs must be a bool, got {type(show_attrs).__name__}")
        if num_products is not None:
            _int_arg("num_products", num_products, 1)
        if nouns is not None:
            if not isinstance(nouns, (str, os.PathLike)):
                raise TypeError(f"nouns must be a str or os.PathLike, got {type(nouns).__name__}")
            nouns = os.fspath(nouns)
            if not os.path.isfile(nouns):
                raise FileNotFoundError(f"nouns: expected the noun table file, got {nouns}")
        if cache is None or cache is True:
            policy = os.environ.get("WEBSHOP_CACHE") or None
        elif cache is False:
            policy = "off"
        elif isinstance(cache, (str, os.PathLike)):
            policy = os.fspath(cache)
            if not policy.strip():
                raise ValueError("cache: expected a folder, False or None, got an empty path")
        else:
            raise TypeError(f"cache must be a folder (str or os.PathLike), False or None, got {type(cache).__name__}")
        shop = cls(_mod().WebShop.load(folder, goals, seed, variant, show_attrs, num_products, nouns, policy))
        for note in shop._s.cache_notes:
            log.warning(note)
        return shop

    def env(self) -> WebShopEnv:
        """A new env on this shop (call ``reset`` first)."""
        return WebShopEnv(self._s.env())

    @property
    def num_goals(self) -> int:
        return self._s.num_goals

    @property
    def num_products(self) -> int:
        return self._s.num_products

    @property
    def cache_path(self) -> str | None:
        """The index cache file this shop is mapped from (``None``: built and held in memory)."""
        p = self._s.cache_path
        return None if p is None else os.fspath(p)

    @property
    def cache_hit(self) -> bool:
        """Whether the load came from the index cache (``False``: it built the shop's image)."""
        return self._s.cache_hit

    @property
    def product_ids(self) -> list[str]:
        """Every product's ASIN in catalogue order, as the pages show them (``click[...]`` takes
        them lower-cased)."""
        return self._s.product_ids

    @property
    def show_attrs(self) -> bool:
        return self._s.show_attrs

    @property
    def variant(self) -> str:
        return self._s.variant

    @property
    def goal_set(self) -> str:
        return self._s.goal_set

    @property
    def seed(self) -> int:
        return self._s.seed

    def goal(self, index: int) -> dict[str, Any]:
        """The goal dict of goal ``index`` (the original's keys)."""
        _int_arg("index", index, 0)
        return self._s.goal(index)

    def product_price(self, asin: str) -> float:
        """The price the reward compares with a goal's ``price_upper``."""
        return self._s.product_price(asin)

    def search(self, query: str) -> list[str]:
        """The ASINs a ``search[query]`` lists, best first (``<r>`` uses a fixed seed here)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        return self._s.search(query.lower())

    @property
    def native(self) -> Any:
        """The ``pcsd._envpool.WebShop`` behind this shop (for ``EnvPool("webshop", ...)``)."""
        return self._s


def run_expert(env: WebShopEnv, goal_index: int, max_steps: int = 15) -> tuple[list[str], float, bool]:
    """Plays goal ``goal_index`` with the expert: ``(actions, final reward, done)``."""
    _int_arg("max_steps", max_steps, 1)
    env.reset(goal_index)
    actions: list[str] = []
    reward: float = 0.0
    done = False
    while len(actions) < max_steps and not done:
        a = env.expert_action()
        if a is None:
            break
        actions.append(a)
        _, r, done, _ = env.step(a)
        reward = float(r)
    return actions, reward, done


# ----------------------------------------------------------------------------- the agent setups' goal splits
# verl-agent / ZJU-REAL/SDAR (FACTS.md, "verl-agent / SDAR wrapper"): validation goals are indices
# range(500) of a worker's goal list, training goals range(500, len(goals)); every reset of the
# environment manager draws `RandomState(manager_seed).choice(idxs, env_num, replace=False)` with one
# persistent generator (manager seed env.seed for training, env.seed + 1000 for validation).
VALIDATION_GOALS = range(0, 500)
TRAIN_GOALS_START = 500
VALIDATION_SEED_OFFSET = 1000


def train_goal_indices(num_goals: int) -> range:
    """The training goal indices of a synthetic goal list of ``num_goals`` goals."""
    _int_arg("num_goals", num_goals, TRAIN_GOALS_START + 1)
    return range(TRAIN_GOALS_START, num_goals)


def draw_goals(indices: range | list[int], count: int, seed: int, draw: int = 0) -> list[int]:
    """The goal indices draw number ``draw`` (0 = the first reset) of verl-agent's environment
    manager makes: ``count`` distinct indices from ``indices`` with
    ``numpy.random.RandomState(seed)``, the generator advanced by the ``draw`` earlier draws."""
    import numpy as np

    idxs = list(indices)
    _int_arg("count", count, 1)
    _int_arg("seed", seed, 0)
    _int_arg("draw", draw, 0)
    if count > len(idxs):
        raise ValueError(f"count: expected at most {len(idxs)} goals (the indices to draw from), got {count}")
    rng = np.random.RandomState(seed)
    for _ in range(draw):
        rng.choice(idxs, size=count, replace=False)
    return [int(i) for i in rng.choice(idxs, size=count, replace=False)]


def resolve_data_dir(data_dir: str | os.PathLike[str] | None, arg: str = "data_dir") -> str:
    """The WebShop folder to load: ``data_dir``, else ``$WEBSHOP_DATA``; a folder holding
    ``items_shuffle_1000.json`` itself or in ``data/``. Raises ValueError naming ``arg``."""
    if data_dir is None:
        data_dir = os.environ.get("WEBSHOP_DATA") or None
        if data_dir is None:
            raise ValueError(
                f"{arg}: WebShop needs its data folder: set {arg} or the WEBSHOP_DATA environment "
                "variable to the folder holding data/items_shuffle_1000.json"
            )
    p = Path(os.fspath(data_dir)).expanduser()
    if not ((p / "items_shuffle_1000.json").is_file() or (p / "data" / "items_shuffle_1000.json").is_file()):
        what = "no such folder" if not p.is_dir() else "no items_shuffle_1000.json there or in data/"
        raise ValueError(f"{arg}={p}: {what} (expected the WebShop folder holding data/items_shuffle_1000.json)")
    return str(p)


def scan_catalogue(path: str | os.PathLike[str]) -> tuple[int, list[str]]:
    """``(entries, names)`` of a product file (``items_shuffle*.json``): the number of entries of
    its JSON array and the distinct product names in file order, streamed by the native reader (the
    1.18 M-product file is never held as JSON values). Raises ValueError when it does not parse."""
    return _mod().webshop_scan_products(os.fspath(path))


def json_length(path: str | os.PathLike[str]) -> int:
    """The number of entries of the JSON array or object in ``path``, streamed (ValueError when it
    does not parse)."""
    return _mod().webshop_json_length(os.fspath(path))
