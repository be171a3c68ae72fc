"""The offline install of a GPU node without Rust (issue 21, part 2; docs/gpu.md), on this CPU machine:
``tools/gpu_node.sh --dry-run`` builds the package from a clean copy of the repository with
``PCSD_ENVPOOL_LIB`` pointing at a cargo-built library and no cargo anywhere (PATH without it,
CARGO_HOME and HOME elsewhere), imports the result and runs the GPU bench from it; the CMake
checks of ``PCSD_ENVPOOL_LIB``; the carried wheels cover the runtime dependencies the node lacks."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_build_tools() -> None:
    """scikit-build-core, pybind11, cmake and a C++ compiler (the `dev` extra has the Python ones)."""
    missing = [m for m in ("scikit_build_core", "pybind11") if importlib.util.find_spec(m) is None]
    if shutil.which("cmake") is None and importlib.util.find_spec("cmake") is None:
        missing.append("cmake")
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        missing.append("a C++ compiler")
    if missing:
        msg = f"the offline build needs {', '.join(missing)} (pip install -e .[dev] has the Python ones)"
        if IN_CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def cargo_built_library() -> Path:
    """The cargo-built pcsd._envpool this test session imported (the installed package's under CI)."""
    import pcsd

    info = pcsd.native_info()["_envpool"]
    if not info.get("loaded"):
        pytest.fail(f"pcsd._envpool is not loaded here: {info}", pytrace=False)
    return Path(info["path"])


RUST_TOOLS = {"cargo", "rustc", "rustup", "rustdoc", "cargo-clippy", "cargo-fmt"}


def no_cargo_env(tmp: Path) -> dict[str, str]:
    """This environment with cargo out of reach: on PATH, a folder holding cargo is replaced by a
    folder of links to its other programs (cargo may live in /usr/bin beside the compiler);
    CARGO_HOME, RUSTUP_HOME and HOME point to empty folders."""
    env = dict(os.environ)
    dirs = []
    for i, d in enumerate(p for p in env.get("PATH", "").split(os.pathsep) if p):
        if not (Path(d) / "cargo").exists():
            dirs.append(d)
            continue
        farm = tmp / f"path-{i}"
        farm.mkdir(parents=True, exist_ok=True)
        for prog in Path(d).iterdir():
            if prog.name not in RUST_TOOLS and not (farm / prog.name).exists():
                (farm / prog.name).symlink_to(prog)
        dirs.append(str(farm))
    env["PATH"] = os.pathsep.join(dirs)
    for key in ("HOME", "CARGO_HOME", "RUSTUP_HOME"):
        env[key] = str(tmp / key.lower())
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    env.pop("OUT", None)
    env.pop("PCSD_ENVPOOL_LIB", None)
    assert shutil.which("cargo", path=env["PATH"]) is None
    return env


def clean_copy(dst: Path) -> Path:
    """The files a GPU node gets: tracked and untracked-not-ignored ones (no built *.so, no build/)."""
    try:
        names = (
            subprocess.run(
                ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but builds
        names = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file()
            and not any(part in ("build", "target", ".git", "__pycache__") for part in p.relative_to(ROOT).parts)
            and p.suffix != ".so"
        ]
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    need_build_tools()
    tmp = tmp_path_factory.mktemp("gpu-node")
    lib = cargo_built_library()
    carry = tmp / "carry"
    (carry / "wheels").mkdir(parents=True)
    shutil.copy2(lib, carry / "libpcsd_envpool.so")
    src = clean_copy(tmp / "src")
    assert not list((src / "pcsd").glob("*.so"))
    env = no_cargo_env(tmp)
    env.update(PYTHON=sys.executable, PCSD_BENCH_ARGS="--parts op cuda_tests")
    proc = subprocess.run(
        [
            "bash",
            str(src / "tools" / "gpu_node.sh"),
            "--carry",
            str(carry),
            "--out",
            str(tmp / "out"),
            "--work",
            str(tmp / "work"),
            "--dry-run",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    return proc, tmp, lib


def test_offline_build_installs_the_carried_library_without_cargo(node_run):
    proc, tmp, lib = node_run
    install = (tmp / "out" / "install.log").read_text()
    assert proc.returncode == 0, proc.stdout[-4000:] + install[-4000:]
    assert "pcsd._envpool from PCSD_ENVPOOL_LIB=" in install and "(cargo not run)" in install
    assert "Building pcsd._envpool with cargo" not in install
    site = tmp / "work" / "site" / "pcsd"
    assert (site / "_envpool.abi3.so").read_bytes() == lib.read_bytes()
    assert list(site.glob("_C*.so")), "pcsd._C was not compiled"
    # the result imports from the target folder (not from the source tree or this environment's pcsd)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("[gpu_node] pcsd.native_info():"))
    info = json.loads(line.split(":", 1)[1])
    for mod in ("_C", "_envpool"):
        assert info[mod]["loaded"] and info[mod]["path"].startswith(str(tmp / "work" / "site")), info


def test_gpu_node_dry_run_writes_everything_to_one_folder(node_run):
    proc, tmp, _ = node_run
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = tmp / "out"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu.json", "gpu.md", "gpu_node.log", "install.log", "machine.txt"], files
    assert len(files) <= 8  # what the device tool brings back from $OUT
    data = json.loads((out / "gpu.json").read_text())
    assert {p["name"]: p["status"] for p in data["parts"]} == {"op": "pass", "cuda_tests": "skipped"}
    assert data["machine"]["native"]["_C"]["path"].startswith(str(tmp / "work" / "site"))
    log = (out / "gpu_node.log").read_text()
    assert "python -m pcsd.bench gpu" in log and "done in" in log and "bench exit status 0" in log
    machine = (out / "machine.txt").read_text()
    assert "python:" in machine
    assert any(ln.startswith("nvcc: ") for ln in machine.splitlines())  # cmake/pcsd_nvcc.cmake's line


def test_gpu_node_names_a_missing_library(tmp_path):
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "tools" / "gpu_node.sh"),
            "--carry",
            str(tmp_path / "nothing"),
            "--out",
            str(tmp_path / "out"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "libpcsd_envpool.so: no such file; run tools/gpu_node_prepare.sh" in proc.stdout
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_node.sh"), "--bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown argument --bogus" in proc.stderr


@pytest.mark.parametrize("kind", ["missing", "not the extension"])
def test_cmake_refuses_a_bad_envpool_lib_in_one_line(kind, tmp_path):
    need_build_tools()
    import pybind11

    lib = tmp_path / "libpcsd_envpool.so"
    if kind == "not the extension":
        lib.write_bytes(b"\x7fELF not a python extension" * 100)
    cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    proc = subprocess.run(
        [
            cmake,
            "-S",
            str(ROOT),
            "-B",
            str(tmp_path / "b"),
            "-DPCSD_CUDA=off",
            f"-DPCSD_ENVPOOL_LIB={lib}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DPython_EXECUTABLE={sys.executable}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=no_cargo_env(tmp_path),
    )
    assert proc.returncode != 0
    want = "no such file" if kind == "missing" else "not the pcsd._envpool extension"
    assert f"PCSD_ENVPOOL_LIB={lib}: {want}" in " ".join(proc.stderr.split()), proc.stderr[-2000:]


def test_carried_wheels_cover_the_runtime_dependencies_the_node_lacks():
    import re

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    text = (ROOT / "tools" / "gpu_node_wheels.txt").read_text().splitlines()
    node_has = set(next(ln for ln in text if ln.startswith("# node-has:")).split(":", 1)[1].split())
    carried = {ln.split("==")[0].lower() for ln in text if ln and not ln.startswith("#")}
    assert all("==" in ln for ln in text if ln and not ln.startswith("#")), "pin every carried wheel"
    assert names <= node_has | carried, f"not on the node and not carried: {sorted(names - node_has - carried)}"


# ----------------------------------------------------------------------------- where nvcc is found
def _cmake() -> str:
    need_build_tools()
    return shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")


def _fake_nvcc(folder: Path) -> Path:
    """An executable ``folder/nvcc`` (a script: enough for the search, which never runs it)."""
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 0.0 (a stand-in)'\n")
    nvcc.chmod(0o755)
    return nvcc


def find_nvcc(tmp: Path, python: str = sys.executable, **env: str) -> str:
    """``cmake -P cmake/pcsd_nvcc.cmake`` (what tools/gpu_node.sh and CMakeLists.txt use) under
    ``env`` alone (plus HOME), with the system toolkit folder in ``tmp/usr-local-cuda``."""
    proc = subprocess.run(
        [_cmake(), f"-DPYTHON={python}", f"-DPCSD_CUDA_SYSTEM_ROOT={tmp / 'usr-local-cuda'}", "-P"]
        + [str(ROOT / "cmake" / "pcsd_nvcc.cmake")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp), "PATH": str(tmp / "empty"), **env},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # one line, found or not
    return lines[0]


LAYOUTS = {  # where the fake nvcc goes, the environment that names it, and where the line says it came from
    "CUDA_HOME": ("home/bin", lambda t: dict(CUDA_HOME=str(t / "home")), lambda t: "CUDA_HOME"),
    "CUDA_PATH": ("cpath/bin", lambda t: dict(CUDA_PATH=str(t / "cpath")), lambda t: "CUDA_PATH"),
    "PATH": ("somewhere/bin", lambda t: dict(PATH=f"{t / 'empty'}:{t / 'somewhere' / 'bin'}"), lambda t: "PATH"),
    "/usr/local/cuda": ("usr-local-cuda/bin", lambda t: {}, lambda t: str(t / "usr-local-cuda")),
    # NVIDIA's pip packages, through the Python's `nvidia` namespace (PYTHONPATH: a site folder)
    "nvidia-cuda-nvcc 13": (
        "site/nvidia/cu13/bin",
        lambda t: dict(PYTHONPATH=str(t / "site")),
        lambda t: "NVIDIA's pip package, nvidia/cu13",
    ),
    "CUDA 12 wheels": (
        "site/nvidia/cuda_nvcc/bin",
        lambda t: dict(PYTHONPATH=str(t / "site")),
        lambda t: "NVIDIA's pip package, nvidia/cuda_nvcc",
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_nvcc_is_found_in_each_layout(layout, tmp_path):
    where, env, how = LAYOUTS[layout]
    nvcc = _fake_nvcc(tmp_path / where)
    assert find_nvcc(tmp_path, **env(tmp_path)) == f"nvcc: {nvcc} ({how(tmp_path)})"


def test_nvcc_search_order_and_one_line_when_none_is_found(tmp_path):
    # CUDA_HOME first, even with every other layout present; a CUDA_HOME without nvcc is passed over
    for where in ("home/bin", "cpath/bin", "somewhere/bin", "usr-local-cuda/bin", "site/nvidia/cu13/bin"):
        _fake_nvcc(tmp_path / where)
    every = dict(
        CUDA_HOME=str(tmp_path / "home"),
        CUDA_PATH=str(tmp_path / "cpath"),
        PATH=str(tmp_path / "somewhere" / "bin"),
        PYTHONPATH=str(tmp_path / "site"),
    )
    assert find_nvcc(tmp_path, **every).endswith("home/bin/nvcc (CUDA_HOME)")
    every["CUDA_HOME"] = str(tmp_path / "nothing")
    assert find_nvcc(tmp_path, **every).endswith("cpath/bin/nvcc (CUDA_PATH)")
    del every["CUDA_PATH"]
    assert find_nvcc(tmp_path, **every).endswith("somewhere/bin/nvcc (PATH)")
    del every["PATH"]
    assert find_nvcc(tmp_path, **every).endswith("usr-local-cuda/bin/nvcc (" + str(tmp_path / "usr-local-cuda") + ")")
    none = tmp_path / "none"
    none.mkdir()
    line = find_nvcc(none, CUDA_HOME=str(tmp_path / "nothing"))
    assert line == (
        f"nvcc: not found (looked at CUDA_HOME={tmp_path / 'nothing'} (no bin/nvcc), CUDA_PATH unset, PATH, "
        f"{none / 'usr-local-cuda'}/bin, NVIDIA's pip packages of {sys.executable})"
    ), line


def test_a_pip_toolkit_gets_the_runtime_from_lib(tmp_path):
    """NVIDIA's wheels put libraries in lib/ (not lib64/) with no unversioned libcudart.so: the
    build points FindCUDAToolkit at the versioned file; the CUDA 12 wheels' runtime sits apart,
    its headers added to the CUDA flags."""
    cu13 = _fake_nvcc(tmp_path / "nvidia" / "cu13" / "bin")
    (tmp_path / "nvidia" / "cu13" / "lib").mkdir()
    (tmp_path / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(b"")
    (tmp_path / "nvidia" / "cu13" / "include").mkdir()
    (tmp_path / "nvidia" / "cu13" / "include" / "cuda_runtime.h").write_text("")  # nvcc + runtime in one folder
    cu12 = _fake_nvcc(tmp_path / "nvidia" / "cuda_nvcc" / "bin")
    (tmp_path / "nvidia" / "cuda_runtime" / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "cuda_runtime" / "include").mkdir()
    (tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12").write_bytes(b"")
    (tmp_path / "nvidia" / "cuda_runtime" / "include" / "cuda_runtime.h").write_text("")
    lines = []
    for nvcc in (cu13, cu12):
        script = tmp_path / "hints.cmake"
        script.write_text(
            f'include("{ROOT / "cmake" / "pcsd_nvcc.cmake"}")\npcsd_cuda_hints("{nvcc}")\n'
            'execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "${CUDAToolkit_ROOT}|${CUDA_CUDART}|$ENV{CUDAFLAGS}")\n'
        )
        proc = subprocess.run([_cmake(), "-P", str(script)], capture_output=True, text=True, timeout=120, env={})
        assert proc.returncode == 0, proc.stderr
        lines.append(proc.stdout.strip().split("|"))
    nv = tmp_path / "nvidia"
    assert lines[0] == [str(nv / "cu13"), str(nv / "cu13" / "lib" / "libcudart.so.13"), ""]
    assert lines[1] == [
        str(nv / "cuda_nvcc"),
        str(nv / "cuda_runtime" / "lib" / "libcudart.so.12"),
        f" -I{nv / 'cuda_runtime' / 'include'}",
    ]


def test_gpu_node_without_nvcc_stops_in_one_line_before_installing(tmp_path):
    if Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("this machine has /usr/local/cuda/bin/nvcc")
    _cmake()
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "libpcsd_envpool.so").write_bytes(b"")  # never read: the script stops before the install
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "PYTHONPATH", "OUT")}
    env.update(PATH="/usr/bin:/bin", PYTHON=sys.executable)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_node.sh"), "--carry", str(carry), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1
    said = [ln for ln in proc.stdout.splitlines() if "PCSD_CUDA=on and no nvcc" in ln]
    assert len(said) == 1 and "nvcc: not found (looked at CUDA_HOME unset, CUDA_PATH unset, PATH" in said[0], (
        proc.stdout
    )
    assert not (tmp_path / "out" / "install.log").exists()
