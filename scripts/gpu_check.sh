#!/usr/bin/env bash
# All GPU checking of fmha in one run, from the repository root on a CUDA machine:
#   1. configure + build (Release, FMHA_CUDA_ARCHS=90 by default, every head dim, -lineinfo);
#   2. the GPU tests                              -> $OUT/gpu_tests.log
#   3. compute-sanitizer memcheck, racecheck, synccheck over a small test of every kernel
#                                                 -> $OUT/sanitize.log (must say 0 errors)
#   4. timings of the seed shape and FlashAttention's bf16 sweep -> $OUT/bench.csv and stdout.
# Environment: OUT (output dir, default ./out), ARCHS (default 90), JOBS (default nproc),
# FMHA_TEST_SEED (repeat a failing run's inputs).
set -u -o pipefail
OUT=${OUT:-$PWD/out}
ARCHS=${ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-$PWD/build-gpu-check}
mkdir -p "$OUT"
status=0
step() { echo "== $* ($(date +%T))"; }

step "configure"
# The GPU tests live in tests/gpu; hook them in if tests/CMakeLists.txt does not yet.
if ! grep -q 'add_subdirectory(gpu)' tests/CMakeLists.txt; then
  echo 'add_subdirectory(gpu)' >> tests/CMakeLists.txt
  echo "   (added add_subdirectory(gpu) to tests/CMakeLists.txt in this checkout)"
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS="$ARCHS" \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DFMHA_BUILD_TESTS=ON > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

step "build (-j$JOBS)"
start=$(date +%s)
if ! ninja -C "$BUILD" -j"$JOBS" fmha fmha_gpu_tests fmha_tile_tests >> "$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  exit 1
fi
g++ -O2 -std=c++17 bench/fmha_bench.cpp -Iinclude -I"${CUDA_HOME:-/usr/local/cuda}/include" "$BUILD/libfmha.a" \
  -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart -lpthread -o "$BUILD/fmha_bench" >> "$OUT/build.log" 2>&1 || {
  echo "bench build failed"; status=1; }
echo "   built in $(( $(date +%s) - start )) s"
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"

step "GPU tests -> $OUT/gpu_tests.log"
"$BUILD/tests/gpu/fmha_tile_tests" --gtest_color=no > "$OUT/gpu_tests.log" 2>&1 || status=1
"$TESTS" --gtest_color=no >> "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests ran" "$OUT/gpu_tests.log" | head -60

step "compute-sanitizer -> $OUT/sanitize.log"
# One small case per kernel: forward of every tier/dtype, backward (preprocess, main, convert),
# the deterministic dQ kernel, empty problems.
FILTER='*Small_*_q15_k63_*:*Deterministic*:Edge.*'
: > "$OUT/sanitize.log"
for tool in memcheck racecheck synccheck; do
  echo "---- $tool" >> "$OUT/sanitize.log"
  compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" --gtest_filter="$FILTER" --gtest_color=no \
    >> "$OUT/sanitize.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | tail -1)
  echo "   $tool: exit $rc; $summary"
  [ $rc -ne 0 ] && status=1
done

step "benchmarks -> $OUT/bench.csv"
if [ -x "$BUILD/fmha_bench" ]; then
  timeout 300 "$BUILD/fmha_bench" "$OUT/bench.csv" || status=1
fi

step "done (status $status)"
exit $status
