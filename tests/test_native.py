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
    import os

    # no fallback to an installed copy (pcsd._native): this test is about the missing/broken case
    env = {**os.environ, "PCSD_NATIVE_FALLBACK": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["info"]["_C"]["loaded"] is False
    assert "pip install ." in res["info"]["_C"]["fix"]
    assert res["kernel"] == "reference" and len(res["w"]) == 3
    assert "pcsd._envpool is not available" in res["raised"] and "pip install" in res["raised"]


def _repo_and_site(tmp_path: Path, with_site: bool = True) -> tuple[Path, Path]:
    """A repository-root-like folder (``repo/pcsd`` = the package's sources, no compiled modules)
    and, beside it, what ``pip install .`` leaves in site-packages (``site/pcsd`` with the compiled
    modules, ``site/pcsd-<v>.dist-info`` with its RECORD)."""
    pkg = Path(pcsd.__file__).parent
    repo, site = tmp_path / "repo", tmp_path / "site"
    shutil.copytree(pkg, repo / "pcsd", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    site.mkdir()
    if with_site:
        shutil.copytree(pkg, site / "pcsd", ignore=shutil.ignore_patterns("__pycache__"))
        sos = sorted(p.name for p in (site / "pcsd").glob("*.so"))
        assert any(n.startswith("_C.") for n in sos) and any(n.startswith("_envpool.") for n in sos), sos
        info = site / f"pcsd-{pcsd.__version__}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pcsd\nVersion: {pcsd.__version__}\n")
        (info / "RECORD").write_text("".join(f"pcsd/{n},,\n" for n in sos))
    return repo, site


_INFO = "import json, pcsd; print(json.dumps(pcsd.native_info()))"


def test_repository_root_after_pip_install_finds_the_installed_modules(tmp_path: Path):
    """The issue's commands from the repository root: ``python -c "import pcsd; print(pcsd.native_info())"``
    imports the source tree (first on sys.path), whose compiled modules are missing; both come
    from the installed distribution."""
    import os

    repo, site = _repo_and_site(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PCSD_NATIVE_FALLBACK")}
    env["PYTHONPATH"] = str(site)  # stands for site-packages, after the cwd on sys.path
    out = subprocess.run([sys.executable, "-c", _INFO], cwd=repo, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("_C", "_envpool"):
        assert info[name]["loaded"] is True, info
        assert info[name]["from"] == "installed distribution"
        assert info[name]["path"].startswith(str(site / "pcsd"))
    code = "import pcsd.envs.procedural, pcsd.ops.kernels as k, torch; print(k.kernel_for(torch.device('cpu')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "cpu", out.stderr[-2000:]  # the native CPU kernel
    assert (
        Path(
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", "import json, pcsd; print(json.dumps(pcsd.__file__))"],
                    cwd=repo,
                    capture_output=True,
                    text=True,
                    env=env,
                ).stdout
            )
        ).parent
        == repo / "pcsd"
    )


def test_source_tree_without_any_installed_copy_says_what_to_run(tmp_path: Path):
    import os

    repo, site = _repo_and_site(tmp_path, with_site=False)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PCSD_NATIVE_FALLBACK")}
    env["PYTHONPATH"] = str(site)
    code = (
        "import json, warnings; warnings.simplefilter('ignore'); import sys; "
        "sys.path[:] = [p for p in sys.path if 'site-packages' not in p or 'torch' in p]; "
        "import importlib.metadata as md; md.distribution = lambda n: (_ for _ in ()).throw(md.PackageNotFoundError(n)); "
        "import pcsd; print(json.dumps(pcsd.native_info()))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])["_envpool"]
    assert info["loaded"] is False
    assert f"pcsd is imported from {repo / 'pcsd'}, which has no compiled _envpool module" in info["error"]
    assert "no installed pcsd distribution provides it" in info["error"]
    assert "run `pip install .` in the repository root" in info["fix"]
