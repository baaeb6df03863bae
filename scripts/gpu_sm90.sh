#!/usr/bin/env bash
# The sm90 (Hopper) tier's checks in one run, from the repository root on an H100/H200:
#   build    configure + build for sm_90a (-Xptxas -v)                   -> $OUT/build.log
#   sass     every sm90 kernel shows HGMMA and no local-memory traffic   -> $OUT/sass.log
#   tests    tile ops, then the kernel suite's sm90 cases vs the fp64 oracle, the refusals, the
#            edge cases and the 2^31-element view                         -> $OUT/sm90_tests.log
#   variants the sm90 kernel cases again under each non-default FMHA_SM90_FWD_CONFIG
#   sanitize compute-sanitizer memcheck, racecheck, synccheck on the small sm90 cases (both directions)
#   bench    `fmha bench --sweep fa`, bf16, forward and backward (BENCH_MODES), on sm90 and sm80
#            (BENCH_BACKENDS; the sm90 backward covers head dims up to 128) -> $OUT/bench_*.csv
# Environment: BENCH_BACKENDS (default "sm90 sm80"), BENCH_VARIANTS (sm90 forward variants benched
# besides the default, default none), OUT (default ./out), BUILD (default ./build-sm90), HEAD_DIMS (default all),
# STEPS (default "build sass tests variants sanitize bench"), JOBS (default nproc), VARIANTS (the
# non-default forward variants the variants step runs, default "overlap serial poly8").
set -u -o pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-$PWD/build-sm90}
JOBS=${JOBS:-$(nproc)}
HEAD_DIMS=${HEAD_DIMS:-"32;64;96;128;192;256"}
STEPS=${STEPS:-"build sass tests variants sanitize bench"}
mkdir -p "$OUT"
status=0
step() { echo "== $* ($(date +%T))"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
SM90_FILTER='*sm90*:Refuse.*:Edge.*:LargeOffsets.Sm90*'

if want build; then
  step "configure + build (-j$JOBS)"
  start=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS="$HEAD_DIMS" \
    -DFMHA_PTXAS_VERBOSE=ON -DCMAKE_CUDA_FLAGS=-lineinfo > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  if ! ninja -C "$BUILD" -j"$JOBS" fmha_cli fmha_gpu_tests fmha_tile_tests fmha_tile_sm90_tests >> "$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -40
    exit 1
  fi
  echo "   built in $(( $(date +%s) - start )) s"
  grep -A2 "Compiling entry function '_ZN4fmha4cuda4sm90" "$OUT/build.log" | grep -E "stack frame|registers" | sort | uniq -c | head
fi

if want sass; then
  step "SASS of the sm90 kernels -> $OUT/sass.log"
  scripts/check_sass.sh "$BUILD/CMakeFiles/fmha_cuda_sm90.dir" > "$OUT/sass.log" 2>&1 || status=1
  tail -4 "$OUT/sass.log"
fi

if want tests; then
  step "sm90 tests -> $OUT/sm90_tests.log"
  "$BUILD/tests/gpu/fmha_tile_tests" --gtest_color=no > "$OUT/sm90_tests.log" 2>&1 || status=1
  "$BUILD/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no >> "$OUT/sm90_tests.log" 2>&1 || status=1
  timeout 400 "$TESTS" --gtest_color=no --gtest_filter="$SM90_FILTER" >> "$OUT/sm90_tests.log" 2>&1 || status=1
  grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran|Failure" "$OUT/sm90_tests.log" | head -30
fi

if want variants; then
  for v in ${VARIANTS:-overlap serial poly8}; do
    step "sm90 kernel tests under FMHA_SM90_FWD_CONFIG=$v"
    echo "---- FMHA_SM90_FWD_CONFIG=$v" >> "$OUT/sm90_tests.log"
    FMHA_SM90_FWD_CONFIG=$v timeout 300 "$TESTS" --gtest_color=no --gtest_filter='*Kernel.Forward/*sm90*' \
      >> "$OUT/sm90_tests.log" 2>&1 || status=1
    tail -3 "$OUT/sm90_tests.log"
  done
fi

if want sanitize; then
  step "compute-sanitizer -> $OUT/sanitize.log"
  : > "$OUT/sanitize.log"
  for tool in memcheck racecheck synccheck; do
    echo "---- $tool" >> "$OUT/sanitize.log"
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 1 "$TESTS" --gtest_color=no \
      --gtest_filter='*Small_sm90*_q15_k63_*:*Small_sm90*_q65_k63_*' >> "$OUT/sanitize.log" 2>&1 \
      || { status=1; echo "   $tool: FAILED"; }
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran" "$OUT/sanitize.log" | tail -2
  done
fi

if want bench; then
  step "fmha bench --sweep fa, forward -> $OUT/bench_*.csv"
  for backend in ${BENCH_BACKENDS:-sm90 sm80}; do
    for mode in ${BENCH_MODES:-fwd bwd}; do
      "$BUILD/fmha" bench --sweep fa --backend "$backend" --mode "$mode" --dtype bf16 --iters 10 \
        > "$OUT/bench_fa_${mode}_${backend}.csv" 2>> "$OUT/bench.err" || status=1
    done
  done
  for v in ${BENCH_VARIANTS:-}; do
    FMHA_SM90_FWD_CONFIG=$v "$BUILD/fmha" bench --sweep fa --backend sm90 --mode fwd --dtype bf16 --iters 10 \
      > "$OUT/bench_fa_fwd_sm90_${v}.csv" 2> "$OUT/bench_sm90_${v}.err" || status=1
  done
  "$BUILD/fmha" bench --sweep seed --backend sm90 --mode fwd --dtype bf16 --iters 20 > "$OUT/bench_seed_sm90.csv" 2>&1
  for f in "$OUT"/bench_fa_*.csv; do echo "-- $f"; head -40 "$f"; done
fi

exit $status
