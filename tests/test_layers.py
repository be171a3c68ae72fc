"""The package's layering (``pcsd/__init__.py`` lists it): every import between pcsd's modules,
module-level and inside functions alike, points from a layer to one it may use, and no two modules
import each other through any chain. Read from the sources with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pcsd"

#: what each layer may import (besides itself); the native modules and ``pcsd`` itself are open to all
ALLOWED: dict[str, set[str]] = {
    "ops": set(),
    "envs": {"text"},  # an env kind owns its prompt family (pcsd.envs.kinds)
    "text": set(),
    "view": {"text"},  # the run's page: reads a run folder's records (pcsd.view.files)
    "models": set(),
    "lora": set(),
    "progress": set(),
    "data": {"envs", "models", "progress"},
    "rollout": {"envs", "text", "models"},
    "tiny_model": {"rollout", "envs", "text", "models"},
    "eval": {"rollout", "envs", "text", "models", "lora", "progress", "tiny_model"},
    "train": {"view", "ops", "envs", "text", "models", "lora", "progress", "rollout", "eval", "tiny_model"},
    "diagnostics": {
        "view",
        "ops",
        "envs",
        "text",
        "models",
        "lora",
        "progress",
        "rollout",
        "eval",
        "tiny_model",
        "train",
    },
    "bench": {"view", "ops", "envs", "text", "models", "lora", "progress", "rollout", "eval", "tiny_model", "train"},
}
OPEN = {"pcsd", "pcsd._native", "pcsd._C", "pcsd._envpool"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(path: Path) -> set[str]:
    """Every ``pcsd.*`` module a file imports (``from pcsd.x import y`` counts ``pcsd.x.y`` when
    that is a module, else ``pcsd.x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pcsd"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pcsd"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    return out


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def graph() -> dict[str, set[str]]:
    return {m: {t for t in imports_of(p) if t != m} for m, p in MODULES.items()}


def test_layers_import_only_what_they_may():
    bad = []
    for mod, targets in graph().items():
        src = layer(mod)
        if src in ("", "_native"):
            assert targets <= OPEN, f"{mod} imports {sorted(targets - OPEN)}"
            continue
        for t in targets:
            dst = layer(t)
            if t in OPEN or dst == src:
                continue
            if dst not in ALLOWED.get(src, set()):
                bad.append(f"{mod} imports {t} ({src} -> {dst})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        if state.get(node) == 1:
            return stack[stack.index(node) :] + [node]
        if state.get(node) == 2:
            return None
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if (c := visit(nxt, stack)) is not None:
                return c
        stack.pop()
        state[node] = 2
        return None

    for n in sorted(g):
        if (c := visit(n, [])) is not None:
            return c
    return None


def test_no_import_cycles():
    # a package's __init__ re-exporting its own modules is not a cycle between modules
    g = {
        m: {
            t for t in ts if not (m.startswith(t + ".") or (t.startswith(m + ".") and MODULES[m].name == "__init__.py"))
        }
        for m, ts in graph().items()
    }
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_find_what_they_look_for(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from pcsd.train.job import train\nimport pcsd.ops\n")
    assert imports_of(f) == {"pcsd.train.job", "pcsd.ops"}
    assert layer("pcsd.ops.kernels") == "ops" and "train" not in ALLOWED["eval"]


@pytest.mark.parametrize("layer_name", sorted(ALLOWED))
def test_every_layer_has_modules_and_a_docstring(layer_name):
    mods = [m for m in MODULES if layer(m) == layer_name]
    if layer_name == "diagnostics" and not mods:
        pytest.skip("no pcsd.diagnostics package in this checkout")
    assert mods, layer_name
    head = f"pcsd.{layer_name}"
    assert ast.get_docstring(ast.parse(MODULES[head].read_text())), f"{head} has no docstring"


# ----------------------------------------------------------------------------- the update's shape
#: the longest function allowed in the update's modules (issue 27: the update in phases)
MAX_FUNCTION_LINES = 80
SHAPED = ("train/update.py", "train/fused_update.py")


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (n lines)`` of every function or method in ``path`` (nested ones too) longer than
    ``limit`` lines, counted from its ``def`` (decorators excluded) to its last line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{node.name} ({n} lines)")
    return out


@pytest.mark.parametrize("rel", SHAPED)
def test_no_function_of_the_update_is_longer_than_80_lines(rel):
    assert long_functions(PKG / rel) == []


def test_long_functions_counts_lines(tmp_path):
    f = tmp_path / "m.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    f.write_text(f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions(f) == ["long (81 lines)"]
    assert long_functions(f, limit=81) == []
