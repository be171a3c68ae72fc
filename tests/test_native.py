"""Smoke tests of the build: both native modules load, round-trip values, report what was built;
a broken native module leaves `import pcsd` working with a clear message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pcsd


def test_kernels_module_loads_and_round_trips():
    import pcsd._C as c

    assert c.echo(123456789012) == 123456789012
    info = c.build_info()
    assert info["cpu_kernels"] is True
    assert info["version"] == pcsd.__version__


def test_envpool_module_loads_and_round_trips():
    import pcsd._envpool as e

    assert e.echo("héllo ✓") == "héllo ✓"
    assert e.version() == pcsd.__version__


def test_native_info_reports_both_modules():
    info = pcsd.native_info()
    assert info["_C"]["loaded"] and info["_C"]["cpu_kernels"]
    assert isinstance(info["_C"]["cuda_archs"], list)
    if info["_C"]["cuda_kernels"]:
        assert info["_C"]["cuda_archs"], "CUDA kernels without architectures"
    assert info["_envpool"]["loaded"] and info["_envpool"]["version"] == pcsd.__version__
    json.dumps(info)  # printable as JSON


def test_broken_native_module_gives_clear_message(tmp_path: Path):
    # A copy of the package whose _C is not a loadable library and whose _envpool is missing.
    pkg = Path(pcsd.__file__).parent
    dst = tmp_path / "pcsd"
    shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for so in dst.glob("_C*.so"):
        so.write_bytes(b"not an ELF file")
    if not any(dst.glob("_C*.so")):
        (dst / "_C.abi3.so").write_bytes(b"not an ELF file")
    for so in dst.glob("_envpool*.so"):
        so.unlink()
    code = textwrap.dedent(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        import pcsd, torch
        info = pcsd.native_info()
        from pcsd.ops.kernels import pcsd_weights, kernel_for
        w = pcsd_weights(torch.tensor([0.5, -0.5, 1.0]), torch.tensor([0, 3]))
        try:
            from pcsd import _native
            _native.require("_envpool")
            raised = ""
        except ImportError as exc:
            raised = str(exc)
        print(json.dumps({"info": info, "kernel": kernel_for(w.device), "w": w.tolist(),
                          "raised": raised}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["info"]["_C"]["loaded"] is False
    assert "pip install ." in res["info"]["_C"]["fix"]
    assert res["kernel"] == "reference" and len(res["w"]) == 3
    assert "pcsd._envpool is not available" in res["raised"] and "pip install" in res["raised"]
