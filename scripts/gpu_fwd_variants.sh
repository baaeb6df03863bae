#!/usr/bin/env bash
# The sm90 forward's variants side by side, from the repository root on a Hopper GPU: builds
# (arch 90, head dims 64/128) into $BUILD (default /tmp/fmha-variants), runs the sm90 forward
# tests, then `fmha bench` per variant, head dim, causal mode and length (16k tokens, hidden 2048),
# ROUNDS interleaved rounds -> $OUT/variants.txt (variant, round, head dim, length, causal, bench line).
# V128 / V64: the variants per head dim; LENGTHS: the sequence lengths (default 1024 4096 16384).
# STEPS (default "build tests bench") picks the parts; TEST_TIMEOUT bounds the forward tests (s).
set -u
STEPS=${STEPS:-"build tests bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${BUILD:-/tmp/fmha-variants}
V128=${V128:-pingpong eager c3}
V64=${V64:-c3 pingpong eager}
if want build; then
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS="64;128" \
  -DFMHA_TUNED_HEAD_DIMS="64;128" -DFMHA_DECODE_HEAD_DIMS=128 > "$OUT/build.log" 2>&1
timeout 240 ninja -C "$B" -j16 fmha_cli fmha_gpu_tests fmha_tile_sm90_tests fmha_tile_tests fmha_dispatch_tests >> "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
fi
if want tests; then
timeout 60 "$B/tests/gpu/fmha_dispatch_tests" --gtest_filter='Sm90Config.*' --gtest_color=no > "$OUT/tests.log" 2>&1
timeout "${TEST_TIMEOUT:-300}" "$B/tests/gpu/fmha_gpu_tests" --gtest_filter='Sm90Variants.*:*Kernel.Forward/*sm90*:Sm90Schedule.*' \
  --gtest_color=no >> "$OUT/tests.log" 2>&1
timeout 60 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no >> "$OUT/tests.log" 2>&1
timeout 60 "$B/tests/gpu/fmha_tile_tests" --gtest_color=no --gtest_filter='TileOps.Exp2*' >> "$OUT/tests.log" 2>&1
grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran" "$OUT/tests.log"
fi
bench() {  # variant, head dim, round
  local h=$((2048 / $2))
  for c in none bottom-right; do for s in ${LENGTHS:-1024 4096 16384}; do
    FMHA_SM90_FWD_CONFIG=$1 timeout 20 "$B/fmha" bench --backend sm90 --mode fwd --dtype bf16 --head-dim "$2" --heads $h \
      --batch $((16384 / s)) --seqlen-q $s --causal $c --iters 20 --no-progress 2>&1 | tail -1 |
      awk -v v="$1" -v r="$3" -v d="$2" -v s=$s -v c=$c '{print v, r, d, s, c, $0}'
  done; done
}
want bench || exit 0
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in $V128; do bench "$v" 128 "$r" >> "$OUT/variants.txt"; done
  for v in $V64; do bench "$v" 64 "$r" >> "$OUT/variants.txt"; done
done
