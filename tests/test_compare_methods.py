"""benchmarks/compare_methods.py's entries: a method, an estimator alone, or ESTIMATOR+METHOD."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "compare_methods", Path(__file__).resolve().parent.parent / "benchmarks" / "compare_methods.py"
)
assert _SPEC is not None and _SPEC.loader is not None
cm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cm)


@pytest.mark.parametrize(
    "entry, overrides",
    [
        ("grpo", ["method=grpo"]),
        ("grpo+opsd", ["method=grpo+opsd"]),
        ("pcsd*", ["method=pcsd-star"]),
        ("gigpo", ["method=grpo", "algo.estimator=gigpo"]),
        ("gigpo+pcsd", ["method=pcsd", "algo.estimator=gigpo"]),
        ("gigpo+sdar", ["method=sdar", "algo.estimator=gigpo"]),
        ("rloo+grpo+opsd", ["method=grpo+opsd", "algo.estimator=rloo"]),
    ],
)
def test_entries(entry, overrides):
    assert cm.entry_overrides(entry) == overrides


@pytest.mark.parametrize("entry", ["gae", "gigpo+nope", "nope+pcsd", ""])
def test_an_unknown_entry_is_one_line(entry):
    with pytest.raises(SystemExit) as e:
        cm.entry_overrides(entry)
    assert f"--methods: {entry!r} is neither a method" in str(e.value) and "\n" not in str(e.value)
