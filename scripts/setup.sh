#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build and test fmha, then configures and
# builds it in ./build (CUDA backends too where nvcc is found). Safe to run again: it installs
# only what is missing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3 python3-pip python3-venv)
command -v pkg-config >/dev/null || need+=(pkg-config)
for pkg in libgtest-dev libcli11-dev nlohmann-json3-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# nvcc is often installed outside PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

BUILD_DIR=${FMHA_BUILD_DIR:-build}
JOBS=${FMHA_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FMHA_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
