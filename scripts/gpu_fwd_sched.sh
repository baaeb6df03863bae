#!/usr/bin/env bash
# The sm90 forward's schedule and query-release checks on an H100/H200, from the repository root:
# build (head dims 64, 128, 256), tile and sm90 tests, memcheck/racecheck/synccheck on the small
# sm90 forward cases, then `fmha bench --sweep fa` forward under the dynamic schedule (default)
# and FMHA_SM90_SCHEDULER=static -> $OUT.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
export OUT HEAD_DIMS=${HEAD_DIMS:-"64;128;256"}
status=0
STEPS="build sass tests" scripts/gpu_sm90.sh || status=1
BUILD=${BUILD:-$PWD/build-sm90}
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
for tool in memcheck racecheck synccheck; do
  echo "---- $tool" >> "$OUT/sanitize.log"
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 1 "$TESTS" --gtest_color=no \
    --gtest_filter='*Forward/Small_sm90*_q65_k63_*:*Sm90Schedule*' >> "$OUT/sanitize.log" 2>&1 || { status=1; echo "$tool FAILED"; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran" "$OUT/sanitize.log" | tail -2
done
for sched in dynamic static; do
  FMHA_SM90_SCHEDULER=$sched "$BUILD/fmha" bench --sweep fa --backend sm90 --mode fwd --dtype bf16 --iters 10 \
    > "$OUT/bench_fa_fwd_sm90_$sched.csv" 2>> "$OUT/bench.err" || status=1
done
"$BUILD/fmha" bench --sweep seed --backend sm90 --mode fwd --dtype bf16 --iters 20 > "$OUT/bench_seed_sm90.csv" 2>&1
paste "$OUT/bench_fa_fwd_sm90_dynamic.csv" <(awk '{print $NF}' "$OUT/bench_fa_fwd_sm90_static.csv") | head -40; cat "$OUT/bench_seed_sm90.csv"
exit $status
