"""The run's page: one static HTML file with the run's records inlined (no server, no network).

:func:`build_page` reads a run folder (``config.yaml``, ``metrics.jsonl``, ``evals.jsonl`` and the
episode records of ``episodes/``, :mod:`pcsd.train.episodes`) and writes ``<run>/view/index.html``:
the step and evaluation records, the recorded episodes (filters: failed only, a task type, a step
range), one turn by turn with its response tokens coloured by the teacher-student gap or by the
rule's weight (a switch; a token's values on hover), the teacher's prompt beside the student's with
the teacher-only part (skills, the env's privileged text) marked. Two runs give one page with the
two side by side (``<run A>/view/vs-<run B's name>.html``), selecting the same task in both.

Bad input is a :class:`ViewError` (one line) before anything is written: a folder that does not
exist or is not a run (no readable ``config.yaml``), a damaged episode file, a run with no episode
records.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["ViewError", "build_page", "load_run", "write_run_page"]

#: the metrics.jsonl fields the page's step table shows
STEP_FIELDS = (
    "step",
    "success",
    "reward",
    "gap_mean",
    "weight_mean",
    "gate_activation",
    "kl",
    "valid_actions",
    "turns",
)


class ViewError(ValueError):
    """A run folder the page cannot be made from (one line)."""


def _jsonl_lenient(path: Path) -> list[dict]:
    """The JSON objects of a record file; a line a crash cut short is left out."""
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _config(run: Path) -> dict:
    from omegaconf import OmegaConf

    path = run / "config.yaml"
    if not path.is_file():
        raise ViewError(f"{run}: not a pcsd run folder (no config.yaml)")
    try:
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # noqa: BLE001 - any parse error is a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ViewError(f"{run}: config.yaml is damaged ({first})") from None
    if not isinstance(cfg, dict):
        raise ViewError(f"{run}: config.yaml is damaged (not a mapping of keys)")
    return cfg


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's records as the page shows them (see the module docs); :class:`ViewError` for bad input."""
    from pcsd.view.files import EPISODES_DIR, episode_files

    run = Path(run_dir)
    if not run.exists():
        raise ViewError(f"{run}: no such folder")
    if not run.is_dir():
        raise ViewError(f"{run}: not a folder")
    cfg = _config(run)
    files = episode_files(run)
    if not files:
        raise ViewError(f"{run}: no episode records in {run / EPISODES_DIR} (train with run.log_episodes > 0)")
    episodes = []
    for _step, _name, path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ViewError(f"{path}: unreadable ({exc})") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise ViewError(f"{path}:{n}: damaged episode record ({exc})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("turns"), list) or "step" not in rec:
                raise ViewError(f"{path}:{n}: damaged episode record (not an episode)")
            episodes.append(rec)
    if not episodes:
        raise ViewError(f"{run}: no episode records in {run / EPISODES_DIR} (its files are empty)")
    run_cfg = cfg.get("run") if isinstance(cfg.get("run"), dict) else {}
    env_cfg = cfg.get("env") if isinstance(cfg.get("env"), dict) else {}
    steps = [{k: r[k] for k in STEP_FIELDS if k in r} for r in _jsonl_lenient(run / "metrics.jsonl") if "step" in r]
    evals = [
        dict(name=r.get("name"), step=r.get("step"), overall=r.get("overall"))
        for r in _jsonl_lenient(run / "evals.jsonl")
    ]
    return dict(
        name=run.resolve().name,
        path=str(run.resolve()),
        method=cfg.get("method"),
        rule=cfg.get("rule"),
        preset=cfg.get("preset"),
        env=env_cfg.get("name"),
        seed=run_cfg.get("seed"),
        steps=steps,
        evals=evals,
        episodes=episodes,
    )


def _asset(name: str) -> str:
    return resources.files("pcsd.view").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(runs: Sequence[dict]) -> str:
    """The page's HTML for loaded runs (:func:`load_run`): the CSS, the script and the data inlined."""
    from pcsd.text.prompts import PRIVILEGED_FOOTER, PRIVILEGED_HEADER

    data = dict(runs=list(runs), privileged_header=PRIVILEGED_HEADER, privileged_footer=PRIVILEGED_FOOTER)
    # inside <script>: "<" escaped (JSON's \u003c) so that no "</script>" or "<!--" in an env's text ends it
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    title = " vs ".join(r["name"] for r in runs)
    esc = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>pcsd: {esc}</title>\n<style>\n{_asset('view.css')}</style>\n</head>\n<body>\n"
        f'<script id="pcsd-data" type="application/json">{blob}</script>\n'
        f"<script>\n{_asset('view.js')}</script>\n</body>\n</html>\n"
    )


def default_out(run_dirs: Sequence[str | os.PathLike[str]]) -> Path:
    """``<run>/view/index.html``; for two runs ``<run A>/view/vs-<run B's name>.html``."""
    first = Path(run_dirs[0])
    if len(run_dirs) == 1:
        return first / "view" / "index.html"
    other = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(run_dirs[1]).resolve().name) or "other"
    return first / "view" / f"vs-{other}.html"


def build_page(run_dirs: Sequence[str | os.PathLike[str]], out: Optional[str | os.PathLike[str]] = None) -> Path:
    """Writes the page of one run (or two side by side) and returns its path; every run is read
    and checked first, so bad input (:class:`ViewError`) writes nothing."""
    if not 1 <= len(run_dirs) <= 2:
        raise ViewError(f"give one run folder, or two to compare; got {len(run_dirs)}")
    runs = [load_run(r) for r in run_dirs]
    html = render_html(runs)
    path = Path(out) if out is not None else default_out(run_dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ViewError(f"{path}: cannot write the page ({exc.strerror or exc})") from None
    return path


def write_run_page(run_dir: str | os.PathLike[str], say: Callable[[str], Any]) -> Optional[Path]:
    """The page at the end of a training run (rank 0): written when the run recorded episodes, its
    path said; a run without episode records gets none, and a failure is a warning, never the run's."""
    from pcsd.view.files import episode_files

    if not episode_files(run_dir):
        return None
    try:
        path = build_page([run_dir])
    except Exception as exc:  # noqa: BLE001 - the page must never fail the run that trained
        say(f"warning: no episode page ({exc})")
        return None
    say(f"episodes page: {path} (python -m pcsd.view {run_dir})")
    return path
