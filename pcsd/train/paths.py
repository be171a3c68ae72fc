"""Where a config's relative paths point (``env.skills_dir``, ``env.template``): the current
folder when the path exists there, else the presets' folder (``pcsd/train/configs/``), so that a
preset can ship the files it names."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PRESET_DIR", "resolve_config_path"]

PRESET_DIR = Path(__file__).parent / "configs"


def resolve_config_path(value: str) -> Path:
    """``value`` as a path: absolute, else relative to the current folder if it exists there, else
    relative to :data:`PRESET_DIR`."""
    p = Path(value).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    return (PRESET_DIR / p).resolve()
