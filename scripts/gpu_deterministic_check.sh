#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root, for the sm90
# deterministic backward (descending turns, L2 sections of (batch, KV head) pairs, two dQ warps):
#   build (scripts/gpu_round.sh, head dims 64, 128, 256; incremental after gpu_backward_check.sh)
#   the deterministic GPU tests of every tier and the sm90 deterministic kernel cases (again under
#   FMHA_SM90_BWD_ORDER=keys unless KEYS_ORDER is empty)                            -> tests.log
#   memcheck, racecheck and synccheck (SANITIZE: which) on the small sm90 deterministic cases
#                                                                                     -> sanitize.log
#   sm90 backward, bf16, D128 (16k tokens a call, 16 heads) and D64 at 4k, default and
#   deterministic, causal and not, and the deterministic one with one pair per section
#   (FMHA_SM90_BWD_ORDER=keys; KEYS_ORDER= empty leaves it and its test run out); BENCH_CASES: other
#   "<head dim>x<length>" cases                                                       -> bench_det.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
source "$(dirname "$0")/sm90_ab.sh"
STEPS=build HEAD_DIMS="64;128;256" BUILD_TIMEOUT=200 bash scripts/gpu_round.sh || exit 1
B=build-sm90; T=$B/tests/gpu/fmha_gpu_tests
echo "== tests $(date +%T)"
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 150 $T --gtest_color=no --gtest_brief=1 \
    --gtest_filter='Tiers/Deterministic.*:*_det*:*Determin*' > $OUT/shard_$i.log 2>&1 &
done
wait
cat $OUT/shard_*.log > $OUT/tests.log; rm -f $OUT/shard_*.log
# The same cases with one (batch, KV head) pair per section of the block order (ctest runs them
# so too: Sm90DeterministicKeysOrder).
[[ -n ${KEYS_ORDER-1} ]] && FMHA_SM90_BWD_ORDER=keys timeout 150 $T --gtest_color=no --gtest_brief=1 \
  --gtest_filter='Tiers/Deterministic.*cuda_sm90*:Sweep/Kernel.Backward/*sm90*_det*' >> $OUT/tests.log 2>&1
grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]|tests? from .* ran" $OUT/tests.log | sort | uniq -c
grep -E "^\[  FAILED  \] [A-Z]" $OUT/tests.log | sort -u | head -20
echo "== sanitize $(date +%T)"
SMALL='Tiers/Deterministic.SmallBitwiseIdentical/cuda_sm90*:Sweep/Kernel.Backward/Small_sm90*_det*'
sm90_sanitize $T "$SMALL" 100 ${SANITIZE:-memcheck racecheck synccheck}
cat $OUT/sanitize_*.log > $OUT/sanitize.log; rm -f $OUT/sanitize_*.log
echo "== bench $(date +%T)"
F="timeout 60 $B/fmha bench --no-progress --backend sm90 --mode bwd --dtype bf16 --iters 10"  # a hang costs a minute, not the call
for c in ${BENCH_CASES:-"128 512" "128 4096" "128 16384" "64 4096"}; do set -- ${c/x/ }
  for causal in none bottom-right; do
    args="--head-dim $1 --heads $((2048 / $1)) --batch $((16384 / $2)) --seqlen-q $2 --causal $causal"
    echo "D$1 S$2 $causal default: $($F $args 2>&1 | tail -1)"
    echo "D$1 S$2 $causal deterministic: $($F $args --deterministic 2>&1 | tail -1)"
    [[ -n ${KEYS_ORDER-1} ]] &&
      echo "D$1 S$2 $causal deterministic, keys order: $(FMHA_SM90_BWD_ORDER=keys $F $args --deterministic 2>&1 | tail -1)"
  done
done | tee $OUT/bench_det.txt
