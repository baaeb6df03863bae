#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: the sm90 kernels as
# built now against a CLI built with the previous code generation of two compile-time choices,
#   -DFMHA_SM90_GENERIC_SHARED  the kernels' shared storage reached through generic addresses
#   -DFMHA_SM90_BWD_DQ_AT_END   the D64 backward's dQ hand-off at the end of each step
# at head dims 64 and 128 (CLIs only), then the bf16 forward and backward, 16k tokens a call, at
# 512, 2k and 16k keys, causal and not, the two builds alternating, ROUNDS rounds (default 2)  -> ab.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
build() {  # dir, extra CUDA flags
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS="64;128" \
    -DFMHA_DECODE_HEAD_DIMS=64 -DCMAKE_CUDA_FLAGS="-lineinfo $2" > "$OUT/build_$(basename "$1").log" 2>&1 &&
    timeout 240 ninja -C "$1" -j"$(nproc)" fmha_cli >> "$OUT/build_$(basename "$1").log" 2>&1 ||
    { tail -5 "$OUT/build_$(basename "$1").log"; exit 1; }
}
echo "== build $(date +%T)"
build build-ab-new "" &
build build-ab-old "-DFMHA_SM90_GENERIC_SHARED -DFMHA_SM90_BWD_DQ_AT_END" &
wait
[ -x build-ab-new/fmha ] && [ -x build-ab-old/fmha ] || { echo "a build failed"; exit 1; }
echo "== bench $(date +%T)"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in fwd bwd; do
    for d in 64 128; do
      for S in 512 2048 16384; do
        for causal in none bottom-right; do
          args="--backend sm90 --mode $mode --dtype bf16 --iters 10 --head-dim $d --heads $((2048 / d))
                --batch $((16384 / S)) --seqlen-q $S --causal $causal"
          for b in build-ab-new build-ab-old; do
            echo "r$round $mode D$d S$S $causal ${b#build-ab-}: $(timeout 60 $b/fmha bench --no-progress $args 2>&1 | tail -1)"
          done
        done
      done
    done
  done
done | tee "$OUT/ab.txt"
