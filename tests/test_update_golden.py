"""update_step gives the numbers it gave before it was reshaped (issue 27 part 6): every method of
the method table, fused and plain, one and two PPO epochs, the joint frozen pass, the aggregation
modes, the current model as teacher, no KL (``tests/update_golden.py`` holds the cases and
regenerates ``tests/fixtures/update_golden.json``).

Tolerance: 1e-6 relative plus 1e-7 absolute. On the machine that recorded them, the reshaped update
gives 63 of the 70 cases bitwise; the seven skill-sd cases differ by at most 6.1e-7 relative (its
term is now normalised as every rule's: ``lambda / M`` as one factor per token on the fused path,
the micro-batch's token-mean times its share of the batch on the plain path). Another
thread count or BLAS reorders the float32 sums (a 1-thread run differs by up to 2.4e-7 relative on
the cancelling ``gap_mean``, 4e-9 absolute), hence the absolute floor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import update_golden as golden  # noqa: E402

RTOL, ATOL = 1e-6, 1e-7

GOLD = json.loads(golden.GOLDEN.read_text())
CASES = golden.cases()
#: the default run: every method once (fused, one epoch) and each other switch once; the rest is slow
FAST = {f"{m}/fused" for m in golden.METHODS} | {
    "pcsd/unfused",
    "skill-sd/epochs2-unfused",
    "rlsd/epochs2",
    "opsd/joint",
    "sdar/token-mean",
}


@pytest.fixture(scope="module")
def models():
    return golden._models()


def _params():
    for cid, method, ov in CASES:
        marks = () if cid in FAST else (pytest.mark.slow,)
        yield pytest.param(cid, method, ov, id=cid, marks=marks)


def test_every_case_is_recorded():
    assert {cid for cid, _, _ in CASES} == set(GOLD)
    assert FAST <= set(GOLD)


@pytest.mark.filterwarnings("ignore::pcsd.train.config.ConfigWarning")
@pytest.mark.parametrize("cid, method, overrides", list(_params()))
def test_update_gives_the_recorded_numbers(models, cid, method, overrides):
    got, want = golden.run_case(method, overrides, models), GOLD[cid]
    bad = []
    for section in ("stats", "grad", "moved", "record"):
        assert set(got[section]) == set(want[section]), section
        for k, w in want[section].items():
            g = got[section][k]
            if not abs(g - w) <= RTOL * abs(w) + ATOL:
                bad.append(f"{section}.{k}: {g!r} != {w!r}")
    assert not bad, "\n".join(bad)
