"""The evaluation tables, by the name a kind gives (:attr:`pcsd.envs.kind.EnvKind.table`):

* ``table1``: the layout of the paper's Table 1: one row per method, the six ALFWorld category
  columns and Overall (success %, one decimal); a section row per split, like the paper's
  per-backbone rows; rows with Score and Acc (WebShop's) add Table 1's two WebShop columns left of
  ALFWorld's, and share the row of the ALFWorld result with the same label (else get their own);
* ``success``: Success (%) and the mean summed reward, a section row per environment (the Python
  text environments).

Rows are :meth:`pcsd.eval.run.EvalResult.to_dict` dicts. Under every table: how the episodes were
played, each row's 95 % Wilson interval, and in every table the episodes an over-long prompt or an
env error ended (with the first error's message).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from pcsd.envs.alfworld import CATEGORY_ORDER

__all__ = ["TABLES", "render", "wilson_interval"]

Row = Mapping[str, Any]


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


def _fmt(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.1f}"


def _how(settings: Mapping[str, Any]) -> str:
    temp = settings.get("temperature")
    return "greedy" if temp == 0 else f"temperature {temp}"


def _wilson_of(r: Row) -> tuple[float, float]:
    n = int(r.get("episodes", 0))
    return wilson_interval(int(round(r["overall"] * n / 100.0)), n)


def _ci(r: Row) -> tuple[float, float]:
    ci = r.get("overall_ci95")
    return (ci[0], ci[1]) if ci else _wilson_of(r)


def _where(r: Row) -> str:
    return f"{r['label'] or 'model'} ({r.get('split') or r.get('env')})"


def fault_notes(rows: Sequence[Row]) -> str:
    """The lines under a table counting the episodes an over-long prompt or an env error ended."""
    out = ""
    cut = [f"{_where(r)} {r['prompt_overflows']}" for r in rows if r.get("prompt_overflows")]
    if cut:
        out += (
            "Episodes ended unwon because a prompt exceeded the token budget even without history: "
            + "; ".join(cut)
            + " (raise rollout.max_prompt_tokens / --max-prompt-tokens).\n"
        )
    errs = []
    for r in rows:
        if r.get("env_errors"):
            first = next((g.get("env_error") for g in r.get("games", ()) if g.get("env_error")), "")
            errs.append(f"{_where(r)} {r['env_errors']}" + (f" (first: {first})" if first else ""))
    if errs:
        out += "Episodes ended unwon by an env error: " + "; ".join(errs) + ".\n"
    return out


def success_table(rows: Sequence[Row]) -> str:
    """The Python text environments' table: one row per evaluation, Success (%) and the mean
    summed reward, a section row per environment."""
    lines = ["| **Method** | **Success** | **Mean reward** |", "|:---|---:|---:|"]
    envs: list[str] = []
    for r in rows:
        if r["split"] not in envs:
            envs.append(r["split"])
    notes = []
    for sp in envs:
        lines.append(f"| *{sp}* | | |")
        group = [r for r in rows if r["split"] == sp]
        for r in group:
            lines.append(f"| {r['label'] or 'model'} | {_fmt(r['overall'])} | {r['mean_reward']:.3f} |")
        s = group[0].get("settings", {})
        lo, hi = _ci(group[0])
        notes.append(
            f"{sp}: {group[0]['episodes']} episodes on fixed evaluation seeds, each once, {_how(s)}, seed "
            f"{s.get('seed')}; Success = % of episodes won (info['won'], else summed reward >= the success "
            f"threshold), 95 % Wilson interval of the first row [{lo:.1f}, {hi:.1f}]"
        )
    return "\n".join(lines) + "\n\n" + "; ".join(notes) + ".\n" + fault_notes(rows)


def table1(rows: Sequence[Row]) -> str:
    """Markdown in the layout of the paper's Table 1 (see the module docs). ``–``: no game of that
    category was evaluated."""
    ws = [r for r in rows if "acc" in r]
    al = [r for r in rows if "acc" not in r]
    head = ["Method", *(["Score", "Acc"] if ws else []), *CATEGORY_ORDER, "Overall"]
    lines = [
        "| " + " | ".join(f"**{h}**" for h in head) + " |",
        "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    used: set[int] = set()

    def score_cells(label: str) -> list[str]:
        if not ws:
            return []
        for i, w in enumerate(ws):
            if i not in used and (w["label"] or "model") == label:
                used.add(i)
                return [_fmt(w["score"]), _fmt(w["acc"])]
        return ["–", "–"]

    splits: list[str] = []
    for r in al:
        if r["split"] not in splits:
            splits.append(r["split"])
    for sp in splits:
        if sp:
            lines.append("| " + " | ".join([f"*{sp}*"] + [""] * (len(head) - 1)) + " |")
        for r in al:
            if r["split"] != sp:
                continue
            label = r["label"] or "model"
            cells = [label] + score_cells(label) + [_fmt(r["per_category"][c]) for c in CATEGORY_ORDER]
            cells.append(_fmt(r["overall"]))
            lines.append("| " + " | ".join(cells) + " |")
    rest = [w for i, w in enumerate(ws) if i not in used]
    if rest and al:
        lines.append("| " + " | ".join(["*WebShop*"] + [""] * (len(head) - 1)) + " |")
    for w in rest:
        lines.append(
            "| "
            + " | ".join([w["label"] or "model", _fmt(w["score"]), _fmt(w["acc"])] + ["–"] * (len(CATEGORY_ORDER) + 1))
            + " |"
        )
    notes, cis = [], []
    for sp in splits:
        r = next(r for r in al if r["split"] == sp)
        n = ", ".join(f"{c} {r['counts'][c]}" for c in CATEGORY_ORDER)
        s = r.get("settings", {})
        how = _how(s)
        if s.get("protocol") == "paper":
            drawn = (
                f"drawn with replacement as verl-agent validates (protocol paper, validation "
                f"{s.get('validation_index', 0)}, draw seed {s.get('draw_seed', 0)})"
            )
            notes.append(f"{sp or 'games'}: {r['episodes']} episodes ({n}); {drawn}, {how}, seed {s.get('seed')}")
        else:
            notes.append(f"{sp or 'games'}: {r['episodes']} games ({n}); each once, {how}, seed {s.get('seed')}")
    for r in al:
        lo, hi = _ci(r)
        where = f" ({r['split']})" if len(splits) > 1 else ""
        cis.append(f"{r['label'] or 'model'}{where} [{lo:.1f}, {hi:.1f}]")
    if ws:
        s = ws[0].get("settings", {})
        which = (
            "fixed goals (draw 0)"
            if s.get("protocol") != "paper"
            else f"validation {s.get('validation_index', 0)}'s draw"
        )
        notes.append(
            f"WebShop: {ws[0]['episodes']} episodes on distinct validation goals of the seed "
            f"{s.get('draw_seed', 0)} + 1000 shop, {which}, {_how(s)}, seed {s.get('seed')}; "
            f"Score = 100 x mean task score, Acc = % of episodes with score 1"
        )
        for w in ws:
            lo, hi = _ci(w)
            cis.append(f"{w['label'] or 'model'} (WebShop Acc) [{lo:.1f}, {hi:.1f}]")
    what = "Success rate (%). " if al else ""
    return (
        "\n".join(lines)
        + "\n\n"
        + what
        + "; ".join(notes)
        + ". * = skills at evaluation.\n"
        + ("Overall" if al else "Acc")
        + ", 95 % Wilson interval: "
        + "; ".join(cis)
        + ".\n"
        + fault_notes(rows)
    )


#: the tables by name, in the order they are printed
TABLES: dict[str, Callable[[Sequence[Row]], str]] = {"table1": table1, "success": success_table}


def render(groups: Mapping[str, Sequence[Row]]) -> str:
    """The tables of ``groups`` (table name -> its rows), one after the other."""
    parts = [TABLES[name](rows) for name, rows in sorted(groups.items(), key=lambda kv: list(TABLES).index(kv[0]))]
    return "\n".join(parts)
