#!/usr/bin/env bash
# The GPU checks in priority order, each step time-boxed so the whole run fits a short time
# budget (run from the repository root; results under $R, default /tmp/r):
# build -> GPU kernel and tile tests -> compute-sanitizer (memcheck, racecheck) on small cases of
# every kernel -> fmha bench (seed) -> the Python package (install, tests one process per file,
# per-call overhead) -> fmha bench (FlashAttention's bf16 sweep).
set -u
R=${R:-/tmp/r}
B=${BUILD:-build-gpu-check}
mkdir -p "$R"
export PYTHONUNBUFFERED=1
log() { echo "$* ($(date +%T))" | tee -a "$R/console.log"; }
STEPS=build OUT="$R" bash scripts/gpu_check.sh >> "$R/console.log" 2>&1; log "build rc=$?"
timeout 130 "$B/tests/gpu/fmha_gpu_tests" --gtest_color=no > "$R/gpu_tests.log" 2>&1; log "gpu tests rc=$?"
timeout 20 "$B/tests/gpu/fmha_tile_tests" --gtest_color=no > "$R/tile_tests.log" 2>&1; log "tile tests rc=$?"
for tool in memcheck racecheck; do
  timeout 35 compute-sanitizer --tool $tool --error-exitcode 99 "$B/tests/gpu/fmha_gpu_tests" --gtest_color=no \
    --gtest_filter='*Small_*_q15_k63_*:*Deterministic*' >> "$R/sanitize.log" 2>&1
  log "$tool rc=$?"
done
timeout 30 "$B/fmha" bench --sweep seed --no-progress --csv "$R/bench_seed.csv" > "$R/bench_seed.txt" 2>&1
log "bench seed rc=$?"
timeout 80 python3 -m pip install --no-build-isolation --no-deps . -C cmake.define.FMHA_CUDA_ARCHS=90 \
  -C build-dir=build/py-gpu > "$R/python_build.log" 2>&1
log "pip install rc=$?"
for spec in frameworks:40 numpy:30 torch:80; do
  timeout "${spec#*:}" python3 -X faulthandler -m pytest "tests/python/test_${spec%%:*}.py" -v -rs \
    -p no:cacheprovider >> "$R/python_tests.log" 2>&1
  log "pytest ${spec%%:*} rc=$?"
done
timeout 15 python3 bench/python_overhead.py --iterations 5000 > "$R/python_overhead.txt" 2>&1
log "overhead rc=$?"
timeout 60 "$B/fmha" bench --sweep fa --dtype bf16 --no-progress --csv "$R/bench_fa.csv" > "$R/bench_fa.txt" 2>&1
log "bench fa rc=$?"
