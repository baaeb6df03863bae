#!/usr/bin/env bash
# Sets up and builds fmha (scripts/setup.sh), then runs `fmha run` with the given flags: by default
# the seed benchmark's shape (B=4, H=4, S=4096, D=64, fp32) on the GPU, or on the CPU without one.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${FMHA_BUILD_DIR:-build}/fmha" run "$@"
