#!/usr/bin/env bash
# Executes the CUDA kernels of csrc/pcsd_cuda.cu on the CPU (no GPU, no nvcc needed) through the
# emulation shim in tools/cuda_emu/shim, and compares them with the CPU kernel. Kernel launches
# `k<<<grid, block, shm, stream>>>(args)` are rewritten to `emu::launch(emu::cfg(...), k, args)`
# in a generated copy of the source; nothing else is changed.
#   tools/cuda_emu/run.sh [--quick]
#   tools/cuda_emu/run.sh --module DIR   builds DIR/_C<ext>: pcsd._C with the emulated CUDA kernels
#                                       behind its pcsd_weights_cuda (host pointers; for the test of
#                                       the public call's CUDA path, tests/test_cuda_emulated.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${PCSD_EMU_BUILD:-build/cuda-emu}"
mkdir -p "$OUT"
python3 - "$OUT/pcsd_cuda_emu.cpp" <<'PY'
import re, sys
src = open("csrc/pcsd_cuda.cu").read()
pat = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", re.S)
out, n = pat.subn(lambda m: f"emu::launch(emu::cfg({m.group(2)}), &{m.group(1)}, {m.group(3)});", src)
if n < 4:
    sys.exit(f"expected at least 4 kernel launches in csrc/pcsd_cuda.cu, rewrote {n}")
open(sys.argv[1], "w").write(out)
print(f"[emu] rewrote {n} kernel launches")
PY
FLAGS=(-std=c++20 -pthread -fno-strict-aliasing -Wall -Wno-unused-parameter -Wno-unknown-pragmas
  -Itools/cuda_emu/shim -Icsrc -DPCSD_WITH_CUDA)
if [[ "${1:-}" == "--module" ]]; then
  PY="${PYTHON:-python3}"
  read -r PYBIND PYINC EXT < <("$PY" -c "import pybind11, sysconfig; print(pybind11.get_include(), sysconfig.get_paths()['include'], sysconfig.get_config_var('EXT_SUFFIX'))")
  mkdir -p "$2"
  "${CXX:-g++}" "${FLAGS[@]}" -O1 -shared -fPIC -I"$PYBIND" -I"$PYINC" -DPCSD_VERSION='"emulated"' \
    -DPCSD_CUDA_ARCHS='"emulated"' -DPCSD_COMPILER='"g++"' -DPCSD_BUILD_TYPE='"emulated"' \
    "$OUT/pcsd_cuda_emu.cpp" csrc/pcsd_cpu.cpp csrc/bindings.cpp -o "$2/_C$EXT"
  echo "[emu] built $2/_C$EXT"
  exit 0
fi
"${CXX:-g++}" "${FLAGS[@]}" -O2 -g \
  "$OUT/pcsd_cuda_emu.cpp" csrc/pcsd_cpu.cpp tools/cuda_emu/emu_test.cpp -o "$OUT/emu_test"
"$OUT/emu_test" "$@"
