#!/usr/bin/env bash
# The GPU test suite on a CUDA machine, from the repository root: build (scripts/gpu_sm90.sh's build
# step; HEAD_DIMS, BUILD), the tile tests, then fmha_gpu_tests under FILTER (default: all) in SHARDS
# parallel shards (default 8), each under a TIMEOUT (default 300 s) -> $OUT/suite.log; the summary
# and every failed test's name are printed.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-$PWD/build-sm90}
SHARDS=${SHARDS:-8}
export OUT BUILD
mkdir -p "$OUT"
status=0
STEPS="build" scripts/gpu_sm90.sh || exit 1
echo "== suite in $SHARDS shards ($(date +%T))"
"$BUILD/tests/gpu/fmha_tile_tests" --gtest_color=no > "$OUT/suite.log" 2>&1 || status=1
"$BUILD/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no >> "$OUT/suite.log" 2>&1 || status=1
for ((i = 0; i < SHARDS; ++i)); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout "${TIMEOUT:-300}" "$BUILD/tests/gpu/fmha_gpu_tests" \
    --gtest_color=no --gtest_filter="${FILTER:-*}" > "$OUT/shard_$i.log" 2>&1 || { status=1; echo "   shard $i: rc=$?"; }  &
done
wait
for ((i = 0; i < SHARDS; ++i)); do cat "$OUT/shard_$i.log" >> "$OUT/suite.log"; rm -f "$OUT/shard_$i.log"; done
grep -E "^\[  PASSED|^\[  SKIPPED|^\[  FAILED  \] [0-9]+ test|tests? from .* ran" "$OUT/suite.log" | sort | uniq -c
grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/suite.log" | sort -u | head -40
echo "== suite done ($(date +%T))"
exit $status
