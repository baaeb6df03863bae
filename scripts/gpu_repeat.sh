#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: GPU tests run over
# and over, to catch a failure that comes and goes.
#   build (scripts/gpu_round.sh, head dims HEAD_DIMS, default "64;256")
#   CHECK (a gtest filter, default the dispatch and refusal tests) once              -> check.log
#   FILTER (a gtest filter) REPEAT times (default 100) in PROCS processes (default 4), each
#   failure's report kept                                                              -> repeat_*.log
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=build HEAD_DIMS="${HEAD_DIMS:-64;256}" BUILD_TIMEOUT=200 bash scripts/gpu_round.sh || exit 1
T=build-sm90/tests/gpu/fmha_gpu_tests
echo "== check $(date +%T)"
timeout 60 $T --gtest_color=no --gtest_brief=1 --gtest_filter="${CHECK:-*Refus*:*Sm90Tf32*:*Dispatch*}" > $OUT/check.log 2>&1
grep -E "tests? from .* ran|PASSED|FAILED" $OUT/check.log | head -8
echo "== repeat $(date +%T)"
PROCS=${PROCS:-4}
for ((i = 0; i < PROCS; ++i)); do
  timeout "${REPEAT_TIMEOUT:-240}" $T --gtest_color=no --gtest_brief=1 --gtest_filter="$FILTER" \
    --gtest_repeat="${REPEAT:-100}" > $OUT/repeat_$i.log 2>&1 &
done
wait
for ((i = 0; i < PROCS; ++i)); do
  echo "process $i: $(grep -c '^\[  PASSED' $OUT/repeat_$i.log) passing rounds, $(grep -c '^\[  FAILED  \] [0-9]' $OUT/repeat_$i.log) failing"
done
grep -h -B3 -A25 "Failure" $OUT/repeat_*.log | head -80
