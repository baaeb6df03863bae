#!/usr/bin/env bash
# The sm90 tier checked and measured in one run on an H100/H200, from the repository root:
#   build + SASS (scripts/gpu_sm90.sh, HEAD_DIMS default "64;96;128;256")
#   tile tests, then the sm90 kernel suite in SHARDS processes at once      -> $OUT/sm90_tests.log
#   memcheck and racecheck on the small sm90 cases (forward and backward)   -> $OUT/sanitize.log
#   head dim 64 forward: the spec and pingpong variants side by side        -> $OUT/variants_d64.txt
#   pip install . and bench/compare_torch.py --sweep fa, bf16, fmha / FA2 / cuDNN, forward and
#   backward                                                                -> $OUT/compare/
set -u -o pipefail
OUT=${OUT:-$PWD/out}
export OUT HEAD_DIMS=${HEAD_DIMS:-"64;96;128;256"}
BUILD=${BUILD:-$PWD/build-sm90}
SHARDS=${SHARDS:-8}
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
status=0
step() { echo "== $* ($(date +%T))"; }
STEPS="build sass" scripts/gpu_sm90.sh || status=1

step "tile tests and the sm90 suite in $SHARDS shards"
"$BUILD/tests/gpu/fmha_tile_tests" --gtest_color=no > "$OUT/sm90_tests.log" 2>&1 || status=1
"$BUILD/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no >> "$OUT/sm90_tests.log" 2>&1 || status=1
for ((i = 0; i < SHARDS; ++i)); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout 200 "$TESTS" --gtest_color=no \
    --gtest_filter='*sm90*:Refuse.*:Edge.*:*Sm90Schedule*:Tiers/Deterministic.*' > "$OUT/shard_$i.log" 2>&1 &
done
wait
for ((i = 0; i < SHARDS; ++i)); do cat "$OUT/shard_$i.log" >> "$OUT/sm90_tests.log"; rm -f "$OUT/shard_$i.log"; done
grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran|Failure|timeout" "$OUT/sm90_tests.log" | sort | uniq -c | head -30

step "memcheck, racecheck"
for tool in memcheck racecheck; do
  echo "---- $tool" >> "$OUT/sanitize.log"
  timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 1 "$TESTS" --gtest_color=no \
    --gtest_filter='*Small_sm90*_q65_k63_*' >> "$OUT/sanitize.log" 2>&1 || { status=1; echo "   $tool: FAILED"; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran" "$OUT/sanitize.log" | tail -2
done

step "head dim 64 forward: spec vs pingpong -> $OUT/variants_d64.txt"
for causal in none bottom-right; do
  for s in 512 2048 8192 16384; do
    for v in spec pingpong; do
      printf '%-8s %-12s %6d ' "$v" "$causal" "$s" >> "$OUT/variants_d64.txt"
      FMHA_SM90_FWD_CONFIG=$v "$BUILD/fmha" bench --backend sm90 --dtype bf16 --head-dim 64 --heads 32 \
        --batch $((16384 / s)) --seqlen-q "$s" --causal "$causal" --iters 10 --no-progress 2>/dev/null | tail -1 \
        >> "$OUT/variants_d64.txt"
    done
  done
done
cat "$OUT/variants_d64.txt"

step "pip install . and compare_torch"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps . \
  -C cmake.define.FMHA_CUDA_ARCHS=90 -C cmake.define.FMHA_HEAD_DIMS="64;128;256" > "$OUT/python_build.log" 2>&1 ||
  { tail -20 "$OUT/python_build.log"; exit 1; }
timeout 300 python3 bench/compare_torch.py --sweep fa --dtypes bf16 --providers fmha,flash,cudnn \
  --directions fwd,bwd --repeats 10 --out "$OUT/compare" > "$OUT/compare.log" 2>&1 || status=1
tail -45 "$OUT/compare.log"
rm -f "$OUT/python_build.log" "$OUT"/compare/*.png  # what comes back is limited
ls -R "$OUT"
exit $status
