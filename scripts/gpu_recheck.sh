#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT, the logs also as one logs.tar.gz), from the
# repository root: the sm90 cases a backward check left unsettled, and the CPU path beside PyTorch:
#   build (scripts/gpu_round.sh, head dims 64, 128, 256)
#   the tf32 / split-tf32 kernel cases and tests, and every deterministic backward case of every
#   tier, in 8 processes                                                          -> tests.log
#   the case FAIL (a failing test's full name, if given) three times over           -> fail_rerun.log
#   racecheck on the small sm90 deterministic cases                                  -> racecheck.log
#   the decode sweep at forced split counts 1-16 (contiguous and pages of 64)       -> decode_splits.txt
#   the CPU path beside PyTorch's CPU SDPA, every dtype and direction, one process, every core
#   (scripts/gpu_round.sh step cputorch)                      -> cpu/compare_torch_cpu.csv, cputorch.log
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=build HEAD_DIMS="64;128;256" BUILD_TIMEOUT=200 bash scripts/gpu_round.sh || exit 1
B=build-sm90; T=$B/tests/gpu/fmha_gpu_tests
echo "== tests $(date +%T)"
FILTER='Sweep/Kernel.Backward/*tf32*:Sweep/Kernel.Forward/*tf32x3*:SplitTf32.*:*Sm90Tf32*:Tiers/Deterministic.*:Sweep/Kernel.Backward/*_det*'
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 140 $T --gtest_color=no --gtest_brief=1 \
    --gtest_filter="$FILTER" > $OUT/shard_$i.log 2>&1 &
done
wait
for i in 0 1 2 3 4 5 6 7; do
  grep -q "tests\? from .* ran" $OUT/shard_$i.log || echo "   shard $i: cut by its time limit"
  cat $OUT/shard_$i.log >> $OUT/tests.log; rm -f $OUT/shard_$i.log
done
grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" $OUT/tests.log |
  awk '{s[$2" "$3]+=$4} END{for(k in s) print "  ", k, s[k]}'
grep -E "^\[  FAILED  \] [A-Z]" $OUT/tests.log | sort -u | head -20
if [ -n "${FAIL:-}" ]; then
  for i in 1 2 3; do timeout 40 $T --gtest_color=no --gtest_filter="$FAIL"; done > $OUT/fail_rerun.log 2>&1
  grep -E "PASSED|FAILED  \] [0-9]|error|Expected|Which is|bound" $OUT/fail_rerun.log | head -20
fi
echo "== racecheck $(date +%T)"
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 $T --gtest_color=no --gtest_brief=1 \
  --gtest_filter='Tiers/Deterministic.SmallBitwiseIdentical/cuda_sm90*:Sweep/Kernel.Backward/Small_sm90*_det*' \
  > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|tests? from .* ran|FAILED" $OUT/racecheck.log | tail -3
echo "== decode splits $(date +%T)"
for s in 1 2 4 8 16; do
  echo "---- splits $s"; timeout 12 $B/fmha bench --no-progress --sweep decode --page-size 64 --num-splits $s 2>&1 | tail -12
done > $OUT/decode_splits.txt
STEPS=cputorch CPU_ARGS="${CPU_ARGS:-}" bash scripts/gpu_round.sh
(cd $OUT && tar czf logs.tar.gz *.log *.txt cpu/*.csv && rm -rf *.log *.txt cpu)
