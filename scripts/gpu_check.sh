#!/usr/bin/env bash
# All GPU checking of fmha in one run, from the repository root on a CUDA machine:
#   1. configure + build (Release, FMHA_CUDA_ARCHS=90 by default, every head dim, -lineinfo);
#   2. the GPU tests (tile ops, then kernels vs the fp64 oracle)   -> $OUT/gpu_tests.log
#      and the simt backward tests again under each non-default FMHA_SIMT_BWD_CONFIG variant
#   3. `fmha run --check` on each GPU tier, forward and backward, dense and packed -> $OUT/cli_checks.log
#   4. compute-sanitizer memcheck, racecheck, synccheck over a small test of every kernel,
#      and of the simt backward under each non-default variant      -> $OUT/sanitize.log
#   5. `fmha bench`: the seed sweep and FlashAttention's bf16 sweep -> $OUT/bench_*.csv
# Environment: OUT (output dir, default ./out), ARCHS (default 90), JOBS (default nproc),
# FMHA_TEST_SEED (repeat a failing run's inputs), STEPS (default "build tests cli sanitize bench"),
# SIMT_BWD_VARIANTS (the non-default simt backward variants to test, default "micro"; empty: none),
# SHARDS (test processes run at once, default one per core), TEST_TIMEOUT (seconds per shard,
# default 420; a shard cut by it ends without gtest's summary and is reported as exit 124).
# PREBUILT: a folder of binaries built on another machine (fmha_gpu_tests and fmha, each maybe
# .xz-compressed, and fmha_tile_tests), put into $BUILD before the steps, so that a GPU machine
# spends no time building (STEPS="tests cli"). `bash scripts/gpu_check.sh pack <build dir>
# [folder]` makes one (default build-bin/carry): the binaries stripped and compressed, about
# 20 MB each for the suite and the CLI from a build of every kernel for sm_80 and sm_90a.
set -u -o pipefail
if [[ "${1:-}" == pack ]]; then
  src=${2:?usage: gpu_check.sh pack <build dir> [folder]}
  dst=${3:-build-bin/carry}
  mkdir -p "$dst"
  strip -o "$dst/fmha_tile_tests" "$src/tests/gpu/fmha_tile_tests" || exit 1
  strip -o "$dst/fmha_gpu_tests" "$src/tests/gpu/fmha_gpu_tests" || exit 1
  xz -T0 -6 -f "$dst/fmha_gpu_tests" || exit 1
  if [[ -f "$src/fmha" ]]; then strip -o "$dst/fmha" "$src/fmha" && xz -T0 -6 -f "$dst/fmha" || exit 1; fi
  du -sh "$dst"
  exit 0
fi
OUT=${OUT:-$PWD/out}
ARCHS=${ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-$PWD/build-gpu-check}
STEPS=${STEPS:-"build tests cli sanitize bench"}
SIMT_BWD_VARIANTS=${SIMT_BWD_VARIANTS-"micro"}
SHARDS=${SHARDS:-$(nproc)}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}
SIMT_BWD_FILTER='*Kernel.Backward/*_simt_*:*Deterministic*'
mkdir -p "$OUT"
status=0
step() { echo "== $* ($(date +%T))"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
FMHA="$BUILD/fmha"
if [[ -n "${PREBUILT:-}" ]]; then
  mkdir -p "$BUILD/tests/gpu"
  cp "$PREBUILT/fmha_tile_tests" "$BUILD/tests/gpu/" || exit 1
  for pair in "fmha_gpu_tests:$TESTS" "fmha:$FMHA"; do
    name=${pair%%:*} to=${pair#*:}
    if [[ -f "$PREBUILT/$name.xz" ]]; then xz -dc "$PREBUILT/$name.xz" > "$to" || exit 1
    elif [[ -f "$PREBUILT/$name" ]]; then cp "$PREBUILT/$name" "$to" || exit 1; fi
    [[ -f "$to" ]] && chmod +x "$to"
  done
  chmod +x "$BUILD/tests/gpu/fmha_tile_tests"
fi

if want build; then
  step "configure + build (-j$JOBS)"
  start=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS="$ARCHS" \
    -DCMAKE_CUDA_FLAGS=-lineinfo > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  if ! ninja -C "$BUILD" -j"$JOBS" >> "$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -40
    exit 1
  fi
  echo "   built in $(( $(date +%s) - start )) s"
fi

if want tests; then
  step "GPU tests -> $OUT/gpu_tests.log"
  "$BUILD/tests/gpu/fmha_tile_tests" --gtest_color=no > "$OUT/gpu_tests.log" 2>&1 || status=1
  # The suite in SHARDS processes at once: the fp64 oracle on the host is most of its time.
  pids=()
  for ((i = 0; i < SHARDS; ++i)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout "$TEST_TIMEOUT" "$TESTS" --gtest_color=no \
      > "$OUT/gpu_tests.shard$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < SHARDS; ++i)); do
    wait "${pids[$i]}"
    rc=$?
    (( rc == 0 )) || { status=1; echo "   shard $i: exit $rc$( ((rc == 124)) && echo ' (cut by TEST_TIMEOUT)')"; }
    cat "$OUT/gpu_tests.shard$i" >> "$OUT/gpu_tests.log"
    rm -f "$OUT/gpu_tests.shard$i"
  done
  for v in $SIMT_BWD_VARIANTS; do
    echo "---- FMHA_SIMT_BWD_CONFIG=$v" >> "$OUT/gpu_tests.log"
    FMHA_SIMT_BWD_CONFIG=$v timeout 300 "$TESTS" --gtest_color=no --gtest_filter="$SIMT_BWD_FILTER" \
      >> "$OUT/gpu_tests.log" 2>&1 || status=1
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests ran|Failure" "$OUT/gpu_tests.log" | head -40
fi

if want cli; then
  step "fmha run --check on the GPU tiers -> $OUT/cli_checks.log"
  : > "$OUT/cli_checks.log"
  while read -r args; do
    echo "\$ fmha run $args" >> "$OUT/cli_checks.log"
    "$FMHA" run $args --check --iters 3 >> "$OUT/cli_checks.log" 2>&1 || { status=1; echo "   FAIL: $args"; }
  done <<'CASES'
--backend simt --mode fwd
--backend simt --mode bwd
--backend simt --mode bwd --deterministic --causal bottom-right --heads 8 --kv-heads 2 --seqlen-q 1000 --seqlen-k 3000
--backend sm80 --dtype tf32 --mode fwd
--backend sm80 --dtype bf16 --mode fwd --causal bottom-right --window 300,0 --q-offset 5
--backend sm80 --dtype fp16 --mode bwd --heads 8 --kv-heads 1 --seqlen-q 777 --seqlen-k 1500 --head-dim 128
--backend sm80 --dtype bf16 --mode bwd --head-dim 256 --seqlen-q 513
--backend sm80 --dtype bf16 --mode bwd --deterministic --causal bottom-right --heads 8 --kv-heads 2 --seqlen-q 1000 --seqlen-k 3000 --head-dim 192
--backend sm80 --dtype tf32 --mode bwd --heads 4 --kv-heads 2 --seqlen-q 333 --seqlen-k 700 --window 100,20
--dtype bf16 --mode bwd --head-dim 96 --head-dim-v 64 --seqlen-q 300 --causal top-left
--backend simt --mode fwd --seqlens-q 100,0,1,2000,37 --seqlens-k 120,5,1,2000,0 --causal bottom-right
--backend simt --mode bwd --seqlens-q 100,0,1,2000,37 --seqlens-k 120,5,1,2000,0 --causal top-left --heads 8 --kv-heads 2
--backend sm80 --dtype bf16 --mode fwd --seqlens-q 100,0,1,2000,37 --seqlens-k 120,5,1,2000,0 --window 64,16
--backend sm80 --dtype fp16 --mode bwd --seqlens-q 100,0,1,2000,37 --seqlens-k 120,5,1,2000,0 --causal bottom-right --head-dim 128
--backend sm80 --dtype bf16 --mode bwd --deterministic --seqlens-q 513,1,77 --seqlens-k 600,1,0 --causal bottom-right --heads 8 --kv-heads 1
--dtype bf16 --mode bwd --seqlens-q 300,20 --seqlens-k 300,500 --head-dim 96 --head-dim-v 64 --causal top-left
CASES
  grep -E "check:|FAIL|error" "$OUT/cli_checks.log" | head -20
fi

if want sanitize; then
  step "compute-sanitizer -> $OUT/sanitize.log"
  # One small case per kernel: forward of every tier/dtype, backward (preprocess, main, convert),
  # the deterministic dQ kernel, empty problems.
  # Packed calls: the broken-table test and one case per flavor of the varlen suite.
  FILTER='*Small_*_q15_k63_*:*Deterministic*:Edge.*:Varlen.*:*VarlenKernel*causalBR_varlen8*'
  : > "$OUT/sanitize.log"
  for tool in memcheck racecheck synccheck; do
    echo "---- $tool" >> "$OUT/sanitize.log"
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" --gtest_filter="$FILTER" --gtest_color=no \
      >> "$OUT/sanitize.log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | tail -1)
    echo "   $tool: exit $rc; $summary"
    [ $rc -ne 0 ] && status=1
    for v in $SIMT_BWD_VARIANTS; do
      echo "---- $tool, FMHA_SIMT_BWD_CONFIG=$v" >> "$OUT/sanitize.log"
      FMHA_SIMT_BWD_CONFIG=$v timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" \
        --gtest_filter='*Kernel.Backward/Small_*simt*_q15_k63_*:*Deterministic*' --gtest_color=no >> "$OUT/sanitize.log" 2>&1
      rc=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | tail -1)
      echo "   $tool, FMHA_SIMT_BWD_CONFIG=$v: exit $rc; $summary"
      [ $rc -ne 0 ] && status=1
    done
  done
fi

if want bench; then
  step "fmha bench -> $OUT/bench_seed.csv, $OUT/bench_fa.csv"
  timeout 120 "$FMHA" bench --sweep seed --no-progress --csv "$OUT/bench_seed.csv" || status=1
  timeout 300 "$FMHA" bench --sweep fa --dtype bf16 --no-progress --csv "$OUT/bench_fa.csv" || status=1
fi

step "done (status $status)"
exit $status
