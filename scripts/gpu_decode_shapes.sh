#!/usr/bin/env bash
# The decode kernel's shapes (FMHA_DECODE_SHAPE: keys a stage, stages, how K and V are copied) side
# by side in one GPU call, from the repository root, with the CLI and GPU tests of $BUILD (default
# ./build-sm90; PREBUILT: a folder of `gpu_check.sh pack`, unpacked into it first):
#   the decode, paged and merge GPU tests under every shape               -> decode_tests_<shape>.log
#   `fmha bench` (bf16, one query token, 32 query heads over 8 KV heads, D128) of every shape at each
#   batch × KV length of $CASES with the heuristic's split count, and the one-CTA-an-SM shapes
#   also unsplit, $ROUNDS interleaved rounds            -> decode_shapes.txt (round, case, shape, splits | line)
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${BUILD:-$PWD/build-sm90}
if [[ -n "${PREBUILT:-}" ]]; then
  mkdir -p "$B/tests/gpu"
  xz -dc "$PREBUILT/fmha_gpu_tests.xz" > "$B/tests/gpu/fmha_gpu_tests" && xz -dc "$PREBUILT/fmha.xz" > "$B/fmha" || exit 1
  chmod +x "$B/tests/gpu/fmha_gpu_tests" "$B/fmha"
fi
SHAPES=${SHAPES:-default s2 s4 k128s2 k128s3 l2 bulk k128bulk}
if [[ -n "${TESTS-1}" ]]; then
  for s in $SHAPES; do
    FMHA_DECODE_SHAPE=$s timeout 120 "$B/tests/gpu/fmha_gpu_tests" --gtest_color=no --gtest_brief=1 \
      --gtest_filter='DecodeGpu.*:*Paged*:MergeCuda.*:GpuTuneDecode.*' > "$OUT/decode_tests_$s.log" 2>&1
    echo "tests $s rc=$? $(grep -E '^\[  PASSED|^\[  FAILED|tests? ran' "$OUT/decode_tests_$s.log" | tr '\n' ' ')"
  done
fi
for r in $(seq 1 "${ROUNDS:-2}"); do for c in ${CASES:-16x8192 16x32768 64x8192}; do
  for s in $SHAPES; do
    splits="0"; [[ $s == s4 || $s == k128* ]] && splits="0 1"
    for n in $splits; do
      line=$(FMHA_DECODE_SHAPE=$s timeout 60 "$B/fmha" bench --no-progress --dtype bf16 --heads 32 --kv-heads 8 \
        --head-dim 128 --seqlen-q 1 --batch "${c%x*}" --seqlen-k "${c#*x}" --num-splits "$n" --iters 50 --rotate 1 2>&1 | tail -1)
      echo "$r $c $s splits=$n | $line"
    done
  done
done; done | tee "$OUT/decode_shapes.txt"
