"""``pcsd-data model NAME``: a Hugging Face model id into a local folder, through
``huggingface_hub.snapshot_download`` (its resume of partial files, its ``HF_ENDPOINT`` mirror and
``HF_TOKEN`` login), the files a job reads only (:data:`pcsd.models.MODEL_FILES`: config,
tokenizer, chat template, safetensors weights).

Without ``--dest`` the model goes to the Hugging Face cache, where ``model.path=NAME`` finds it
(offline too, ``HF_HUB_OFFLINE=1``), and is checked there (a damaged file is deleted, so that the
next run fetches it anew). With ``--dest DIR`` the snapshot lands in ``<dest>.partial/`` and is
checked before it is renamed to ``<dest>``:
``config.json`` parses and names a causal LM, the tokenizer is there (``tokenizer.json``, which the
native prompt builder reads), every weight shard of ``model.safetensors.index.json`` is there,
every safetensors file is whole (its header parses and its tensors end where the file ends), and
every file whose SHA-256 the Hub publishes (the LFS files: the weights) has it. ``--from DIR``
checks a local copy the same way (without the Hub's checksums) and copies it in.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Optional

from rich.console import Console

from pcsd.data.fetch import DataError, check_from_dir, replace_into, sha256_of
from pcsd.models import MODEL_FILES, hub_kwargs, is_model_id

__all__ = ["check_model_folder", "default_dest", "install"]


def default_dest(name: str) -> Path:
    """``~/.cache/pcsd/models/<name after the slash>`` (the folder ``--from`` copies into)."""
    return Path.home() / ".cache" / "pcsd" / "models" / name.rsplit("/", 1)[-1]


def _safetensors_whole(path: Path) -> None:
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"a header of {n:,} bytes in a file of {size:,}")
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DataError(f"model: {path.name} is not a whole safetensors file ({exc})") from None
    if 8 + n + end != size:
        raise DataError(
            f"model: {path.name} has {size:,} bytes, its tensors need {8 + n + end:,} (truncated or damaged)"
        )


def check_model_folder(folder: Path, sha256: Optional[dict[str, str]] = None, where: str = "model") -> None:
    """Raises :class:`DataError` unless ``folder`` holds a usable causal LM (see the module doc);
    ``sha256``: published checksums by file name (a file that differs is deleted, so that the next
    run fetches it anew)."""
    cfg_path = folder / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{where}: {folder} has no config.json (not a transformers model)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{where}: {cfg_path} does not parse ({exc})") from None
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForCausalLM") for a in archs):
        raise DataError(f"{where}: {folder} is not a causal LM (config.json architectures: {archs})")
    if not (folder / "tokenizer.json").is_file():
        raise DataError(f"{where}: {folder} has no tokenizer.json (the prompt builder reads it)")
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            wanted = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise DataError(f"{where}: {index.name} does not parse ({exc})") from None
        missing = [w for w in wanted if w not in shards]
        if missing:
            raise DataError(
                f"{where}: {folder} lacks {len(missing)} of the {len(wanted)} weight shards (first: {missing[0]})"
            )
    if not shards:
        raise DataError(f"{where}: {folder} has no *.safetensors weights")
    for s in shards:
        _safetensors_whole(folder / s)
    for name, digest in (sha256 or {}).items():
        p = folder / name
        if p.is_file() and sha256_of(p) != digest:
            blob = p.resolve()  # in the Hugging Face cache: the blob behind the link
            p.unlink()
            blob.unlink(missing_ok=True)
            raise DataError(
                f"{where}: {name} does not have the SHA-256 the Hub publishes ({digest}): a damaged "
                f"download, deleted (run again to fetch it anew)"
            )


def _published_sha256(name: str, revision: Optional[str]) -> dict[str, str]:
    """SHA-256 of the model's LFS files (the weights), as the Hub lists them."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    kw = hub_kwargs()
    api = HfApi(endpoint=kw.get("endpoint"))
    return {
        f.path: f.lfs.sha256
        for f in api.list_repo_tree(name, revision=revision, recursive=True)
        if isinstance(f, RepoFile) and f.lfs is not None and f.lfs.sha256
    }


def _progress_bars(console: Console) -> None:
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    from pcsd.progress import progress_enabled

    (enable_progress_bars if progress_enabled(console) else disable_progress_bars)()


def _into_cache(name: str, revision: Optional[str], console: Console) -> str:
    """The model into the Hugging Face cache (where ``model.path=<id>`` finds it, offline too)."""
    from huggingface_hub import snapshot_download

    _progress_bars(console)
    kw = hub_kwargs()
    where = kw.get("endpoint") or "https://huggingface.co"
    console.print(f"model: {name} from {where} into the Hugging Face cache")
    try:
        path = Path(snapshot_download(name, revision=revision, allow_patterns=MODEL_FILES, **kw))
        sha = _published_sha256(name, revision)
    except Exception as exc:
        raise DataError(_download_error(name, where, exc)) from None
    check_model_folder(path, sha)
    console.print(f"model: {name} is in {path}")
    return name if revision is None else str(path)


def install(
    name: str,
    dest: Optional[Path],
    *,
    revision: Optional[str] = None,
    from_dir: Optional[str] = None,
    force: bool = False,
    console: Console,
) -> str:
    """Puts model ``name`` (a Hub id) in the Hugging Face cache (``dest`` None) or in the folder
    ``dest``; returns what ``model.path`` takes: the id, or the folder."""
    if from_dir is None and not is_model_id(name):
        raise DataError(
            f"model: {name!r} is not a Hugging Face model id (expected org/name, e.g. Qwen/Qwen2.5-3B-Instruct)"
        )
    src = check_from_dir(from_dir) if from_dir is not None else None
    if dest is None and src is None:
        return _into_cache(name, revision, console)
    dest = (dest or default_dest(name)).expanduser().resolve()
    if dest.exists() and not force:
        try:
            check_model_folder(dest)
        except DataError as exc:
            raise DataError(
                f"model: {dest} exists and is not a complete model ({exc}); pass --force to replace it"
            ) from None
        console.print(f"model: {dest} already holds {name}")
        return str(dest)
    if src is not None and src == dest:
        raise DataError(f"--from {src}: the same folder as the destination (give another --dest)")
    stage = dest.with_name(dest.name + ".partial")  # kept on failure: the next run resumes in it
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src is not None:
        check_model_folder(src, where=f"--from {src}")
        if stage.exists():
            shutil.rmtree(stage)
        console.print(f"model: copying {src} to {dest}")
        shutil.copytree(src, stage, ignore=shutil.ignore_patterns(".cache", ".git"))
    else:
        from huggingface_hub import snapshot_download

        _progress_bars(console)
        kw = hub_kwargs()
        kw.pop("cache_dir", None)
        where = kw.get("endpoint") or "https://huggingface.co"
        console.print(f"model: {name} from {where} into {stage}")
        try:
            snapshot_download(name, revision=revision, local_dir=stage, allow_patterns=MODEL_FILES, **kw)
            sha = _published_sha256(name, revision)
        except Exception as exc:
            raise DataError(_download_error(name, where, exc)) from None
        check_model_folder(stage, sha)
        shutil.rmtree(stage / ".cache", ignore_errors=True)  # huggingface_hub's resume metadata
    replace_into(stage, dest)
    console.print(f"model: {name} is in {dest}")
    return str(dest)


def _download_error(name: str, where: str, exc: BaseException) -> str:
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return f"model: {name} is gated on {where}: accept its licence there and log in (HF_TOKEN)"
    if isinstance(exc, RepositoryNotFoundError):
        return f"model: {where} has no model {name} (or it is private: log in with HF_TOKEN)"
    if isinstance(exc, RevisionNotFoundError):
        return f"model: {where} has no such revision of {name}"
    if isinstance(exc, LocalEntryNotFoundError) or "connect" in type(exc).__name__.lower():
        return (
            f"model: could not reach {where} for {name}; without network, copy the model folder here and use --from DIR"
        )
    msg = str(exc).splitlines()[0] if str(exc) else ""
    return f"model: downloading {name} from {where} failed ({type(exc).__name__}: {msg})"
