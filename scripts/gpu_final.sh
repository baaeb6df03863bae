#!/usr/bin/env bash
# A verification run on an H100/H200, from the repository root: build (HEAD_DIMS, default
# "64;96;128"), the tile tests, the sm90 backward and deterministic cases, the cases in EXTRA_FILTER,
# memcheck/racecheck on the small sm90 backward cases, `fmha bench --sweep fa` backward on sm90 and
# the deterministic mode, then the Python package: its varlen CUDA tests and compare_torch's fa
# sweep (DIRECTIONS, default bwd) -> $OUT. DECODE=1 adds memcheck and the decode sweep of the
# sm80 decode kernel; PYTHON=0 leaves out the Python part.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
export OUT HEAD_DIMS=${HEAD_DIMS:-"64;96;128"}
BUILD=${BUILD:-$PWD/build-sm90}
SHARDS=${SHARDS:-8}
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
status=0
step() { echo "== $* ($(date +%T))"; }
STEPS="build" scripts/gpu_sm90.sh || exit 1

step "tests in $SHARDS shards -> $OUT/tests.log"
"$BUILD/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no > "$OUT/tests.log" 2>&1 || status=1
FILTER="*Backward*sm90*:Tiers/Deterministic.*:*Sm90Schedule*:Refuse.*${EXTRA_FILTER:+:$EXTRA_FILTER}"
for ((i = 0; i < SHARDS; ++i)); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout 200 "$TESTS" --gtest_color=no --gtest_filter="$FILTER" \
    > "$OUT/shard_$i.log" 2>&1 &
done
wait
for ((i = 0; i < SHARDS; ++i)); do cat "$OUT/shard_$i.log" >> "$OUT/tests.log"; rm -f "$OUT/shard_$i.log"; done
grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran" "$OUT/tests.log" | sort | uniq -c | head -30
grep -E "^\[  FAILED  \]" "$OUT/tests.log" | sort -u | head -20

step "memcheck, racecheck"
for tool in memcheck racecheck; do
  echo "---- $tool" >> "$OUT/sanitize.log"
  timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 1 "$TESTS" --gtest_color=no \
    --gtest_filter='*Backward/Small_sm90*_q65_k63_*' >> "$OUT/sanitize.log" 2>&1 || { status=1; echo "   $tool: FAILED"; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran" "$OUT/sanitize.log" | tail -2
done

step "bench -> $OUT/bench.txt"
"$BUILD/fmha" bench --sweep fa --backend sm90 --mode bwd --dtype bf16 --iters 10 --no-progress > "$OUT/bench.txt" 2>&1 || status=1
for det in "" --deterministic; do
  for shape in "--batch 4 --seqlen-q 4096" "--batch 1 --seqlen-q 16384"; do
    "$BUILD/fmha" bench --backend sm90 --mode bwd --dtype bf16 --iters 10 --head-dim 128 --heads 16 $shape $det \
      --no-progress 2>&1 | tail -1 | sed "s/$/  ${det:-default}/" >> "$OUT/bench.txt"
  done
done
cat "$OUT/bench.txt"

if [ "${DECODE:-0}" = 1 ]; then
  step "decode: memcheck, bench -> $OUT/decode.txt"
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$TESTS" --gtest_color=no \
    --gtest_filter='DecodeGpu.BrokenDeviceTableIsClamped:DecodeGpu.SplitCountsFromOneToMany:DecodeGpu.AppendKvOnDevice' \
    > "$OUT/decode_memcheck.log" 2>&1 || { status=1; echo "   decode memcheck: FAILED"; }
  tail -2 "$OUT/decode_memcheck.log"
  timeout 90 "$BUILD/fmha" bench --sweep decode --page-size 64 --no-progress > "$OUT/decode.txt" 2>&1 || status=1
  cat "$OUT/decode.txt"
fi
[ "${PYTHON:-1}" = 1 ] || exit $status

step "pip install ., varlen CUDA tests, compare_torch"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps . \
  -C cmake.define.FMHA_CUDA_ARCHS=90 -C cmake.define.FMHA_HEAD_DIMS="64;128;256" > "$OUT/python_build.log" 2>&1 ||
  { tail -20 "$OUT/python_build.log"; exit 1; }
timeout 120 python3 -m pytest tests/python/test_torch_varlen.py -q -rs -p no:cacheprovider -k cuda > "$OUT/pytest.log" 2>&1 || status=1
tail -5 "$OUT/pytest.log"
timeout 240 python3 bench/compare_torch.py --sweep fa --dtypes bf16 --providers fmha,flash,cudnn \
  --directions "${DIRECTIONS:-bwd}" --repeats 10 --out "$OUT/compare" > "$OUT/compare.log" 2>&1 || status=1
grep -E "fmha/bwd|cudnn/bwd" "$OUT/compare.log" | head -48
rm -f "$OUT/python_build.log" "$OUT/build.log" "$OUT"/compare/*.png
exit $status
