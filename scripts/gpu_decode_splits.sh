#!/usr/bin/env bash
# The decode kernel's split counts at the batched decode shapes (one query token, 32 query heads
# over 8 KV heads, D128, bf16), on a GPU, with the CLI of an existing build ($BUILD, default
# ./build-sm90, decode head dim 128 compiled): `fmha bench --num-splits N` for N in $SPLITS
# (0: the heuristic's count) at each batch × KV length of $CASES, $ROUNDS interleaved rounds
#   -> $OUT/decode_splits.txt (round, case, splits, then the bench line: ms, TFLOP/s, TB/s)
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${BUILD:-$PWD/build-sm90}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for c in ${CASES:-16x8192 16x32768 64x8192}; do
    for n in ${SPLITS:-0 1 2 4}; do
      line=$(timeout 30 "$B/fmha" bench --no-progress --dtype bf16 --heads 32 --kv-heads 8 --head-dim 128 --seqlen-q 1 \
        --batch "${c%x*}" --seqlen-k "${c#*x}" --num-splits "$n" --iters 50 2>&1 | tail -1)
      echo "$r $c splits=$n $line"
    done
  done
done | tee "$OUT/decode_splits.txt"
