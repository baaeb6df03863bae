#!/usr/bin/env bash
# Sets up and builds fmha (scripts/setup.sh), then runs every test: the C++ suites through CTest
# (GPU tests skip themselves without a GPU) and the Python package's tests where present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${FMHA_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
if [ -x scripts/test_python.sh ]; then scripts/test_python.sh; fi
