"""``pcsd-data webshop``: the WebShop catalogue the native engine reads, from the files
princeton-nlp/WebShop's ``setup.sh`` downloads (its Google Drive files), plus the table of
product-name nouns the reward's type score needs.

Sets (``--full`` picks the second):

* ``small``: ``items_shuffle_1000.json`` (the 1,000 products the agent setups — verl-agent, SDAR,
  GiGPO, the paper — train and evaluate on), ``items_ins_v2_1000.json`` (their attributes and
  synthetic-goal instructions), ``items_human_ins.json`` (the human instructions).
* ``full``: ``items_shuffle.json`` (1,181,436 product entries, several GB), ``items_ins_v2.json``
  and ``items_human_ins.json``.

Installed as ``<dest>/data/<file>``, the layout ``WEBSHOP_DATA`` names, then loaded once to build
the engine's index cache (``docs/webshop.md``, "The index cache": beside the data, or where
``WEBSHOP_CACHE`` says), so that the first training or evaluation run maps it instead of indexing
the catalogue (minutes for the full set). Checks before the move:
every file parses (the catalogue streamed by the native reader, so the full set is never held as
JSON values), the catalogue holds the manifest's number of products, the attribute file its number
of entries where the manifest has one, sizes and SHA-256 where published.

The nouns: the original's reward runs spaCy's ``en_core_web_sm`` on the product names
(``[t.text.lower() for t in nlp(name) if t.pos_ in ('PNOUN', 'NOUN', 'PROPN')]``); the native
engine reads them from a table instead (``spacy_nouns_1k.json`` / ``spacy_nouns.json`` beside the
catalogue). The table is built here with spaCy (``pip install 'pcsd[webshop]'``) and the
``en_core_web_sm`` 3.8.0 pipeline from its public release (the wheel is unpacked, not installed;
the tagger and attribute ruler set ``pos_``, so the parser, NER and lemmatizer are left out: on the
1,000 names this gives the original's table exactly). ``--nouns FILE`` installs a table you have.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any, Iterable, Optional

from rich.console import Console

from pcsd.data.fetch import (
    DataError,
    Manifest,
    check_from_dir,
    fetch_file,
    partial_dir,
    replace_into,
    sha256_of,
    staging_dir,
)

__all__ = [
    "NOUN_POS",
    "SETS",
    "build_index_cache",
    "build_noun_table",
    "default_dest",
    "install",
    "load_spacy_model",
    "noun_file",
]

SETS = ("small", "full")
#: the parts of speech the original's ``get_type_reward`` keeps
NOUN_POS = ("PNOUN", "NOUN", "PROPN")
#: the pipes ``pos_`` does not depend on (left out: 4x faster, the same nouns)
SPACY_EXCLUDE = ["parser", "ner", "lemmatizer"]


def default_dest(full: bool) -> Path:
    """``$WEBSHOP_DATA`` for the 1,000-product set, else ``~/.cache/pcsd/webshop``; the full set
    goes to ``~/.cache/pcsd/webshop-full`` (its own folder: the engine prefers the small set)."""
    env = os.environ.get("WEBSHOP_DATA")
    if env and not full:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "pcsd" / ("webshop-full" if full else "webshop")


def noun_file(set_name: str) -> str:
    """The noun table's file name, where the engine looks for it beside the catalogue."""
    return "spacy_nouns_1k.json" if set_name == "small" else "spacy_nouns.json"


def _set(manifest: Manifest, set_name: str) -> dict[str, Any]:
    sets = manifest.extra.get("sets", {})
    if set_name not in sets:
        raise DataError(f'--manifest {manifest.path}: no set {set_name!r} (expected "sets" with {", ".join(SETS)})')
    return sets[set_name]


# ----------------------------------------------------------------------------- checks
def _check_catalogue(path: Path, want: Optional[int]) -> list[str]:
    """Streams the product file: it parses and holds ``want`` entries. Returns the distinct
    product names (in file order) for the noun table."""
    from pcsd.envs.webshop import scan_catalogue

    try:
        entries, names = scan_catalogue(path)
    except (ValueError, OSError) as exc:
        raise DataError(
            f"webshop: {path.name.removesuffix('.part')} does not parse as a product list ({exc})"
        ) from None
    if want is not None and entries != want:
        raise DataError(
            f"webshop: {path.name.removesuffix('.part')} holds {entries:,} products, expected {want:,} "
            f"(a truncated or different file)"
        )
    return names


def _check_entries(path: Path, want: Optional[int], what: str) -> int:
    from pcsd.envs.webshop import json_length

    try:
        n = json_length(path)
    except (ValueError, OSError) as exc:
        raise DataError(f"webshop: {path.name.removesuffix('.part')} does not parse as {what} ({exc})") from None
    if want is not None and n != want:
        raise DataError(f"webshop: {path.name.removesuffix('.part')} holds {n:,} entries, expected {want:,}")
    return n


def _check(path: Path, entry: dict[str, Any]) -> Optional[list[str]]:
    kind = entry.get("kind")
    if kind == "products":
        return _check_catalogue(path, entry.get("count"))
    if kind in ("attributes", "human"):
        _check_entries(path, entry.get("count"), "a JSON object of per-product entries")
        return None
    raise DataError(
        f"--manifest: file {entry.get('name')!r} has kind {kind!r} (expected products, attributes or human)"
    )


# ----------------------------------------------------------------------------- nouns
def load_spacy_model(wheel: Path, into: Path, expect: dict[str, Any]) -> Any:
    """Unpacks the ``en_core_web_sm`` wheel into ``into`` and loads its pipeline with spaCy."""
    try:
        import spacy
    except ImportError:
        raise DataError(
            "webshop: the reward's noun table is built with spaCy: pip install 'pcsd[webshop]' "
            "(or give a table you have with --nouns FILE)"
        ) from None
    try:
        with zipfile.ZipFile(wheel) as zf:
            metas = [n for n in zf.namelist() if n.endswith("/meta.json") and n.count("/") == 2]
            if not metas:
                raise DataError(f"webshop: {wheel.name} holds no spaCy pipeline (no <package>/<name>/meta.json)")
            zf.extractall(into)
    except zipfile.BadZipFile as exc:
        raise DataError(f"webshop: {wheel.name} is not a whole wheel ({exc}): a damaged download") from None
    pipe_dir = into / Path(metas[0]).parent
    meta = json.loads((pipe_dir / "meta.json").read_text(encoding="utf-8"))
    for k in ("name", "version"):
        if k in expect and meta.get(k) != expect[k]:
            raise DataError(
                f"webshop: {wheel.name} is {meta.get('name')} {meta.get('version')}, expected "
                f"{expect.get('name')} {expect.get('version')}"
            )
    try:
        return spacy.load(pipe_dir, exclude=SPACY_EXCLUDE)
    except Exception as exc:  # spaCy's own errors: a version it cannot load
        raise DataError(
            f"webshop: spaCy {spacy.__version__} cannot load {pipe_dir.name} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0]})"
        ) from None


def build_noun_table(names: Iterable[str], nlp: Any, *, console: Console, batch_size: int = 512) -> dict[str, Any]:
    """The noun table of ``names``: ``{"by_name": {name: {"nouns": [...]}}}``, the nouns as the
    original's ``get_type_reward`` takes them from ``nlp(name)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from pcsd.progress import progress_enabled

    names = list(dict.fromkeys(names))
    by_name: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress_enabled(console),
    ) as bars:
        task = bars.add_task("webshop: nouns of the product names (spaCy)", total=len(names))
        for name, doc in zip(names, nlp.pipe(names, batch_size=batch_size)):
            by_name[name] = {"nouns": [t.text.lower() for t in doc if t.pos_ in NOUN_POS]}
            bars.advance(task)
    import spacy

    return {
        "what": "[t.text.lower() for t in nlp(name) if t.pos_ in ('PNOUN', 'NOUN', 'PROPN')] per product name "
        "(goal.get_type_reward of princeton-nlp/WebShop); written by pcsd-data webshop",
        "spacy_version": spacy.__version__,
        "model": {k: nlp.meta.get(k) for k in ("lang", "name", "version")},
        "pipeline": list(nlp.pipe_names),
        "n_distinct_names": len(by_name),
        "by_name": by_name,
    }


def _check_noun_table(path: Path, names: list[str]) -> None:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        by_name = table["by_name"]
        missing = [n for n in names if n not in by_name or not isinstance(by_name[n].get("nouns"), list)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(
            f'--nouns {path}: not a noun table (expected {{"by_name": {{name: {{"nouns": [...]}}}}}}: {exc})'
        ) from None
    if missing:
        raise DataError(
            f"--nouns {path}: no nouns for {len(missing):,} of the {len(names):,} product names (first: {missing[0]!r})"
        )


# ----------------------------------------------------------------------------- install
def _complete(data: Path, files: list[dict[str, Any]], nouns: str) -> bool:
    return all((data / f["name"]).is_file() for f in files) and (data / nouns).is_file()


def install(
    manifest: Manifest,
    dest: Path,
    *,
    full: bool = False,
    from_dir: Optional[str] = None,
    nouns: Optional[str] = None,
    force: bool = False,
    console: Console,
) -> Path:
    """Installs the set into ``dest/data`` and returns ``dest`` (the folder ``WEBSHOP_DATA``
    names). ``from_dir``: a folder holding the set's files (directly or in ``data/``; the spaCy
    wheel or a noun table there too, else the wheel is downloaded). ``nouns``: a noun table to
    install instead of building one."""
    set_name = "full" if full else "small"
    spec = _set(manifest, set_name)
    files = [manifest.file(n) for n in spec["files"]]
    src = check_from_dir(from_dir) if from_dir is not None else None
    if src is not None and not (src / files[0]["name"]).is_file() and (src / "data" / files[0]["name"]).is_file():
        src = src / "data"
    nouns_path = None
    if nouns is not None:
        nouns_path = Path(nouns).expanduser()
        if not nouns_path.is_file():
            raise DataError(f"--nouns {nouns_path}: no such file (expected a noun table, e.g. {noun_file(set_name)})")
    dest = dest.expanduser().resolve()
    data = dest / "data"
    if data.exists() and _complete(data, files, noun_file(set_name)) and not force:
        console.print(f"webshop: {data} already holds the {set_name} set and its noun table")
        build_index_cache(dest, console=console)
        return dest
    stage = staging_dir(dest, "webshop")
    names: list[str] = []
    try:
        for entry in files:
            name = entry["name"]
            if src is not None:
                local = src / name
                if not local.is_file():
                    raise DataError(
                        f"--from {src}: no {name} there (the {set_name} set needs "
                        f"{', '.join(f['name'] for f in files)})"
                    )
                if entry.get("sha256") and sha256_of(local) != entry["sha256"].lower():
                    raise DataError(f"--from {src}: {name} does not have the published SHA-256 {entry['sha256']}")
                found = _check(local, entry)
                shutil.copyfile(local, stage / name)
            else:
                part = fetch_file(manifest, name, dest, what="webshop", console=console, html_ok=False)
                try:
                    found = _check(part, entry)
                except DataError as exc:  # a bad download is not resumed: the next run fetches it anew
                    part.unlink(missing_ok=True)
                    raise DataError(f"{exc} (the download was deleted: run again to fetch it anew)") from None
                os.replace(part, stage / name)
            if found is not None:
                names = found
        table = stage / noun_file(set_name)
        local_table = src / noun_file(set_name) if src is not None else None
        if nouns_path is None and local_table is not None and local_table.is_file():
            nouns_path = local_table
        if nouns_path is not None:
            _check_noun_table(nouns_path, names)
            shutil.copyfile(nouns_path, table)
        else:
            _build_nouns(manifest, names, table, dest, src, console)
        if data.exists():
            for f in stage.iterdir():  # the other set's files in the same folder stay
                replace_into(f, data / f.name)
        else:
            replace_into(stage, data)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if src is None:
        shutil.rmtree(partial_dir(dest), ignore_errors=True)
    console.print(f"webshop: installed the {set_name} set ({len(names):,} product names with their nouns) in {data}")
    build_index_cache(dest, console=console)
    return dest


def build_index_cache(dest: Path, *, console: Console) -> Optional[str]:
    """Loads the installed set once (synthetic goals, as training and evaluation load it) so that
    its index cache exists; returns the cache file (``None`` when no folder could take it). A
    cache already there and whole is only checked."""
    import time

    from pcsd.envs.webshop import WebShop

    t0 = time.perf_counter()
    shop = WebShop.load(dest)
    secs = time.perf_counter() - t0
    where = shop.cache_path or "none written (see the warning above): each load builds the index"
    what = "checked" if shop.cache_hit else "built"
    console.print(f"webshop: index cache of {shop.num_products:,} products {what} in {secs:.1f} s: {where}")
    return shop.cache_path


def _build_nouns(
    manifest: Manifest, names: list[str], table: Path, dest: Path, src: Optional[Path], console: Console
) -> None:
    model = manifest.extra.get("spacy_model")
    if not model:
        raise DataError(f'--manifest {manifest.path}: no "spacy_model" (the wheel the noun table is built with)')
    wheel_name = model["file"]
    if src is not None and (src / wheel_name).is_file():
        wheel = src / wheel_name
    else:
        wheel = fetch_file(manifest, wheel_name, dest, what="webshop", console=console)
    unpacked = table.parent / ".spacy"
    try:
        nlp = load_spacy_model(wheel, unpacked, model)
        console.print(
            f"webshop: nouns of {len(names):,} product names with spaCy {nlp.meta.get('name')} "
            f"{nlp.meta.get('version')}"
        )
        out = build_noun_table(names, nlp, console=console)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    table.write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
