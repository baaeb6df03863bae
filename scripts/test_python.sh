#!/usr/bin/env bash
# The Python package's tests: builds and installs `fmha` (pip install .) into a virtual
# environment under build/, with NumPy, pytest and the build tools from PyPI, then runs pytest.
# The GPU and framework tests (PyTorch, CuPy, JAX) skip themselves where those are missing.
# FMHA_PY_CUDA=OFF (the default where no GPU is visible) builds the extension CPU-only.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FMHA_VENV:-build/venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" 2>/dev/null || {
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$VENV"
  }
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --disable-pip-version-check numpy pytest ml_dtypes "scikit-build-core>=0.10" "nanobind>=2.4"
cuda=${FMHA_PY_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; else cuda=OFF; fi
fi
CMAKE_BUILD_PARALLEL_LEVEL=${FMHA_JOBS:-$(nproc)} "$PY" -m pip install -q --disable-pip-version-check \
  --no-build-isolation . -C cmake.define.FMHA_CUDA="$cuda"
"$PY" -m pytest tests/python -q -rs
