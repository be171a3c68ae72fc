"""Loading of the two private native modules, with clear errors and pure-PyTorch fallbacks.

``import pcsd`` never fails because a native module is missing or broken: the failure is recorded
here, ``pcsd.native_info()`` reports it, and code that needs the module raises
:class:`NativeModuleError` saying which module failed and how to rebuild.

Running from the repository root after ``pip install .``: Python imports the *source tree* in the
current folder (``python -c`` and ``python -m`` put it first on ``sys.path``), which has no
compiled modules. When a module is missing from the imported package folder (not broken: missing),
it is loaded from the installed ``pcsd`` distribution's own copy (found through its metadata, else
on ``sys.path``), under the same name; ``native_info()`` then reports ``"from": "installed
distribution"`` and the file. ``PCSD_NATIVE_FALLBACK=0`` turns this off. Where no installed copy
exists, the error says so and names the one command that fixes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType
from typing import Any

REBUILD_HINT = (
    "Fix: run `pip install .` in the repository root (needs a C++ compiler and a Rust toolchain; see "
    "README 'Install'); the installed modules are then found from any folder, the repository root included. "
    "(For the Rust module alone: `pip install ./rust_envpool`; to build inside the source tree: "
    "`bash tools/build_inplace.sh`.)"
)


class NativeModuleError(ImportError):
    """A compiled pcsd module (``pcsd._C`` or ``pcsd._envpool``) is missing or failed to load."""


_modules: dict[str, ModuleType | None] = {}
_errors: dict[str, str] = {}


_origin: dict[str, str] = {}  # name -> "package" | "installed distribution"


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _installed_candidates(name: str) -> list[Path]:
    """Compiled ``pcsd/<name>*.so`` files of installed pcsd copies other than the imported one:
    the ``pcsd`` distribution's recorded files first, then any ``pcsd/`` folder on ``sys.path``."""
    here = _package_dir()
    found: list[Path] = []

    def ok(p: Path) -> bool:
        return (
            p.name.startswith(name + ".")
            and any(p.name.endswith(sfx) for sfx in EXTENSION_SUFFIXES)
            and p.is_file()
            and p.resolve().parent != here
        )

    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("pcsd")
        for f in dist.files or []:
            if f.parts[:1] == ("pcsd",) and len(f.parts) == 2:
                p = Path(str(dist.locate_file(f)))
                if ok(p):
                    found.append(p)
    except (PackageNotFoundError, OSError):
        pass
    for entry in sys.path:
        d = Path(entry or ".") / "pcsd"
        if d.is_dir() and d.resolve() != here:
            found += [p for p in sorted(d.iterdir()) if ok(p) and p not in found]
    return found


def _load_installed(name: str) -> tuple[ModuleType | None, str]:
    """``pcsd.<name>`` from an installed copy (see the module docs); (None, why) if none loads."""
    if os.environ.get("PCSD_NATIVE_FALLBACK", "1") == "0":
        return None, "PCSD_NATIVE_FALLBACK=0"
    why = "no installed pcsd distribution provides it"
    for path in _installed_candidates(name):
        spec = importlib.util.spec_from_file_location(f"pcsd.{name}", path)
        if spec is None or spec.loader is None:
            continue
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # an installed copy built for another Python / torch
            del sys.modules[spec.name]
            why = f"the installed copy {path} failed to load ({type(exc).__name__}: {exc})"
            continue
        return mod, ""
    return None, why


def _load(name: str) -> ModuleType | None:
    if name in _modules:
        return _modules[name]
    try:
        mod: ModuleType | None = importlib.import_module(f"pcsd.{name}")
        _origin[name] = "package"
    except ModuleNotFoundError as exc:
        mod, why = (None, "") if exc.name != f"pcsd.{name}" else _load_installed(name)
        if mod is not None:
            _origin[name] = "installed distribution"
        else:
            _errors[name] = (
                f"pcsd is imported from {_package_dir()}, which has no compiled {name} module"
                f" (a source tree?), and {why or exc}"
            )
    except Exception as exc:  # ImportError, OSError (bad ELF), undefined symbols, ...
        mod = None
        _errors[name] = f"{type(exc).__name__}: {exc}"
    if mod is None:
        warnings.warn(
            f"pcsd.{name} failed to load ({_errors[name]}); pure-PyTorch / Python fallbacks are "
            f"used where they exist. {REBUILD_HINT}",
            RuntimeWarning,
            stacklevel=3,
        )
    _modules[name] = mod
    return mod


def kernels() -> ModuleType | None:
    """``pcsd._C`` or None when it is unavailable."""
    return _load("_C")


def envpool() -> ModuleType | None:
    """``pcsd._envpool`` or None when it is unavailable."""
    return _load("_envpool")


def require(name: str) -> ModuleType:
    """The module, or a :class:`NativeModuleError` naming it and how to rebuild."""
    mod = _load(name)
    if mod is None:
        raise NativeModuleError(f"pcsd.{name} is not available: {_errors.get(name, 'not built')}. {REBUILD_HINT}")
    return mod


def native_info() -> dict[str, Any]:
    """What was compiled: CPU and CUDA kernels (with architectures) and the Rust module version.

    The first thing to print when something is slow::

        python -c "import pcsd; print(pcsd.native_info())"
    """
    info: dict[str, Any] = {}
    c = kernels()
    if c is not None:
        b = dict(c.build_info())
        archs = [a for a in str(b.get("cuda_archs", "")).split(",") if a]
        info["_C"] = {
            "loaded": True,
            "version": b.get("version"),
            "cpu_kernels": bool(b.get("cpu_kernels")),
            "cuda_kernels": bool(b.get("cuda_kernels")),
            "cuda_archs": [f"sm_{a}" for a in archs],
            "compiler": b.get("compiler"),
            "path": getattr(c, "__file__", None),
            "from": _origin.get("_C"),
        }
    else:
        info["_C"] = {"loaded": False, "error": _errors.get("_C"), "fix": REBUILD_HINT}
    e = envpool()
    if e is not None:
        info["_envpool"] = {
            "loaded": True,
            "version": e.version(),
            "path": getattr(e, "__file__", None),
            "from": _origin.get("_envpool"),
        }
        if hasattr(e, "build_info"):
            info["_envpool"].update(dict(e.build_info()))
    else:
        info["_envpool"] = {"loaded": False, "error": _errors.get("_envpool"), "fix": REBUILD_HINT}
    return info
