"""Where a config's relative paths point (``env.skills_dir``, ``env.template``): the current folder; a path that is
not there but ships with the presets (``pcsd/train/configs/``, e.g. ``skills/usual-places``) is the
preset's file. A path found in neither is reported as the current folder's, where the user meant it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PRESET_DIR", "resolve_config_path"]

PRESET_DIR = Path(__file__).resolve().parent.parent / "train" / "configs"


def resolve_config_path(value: str) -> Path:
    """``value`` as a path: absolute, else relative to the current folder if it exists there, else
    relative to :data:`PRESET_DIR` if it exists there, else the current folder's (missing) path."""
    p = Path(value).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    shipped = PRESET_DIR / p
    return shipped.resolve() if shipped.exists() else p.resolve()
