"""One home per environment kind (issue 30, part 1): the training job and ``pcsd.eval`` hold a kind
object and name no kind (read from the sources with ``ast``: no string that is a kind's name, no
identifier or imported module with a kind's name as a word); config choices come from the
registry; both pools implement the one pool protocol."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pcsd.envs import registry

PKG = Path(__file__).resolve().parents[1] / "pcsd"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def kind_names_in(source: str, names: set[str]) -> list[str]:
    """Where ``source`` names a kind of ``names``: a string constant equal to one (a docstring is
    prose), or an identifier, attribute, argument or imported module with one as a word
    (``webshop_expert_episodes``, ``job.webshop``, ``pcsd.envs.webshop``)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    words = re.compile(r"(?:^|[._])(" + "|".join(map(re.escape, sorted(names))) + r")(?:$|[._])", re.I)
    hits: list[str] = []

    def word(text: str, where: str, node: ast.AST) -> None:
        if words.search(text):
            hits.append(f"line {getattr(node, 'lineno', '?')}: {where} {text!r}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value.strip().lower() in names:
                hits.append(f"line {node.lineno}: string {node.value!r}")
        elif isinstance(node, ast.Name):
            word(node.id, "name", node)
        elif isinstance(node, ast.Attribute):
            word(node.attr, "attribute", node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            word(node.name, "definition", node)
        elif isinstance(node, ast.arg):
            word(node.arg, "argument", node)
        elif isinstance(node, ast.keyword) and node.arg:
            word(node.arg, "keyword", node)
        elif isinstance(node, ast.ImportFrom):
            word(node.module or "", "import", node)
            for a in node.names:
                word(a.name, "import", node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                word(a.name, "import", node)
    return hits


def test_the_job_and_the_evaluation_name_no_env_kind():
    names = set(registry.available())
    assert {"alfworld", "webshop", "gym", "textarena", "openenv", "dummy"} <= names
    bad = []
    for layer in ("train", "eval"):
        for path in sorted((PKG / layer).rglob("*.py")):
            bad += [f"{path.relative_to(PKG.parent)} {h}" for h in kind_names_in(path.read_text(), names)]
    assert not bad, "env kinds named outside pcsd/envs:\n" + "\n".join(bad)


def test_the_check_finds_what_it_looks_for():
    names = {"alfworld", "webshop", "gym"}
    src = '''"""Docs may say alfworld."""
from pcsd.envs.webshop import draw_goals
from pcsd.train import webshop_thing
x = cfg.env.name == "webshop"
def f(job):
    """ALFWorld and gym, in prose."""
    return job.webshop or job.gymnasium_like or "alfworld-qwen2.5-3b"
'''
    hits = kind_names_in(src, names)
    assert len(hits) == 4, hits  # the import path, the imported name, the string, the attribute
    assert kind_names_in('"""gym"""\ny = "a gym"\nz = gymnasium\n', names) == []


def test_config_choices_come_from_the_registry():
    from pcsd.train.config import CHOICES, EnvConfig, valid_keys

    assert CHOICES["env.name"] == registry.choices() and "dummy" not in CHOICES["env.name"]
    assert EnvConfig().name == registry.default().name
    keys = set(valid_keys())
    for kind in registry.kinds():
        for k in kind.keys:
            assert k.dotted in keys, k
            if k.choices:
                assert CHOICES[k.dotted] == k.choices


def test_every_pool_is_the_one_pool_protocol(tmp_path):
    from pcsd.envs.kind import Pool
    from pcsd.envs.protocol import EnvFactory
    from pcsd.envs.pypool import PythonEnvPool

    native = registry.get("dummy").pools({"episode_len": 2}).make(4, 2, 2, max_steps=5, num_threads=1, seed=0)
    with native:
        assert isinstance(native, Pool) and len(native.reset()) == 4
    factory = EnvFactory("pcsd.envs.toy:DirectionEnv", kwargs={"episode_len": 2})
    py = registry.get("gym").pools({"make_env": factory}).make(2, 2, [7], max_steps=5, num_threads=1, seed=0)
    with py:
        assert isinstance(py, PythonEnvPool) and isinstance(py, Pool)
        b = py.reset()
        assert b.privileged == ["", ""] and b.obs[0] == b.obs[1]


@pytest.mark.parametrize(
    "name,options,what",
    [
        ("dummy", {"episode_length": 2}, "episode_length: not an option of env kind 'dummy'"),
        ("gym", {}, "make_env: env kind 'gym' needs"),
        ("gym", {"make_env": print, "shop": 1}, "shop: not an option of env kind 'gym'"),
        ("webshop", {"shop": None}, "shop: env kind 'webshop' needs shop=<a loaded WebShop>"),
        ("alfworld", {"shop": 1}, "shop: env kind 'alfworld' takes no pool options"),
    ],
)
def test_pool_options_are_typed_once(name, options, what):
    with pytest.raises(ValueError) as ei:
        registry.get(name).pools(options)
    assert str(ei.value).startswith(what) and "\n" not in str(ei.value)


def test_a_kind_is_registered_once_and_checked():
    from pcsd.envs.kind import EnvKind, Key

    class Twice(EnvKind):
        name = "alfworld"

    with pytest.raises(ValueError, match="registered already"):
        registry.register(Twice())

    class Clash(EnvKind):
        name = "clash-kind"
        keys = (Key("source", str, "files"),)

    with pytest.raises(ValueError, match="env.source: env kind 'clash-kind' declares it unlike 'alfworld'"):
        registry.register(Clash())
    assert "clash-kind" not in registry.available()


def test_every_table_reports_env_errors_and_prompt_overflows():
    """The notes under each kind's table count the episodes an env error or an over-long prompt
    ended, with the first error's message (issue 30, part 3: the Python envs' table had no
    overflow note, and no table said anything of env errors)."""
    from pcsd.eval import CATEGORIES
    from pcsd.eval.run import EvalResult, GameResult, render_table

    def games(tt: str, score=None) -> list:
        cat = CATEGORIES.get(tt, tt)
        return [
            GameResult("g0", tt, cat, False, 2, 0, score=score, env_error="env 0: boom"),
            GameResult("g1", tt, cat, False, 3, 0, score=score, prompt_overflow=True),
            GameResult("g2", tt, cat, True, 1, 0, score=score),
        ]

    rows = [
        EvalResult("A", "valid_seen", games("pick_and_place_simple"), env="alfworld"),
        EvalResult("A", "webshop", games("webshop", 0.5), env="webshop"),
        EvalResult("A", "gym my:Env", games("count", 1.0), env="gym"),
    ]
    for r in rows:
        d = r.to_dict()
        assert d["env_errors"] == 1 and d["prompt_overflows"] == 1 and d["games"][0]["env_error"] == "env 0: boom"
    md = render_table(rows)
    tables = md.split("| **Method** |")[1:]
    assert len(tables) == 2  # Table 1 (ALFWorld with WebShop's columns), and the Python envs'
    for t in tables:
        assert "Episodes ended unwon because a prompt exceeded the token budget" in t
        assert "Episodes ended unwon by an env error: " in t and "(first: env 0: boom)" in t
    assert render_table([EvalResult("B", "valid_seen", games("look_at_obj_in_light")[2:])]).count("Episodes ended") == 0


# ----------------------------------------------------------------------------- issue 42
def test_the_native_kinds_build_their_pools_one_way(webshop_data):
    """ALFWorld's, WebShop's and the test game's pools come from one builder (NativePools): the
    tasks go to the native pool as the kind's task argument, one per group, a count refused where
    the kind needs tasks."""
    from pcsd.envs.kind import NativePools
    from pcsd.envs.webshop import WebShop

    dummy = registry.get("dummy").pools({"episode_len": 2})
    assert type(dummy) is NativePools and dummy.options == {"episode_len": 2}
    alf = registry.get("alfworld").pools()
    webshop = registry.get("webshop").pools({"shop": WebShop.load(webshop_data, goals="synthetic", seed=0)})
    assert type(alf) is type(webshop) is NativePools
    for pools, what in ((alf, "one game"), (webshop, "one goal index")):
        with pytest.raises(
            ValueError, match=f"games: env kind '{pools.kind.name}' needs {what} per group, got a count"
        ):
            pools.make(2, 2, 1, max_steps=3, num_threads=1, seed=0)
    with webshop.make(4, 2, [3, 5], max_steps=3, num_threads=1, seed=0) as pool:
        b = pool.reset()
        assert len(b) == 4 and b.obs[0] == b.obs[1] and b.obs[0] != b.obs[2]
        assert pool.task_of(0)[1] == pool.task_of(1)[1] != pool.task_of(2)[1]


def test_alfworld_pools_play_the_games_they_are_given(tmp_path):
    from pcsd.envs.procedural import write_games

    games = write_games(tmp_path / "games", 2, 7)
    with registry.get("alfworld").pools().make(4, 2, games, max_steps=3, num_threads=1, seed=0) as pool:
        b = pool.reset()
        assert b.obs[0] == b.obs[1] and [pool.task_of(e)[1] for e in (0, 2)] != [""] * 2


def test_step_tasks_draw_every_training_task():
    """The default draw of an RL step's tasks reaches the last task of the list too (a draw from
    range(len - 1) never would), and follows the run's task sampler."""
    import random
    from types import SimpleNamespace

    from pcsd.envs.kind import EnvKind, EnvRun

    run = EnvRun(EnvKind(), SimpleNamespace(rollout=SimpleNamespace(tasks_per_step=4)))
    run.train_tasks = ["a", "b", "c"]
    rng = random.Random(0)
    drawn = [t for step in range(30) for t in run.step_tasks(step, rng)]
    assert set(drawn) == {"a", "b", "c"} and len(drawn) == 120
    ref = random.Random(0)
    assert drawn[:4] == [run.train_tasks[ref.randrange(3)] for _ in range(4)]


def test_text_envs_evaluate_on_seeds_above_every_training_and_warm_up_seed(monkeypatch):
    """The evaluation seeds of a Python env (the trainer's, before and after RL, and pcsd.eval's
    --split env) are EVAL_SEED_BASE + i: never a seed training or the warm-up plays."""
    import random
    from argparse import Namespace

    from omegaconf import OmegaConf

    from pcsd.envs.kinds.text import EVAL_SEED_BASE, SFT_SEED_BASE, TRAIN_SEEDS, eval_seeds, sft_seeds, train_seeds
    from pcsd.train.config import load_config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    cfg = load_config(
        ["env.name=gym", "env.entry_point=textenv_secret:SecretDoor", "eval.episodes=3", "env.num_threads=1"]
    )
    kind = registry.get("gym")
    run = kind.open(cfg, Path("."), main=True, barrier=lambda: None)
    try:
        want = [EVAL_SEED_BASE, EVAL_SEED_BASE + 1, EVAL_SEED_BASE + 2]
        assert run.eval_tasks(0) == run.eval_tasks(5) == eval_seeds(3) == want
        assert max(run.train_tasks) < TRAIN_SEEDS <= SFT_SEED_BASE <= min(sft_seeds(cfg.optim.sft_games))
        assert max(sft_seeds(10_000)) < EVAL_SEED_BASE and train_seeds(70)[-1] == 69
        args = Namespace(env=None, episodes=0, count=0, protocol="full", games_file=None, task_types=None)
        run_cfg = OmegaConf.to_container(cfg, resolve=True)
        plan = kind.eval_plan("env", args, None, run_cfg, Path("."))
        assert plan.tasks == want  # pcsd.eval evaluates on the trainer's seeds
        with plan.pools.make(2, 1, plan.tasks[:2], max_steps=2, num_threads=1, seed=0) as pool:
            # the door of each evaluation env is the one its seed draws: the seeds reach the envs
            secrets = pool.reset().privileged
        assert secrets == [f"door {random.Random(s).randrange(3) + 1} leads out" for s in want[:2]]
    finally:
        run.close()
