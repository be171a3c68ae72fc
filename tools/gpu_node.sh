#!/usr/bin/env bash
# Install pcsd on a bare GPU node and prove the GPU path, in one command (docs/gpu.md):
#
#   bash tools/gpu_node.sh [--carry DIR] [--out DIR] [--work DIR] [--dry-run]
#
# The node: x86-64, Python 3.12 with torch (CUDA), transformers, nvcc, cmake, ninja, pybind11 and
# scikit-build-core; no network, no cargo, no vLLM, no omegaconf. nvcc is found as the build finds it
# (cmake/pcsd_nvcc.cmake): CUDACXX, else CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda, then NVIDIA's
# pip packages of $PYTHON (nvidia-cuda-nvcc: nvidia/cu13/bin/nvcc, its libraries in lib/); the one
# found is named in machine.txt and passed to the build as CUDACXX. What it lacks comes in the carried
# folder (default .gpu-node/, filled here by tools/gpu_node_prepare.sh): the Rust library
# libpcsd_envpool.so (abi3: built once, loads on any CPython >= 3.10) and wheels/ (pure-Python
# dependencies the node lacks, tools/gpu_node_wheels.txt). Steps:
#   1. the machine (nvidia-smi, nvcc, python, packages) -> machine.txt
#   2. the wheels, then `PCSD_ENVPOOL_LIB=<carried lib> PCSD_CUDA=on pip install --no-build-isolation
#      --no-deps --no-index --target <site> .` (compiles pcsd._C with nvcc, archs 80 and 90; cargo is not
#      run) -> install.log; the imports and pcsd.native_info() checked
#   3. python -m pcsd.bench gpu --out <out> (every part: the op, the fused loss, the updates, hf/vLLM
#      generation, a whole python -m pcsd.train with a bit-identical resume (train), and last pytest -m
#      cuda) -> gpu.json, gpu.md, train.log, cuda-tests.log
# Everything goes to one folder: --out, else $OUT (the device tool's), else ./gpu-node-out; the whole
# console output is gpu_node.log there. Install + bench inside 8 minutes: the bench gets what is left
# of PCSD_NODE_BUDGET seconds (default 480) after the install, at least 60 (PCSD_BENCH_TIMEOUT
# overrides it); PCSD_BENCH_ARGS adds arguments to it (e.g. "--parts vllm cuda_tests" for a rerun).
# The install goes to a temporary folder, removed at the end (--work DIR: there, kept).
# Exit status: 0 when the install and every bench part passed.
#
# --dry-run: the same install and bench on a machine without a GPU (PCSD_CUDA=auto, the bench with
# --device cpu --small): the CPU test of this script (tests/test_gpu_node.py).
# PYTHON (default python3) is the interpreter that installs and runs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.gpu-node"
OUT_DIR="${OUT:-$ROOT/gpu-node-out}"
DRY=0
WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --carry) CARRY="${2:?--carry needs a folder}"; shift 2 ;;
    --out) OUT_DIR="${2:?--out needs a folder}"; shift 2 ;;
    --work) WORK="${2:?--work needs a folder}"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "tools/gpu_node.sh: unknown argument $1 (expected --carry DIR, --out DIR, --work DIR, --dry-run)" >&2
       exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
CARRY="$(cd "$CARRY" 2>/dev/null && pwd || echo "$CARRY")"
exec > >(tee -a "$OUT_DIR/gpu_node.log") 2>&1
TEE_PID=$!
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT  # the log is whole when the script returns
log() { printf '[gpu_node] %s\n' "$*"; }
die() { printf 'tools/gpu_node.sh: %s\n' "$*"; exit 1; }
T0=$SECONDS

# ---------------------------------------------------------------- what was carried
LIB="$CARRY/libpcsd_envpool.so"
[ -f "$LIB" ] || die "$LIB: no such file; run tools/gpu_node_prepare.sh on a machine with cargo and network, then carry $CARRY"
command -v "$PY" >/dev/null 2>&1 || die "PYTHON=$PY: not found"
KEEP=1
if [ -z "$WORK" ]; then WORK="$(mktemp -d "${TMPDIR:-/tmp}/pcsd-gpu-node.XXXXXX")"; KEEP=0; fi
mkdir -p "$WORK" || exit 2
WORK="$(cd "$WORK" && pwd)"
SITE="$WORK/site"
log "repository $ROOT, carried $CARRY, output $OUT_DIR, work $WORK"

# ---------------------------------------------------------------- 1. the machine (and nvcc)
if [ "$DRY" = 1 ]; then CUDA_MODE="${PCSD_CUDA:-auto}"; else CUDA_MODE="${PCSD_CUDA:-on}"; fi
CMAKE_BIN="$(command -v cmake || "$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null)"
NVCC_LINE="nvcc: not looked for (no cmake on PATH or as $PY's cmake package)"
if [ -n "${CUDACXX:-}" ]; then
  NVCC_LINE="nvcc: $CUDACXX (CUDACXX)"
elif [ -n "$CMAKE_BIN" ]; then
  NVCC_LINE="$("$CMAKE_BIN" -DPYTHON="$PY" -P "$ROOT/cmake/pcsd_nvcc.cmake" 2>&1 | tail -1)"
  case "$NVCC_LINE" in
    "nvcc: /"*) export CUDACXX="${NVCC_LINE#nvcc: }"; CUDACXX="${CUDACXX% (*}" ;;
  esac
fi
log "$NVCC_LINE"
if [ "$CUDA_MODE" = on ] && [ -z "${CUDACXX:-}" ]; then
  die "PCSD_CUDA=on and no nvcc: $NVCC_LINE; set CUDA_HOME (or CUDACXX) or pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl"
fi
{
  echo "date: $(date -u +%FT%TZ)"; echo "uname: $(uname -a)"
  echo "python: $("$PY" -c 'import sys; print(sys.version.replace(chr(10), " "))')"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi || echo "nvidia-smi: not found"
  echo "$NVCC_LINE"
  [ -n "${CUDACXX:-}" ] && "$CUDACXX" --version
  command -v cmake >/dev/null 2>&1 && cmake --version | head -1 || echo "cmake: not on PATH"
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|numpy|scikit.build.core|pybind11|cmake|ninja|rich|tensorboard|matplotlib|scipy|omegaconf|vllm|flash.attn|pytest|hypothesis) '
  [ -f "$CARRY/MANIFEST.txt" ] && { echo "--- $CARRY/MANIFEST.txt"; cat "$CARRY/MANIFEST.txt"; }
} > "$OUT_DIR/machine.txt" 2>&1
log "machine: $(grep -m1 -E 'NVIDIA|nvidia-smi' "$OUT_DIR/machine.txt" || true)"

# ---------------------------------------------------------------- 2. install
if [ "$DRY" = 1 ]; then BENCH_ARGS=(--device cpu --small); else BENCH_ARGS=(); fi
{
  shopt -s nullglob
  wheels=("$CARRY"/wheels/*.whl)
  if [ ${#wheels[@]} -gt 0 ]; then
    echo "+ pip install --no-index --no-deps --target $SITE ${wheels[*]}"
    "$PY" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" "${wheels[@]}" || exit 1
  fi
  echo "+ PCSD_ENVPOOL_LIB=$LIB PCSD_CUDA=$CUDA_MODE pip install --no-build-isolation --no-deps --no-index --target $SITE $ROOT"
  PCSD_ENVPOOL_LIB="$LIB" PCSD_CUDA="$CUDA_MODE" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check --target "$SITE" -C build-dir="$WORK/build" "$ROOT" || exit 1
} > "$OUT_DIR/install.log" 2>&1
status=$?
grep -E '^(  )?-- pcsd:|Successfully installed|error|Error' "$OUT_DIR/install.log" | head -20
[ $status -eq 0 ] || die "the install failed after $((SECONDS - T0)) s; the last lines of $OUT_DIR/install.log:
$(tail -25 "$OUT_DIR/install.log")"
log "installed into $SITE in $((SECONDS - T0)) s"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 1
# -P: the installed package, not the source tree of the current folder
"$PY" -P - "$CUDA_MODE" "$SITE" <<'EOF' || die "the installed package does not import as it must (above)"
import importlib.util, json, sys
mode, site = sys.argv[1], sys.argv[2]
need = ["numpy", "torch", "transformers", "tokenizers", "omegaconf", "rich", "tensorboard", "matplotlib", "scipy",
        "safetensors", "yaml", "pytest", "hypothesis"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (add their wheels to tools/gpu_node_wheels.txt)")
import pcsd
info = pcsd.native_info()
print("[gpu_node] pcsd.native_info():", json.dumps(info))
bad = [k for k in ("_C", "_envpool") if not info[k].get("loaded") or not str(info[k].get("path", "")).startswith(site)]
if bad:
    sys.exit(f"{', '.join(bad)} not loaded from {site}")
if mode == "on" and not info["_C"]["cuda_kernels"]:
    sys.exit("PCSD_CUDA=on, but pcsd._C has no CUDA kernels")
EOF

# ---------------------------------------------------------------- 3. the bench (and pytest -m cuda)
# shellcheck disable=SC2206  # PCSD_BENCH_ARGS: words, split on purpose
BENCH_ARGS+=(${PCSD_BENCH_ARGS:-})
LEFT=$(( ${PCSD_NODE_BUDGET:-480} - (SECONDS - T0) ))
[ "$LEFT" -lt 60 ] && LEFT=60
BENCH_TIMEOUT="${PCSD_BENCH_TIMEOUT:-$LEFT}"
log "python -m pcsd.bench gpu --out $OUT_DIR ${BENCH_ARGS[*]} (at most $BENCH_TIMEOUT s)"
timeout "$BENCH_TIMEOUT" "$PY" -P -m pcsd.bench gpu --out "$OUT_DIR" "${BENCH_ARGS[@]}"
bench=$?
[ $bench -eq 124 ] && log "the bench ran past its $BENCH_TIMEOUT s (PCSD_NODE_BUDGET / PCSD_BENCH_TIMEOUT) and was stopped"
log "done in $((SECONDS - T0)) s (bench exit status $bench); files: $(cd "$OUT_DIR" && ls | tr '\n' ' ')"
[ "$KEEP" = 1 ] || rm -rf "$WORK"
exit $bench
