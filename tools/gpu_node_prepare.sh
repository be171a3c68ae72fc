#!/usr/bin/env bash
# Fill the folder tools/gpu_node.sh carries to an offline GPU node (docs/gpu.md), on a machine with
# cargo and network (x86-64 Linux, as the node):
#
#   bash tools/gpu_node_prepare.sh [DIR]          # default .gpu-node/ (git-ignored)
#
#   DIR/libpcsd_envpool.so   the Rust crate, `cargo build --release --locked --features extension-module`:
#                            PyO3 with abi3-py310, so this one build loads on the node's CPython 3.12
#   DIR/wheels/*.whl         tools/gpu_node_wheels.txt, for CPython 3.12 manylinux x86-64 (pip download)
#   DIR/MANIFEST.txt         commit, toolchain, sizes, sha256, the newest glibc symbol the library needs
#
# Then it prints the sizes against the 64 MiB that may travel with the repository.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu-node}"
PY="${PYTHON:-python3}"
cd "$ROOT"
command -v cargo >/dev/null 2>&1 || { echo "tools/gpu_node_prepare.sh: cargo not found (install Rust from rustup.rs)" >&2; exit 2; }
grep -Eq '^pyo3 = .*abi3-py3' rust_envpool/Cargo.toml || {
  echo "tools/gpu_node_prepare.sh: rust_envpool/Cargo.toml's pyo3 has no abi3-py3x feature: the library would load on one Python version only" >&2; exit 2; }
mkdir -p "$DIR/wheels"
rm -f "$DIR"/wheels/*.whl

echo "[prepare] cargo build --release --locked --features extension-module (a few minutes)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/build/gpu-node-cargo}"
PYO3_PYTHON="$(command -v "$PY")" CARGO_TARGET_DIR="$TARGET" \
  cargo build --release --locked --features extension-module --manifest-path rust_envpool/Cargo.toml
cp "$TARGET/release/libpcsd_envpool.so" "$DIR/libpcsd_envpool.so"
strip --strip-unneeded "$DIR/libpcsd_envpool.so" 2>/dev/null || true
# the library must be the extension, link no libpython (abi3) and load here
if readelf -d "$DIR/libpcsd_envpool.so" | grep -q 'NEEDED.*libpython'; then
  echo "tools/gpu_node_prepare.sh: libpcsd_envpool.so links libpython: not an abi3 extension" >&2; exit 1
fi
"$PY" - "$DIR/libpcsd_envpool.so" <<'EOF'
import importlib.machinery, importlib.util, sys
spec = importlib.util.spec_from_file_location("_envpool", sys.argv[1],
                                              loader=importlib.machinery.ExtensionFileLoader("_envpool", sys.argv[1]))
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
print(f"[prepare] libpcsd_envpool.so loads as _envpool {m.version()} under Python {sys.version.split()[0]}")
EOF

echo "[prepare] pip download (CPython 3.12, manylinux x86-64): $(grep -v '^#' tools/gpu_node_wheels.txt | tr '\n' ' ')"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR/wheels" -r <(grep -v '^#' tools/gpu_node_wheels.txt)

glibc="$(objdump -T "$DIR/libpcsd_envpool.so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
{
  echo "made by tools/gpu_node_prepare.sh on $(date -u +%FT%TZ), $(uname -m), commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "toolchain: $(cargo --version); $(rustc --version)"
  echo "libpcsd_envpool.so needs glibc >= ${glibc#GLIBC_}"
  (cd "$DIR" && find . -type f ! -name MANIFEST.txt | sort | while read -r f; do
     printf '%10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "$f"; done)
} > "$DIR/MANIFEST.txt"
cat "$DIR/MANIFEST.txt"
carried=$(du -sb "$DIR" | cut -f1)
repo=$(git archive HEAD | wc -c)
echo "[prepare] carried folder $((carried / 1024)) KiB + repository (git archive HEAD) $((repo / 1024)) KiB = $(((carried + repo) / 1048576)) MiB of the 64 MiB that travel"
