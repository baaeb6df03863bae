#!/usr/bin/env bash
# The sm90 forward's variants side by side, from the repository root on a Hopper GPU: builds
# (arch 90, head dims 64/128) into $BUILD (default /tmp/fmha-variants), runs the sm90 forward
# tests, then `fmha bench` per variant, head dim, causal mode and length (16k tokens, hidden 2048),
# ROUNDS interleaved rounds -> $OUT/variants.txt (variant, round, head dim, length, causal, bench line).
# V128 / V64: the variants per head dim; LENGTHS: the sequence lengths (default 1024 4096 16384).
# STEPS (default "build tests bench") picks the parts; TEST_TIMEOUT bounds the forward tests (s).
set -u
source "$(dirname "$0")/sm90_ab.sh"
STEPS=${STEPS:-"build tests bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${BUILD:-/tmp/fmha-variants}
V128=${V128:-pingpong eager spec}
V64=${V64:-spec pingpong eager}
if want build; then
t0=$(date +%s)
sm90_configure . "$B" > "$OUT/build.log" 2>&1
timeout 240 ninja -C "$B" -j16 fmha_cli fmha_gpu_tests fmha_tile_sm90_tests fmha_tile_tests fmha_dispatch_tests >> "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
fi
if want tests; then
timeout 60 "$B/tests/gpu/fmha_dispatch_tests" --gtest_filter='Sm90Config.*' --gtest_color=no > "$OUT/tests.log" 2>&1
timeout "${TEST_TIMEOUT:-300}" "$B/tests/gpu/fmha_gpu_tests" --gtest_filter='*Sm90Variant*:*Kernel.Forward/*sm90*:*Sm90Schedule*' \
  --gtest_color=no >> "$OUT/tests.log" 2>&1
timeout 60 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no >> "$OUT/tests.log" 2>&1
timeout 60 "$B/tests/gpu/fmha_tile_tests" --gtest_color=no --gtest_filter='TileOps.Exp2*' >> "$OUT/tests.log" 2>&1
grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran" "$OUT/tests.log"
fi
bench() {  # variant, head dim, round
  sm90_bench fwd "$1" "$B/fmha" "$1" "$2" "$3" "${LENGTHS:-1024 4096 16384}" 20
}
want bench || exit 0
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in $V128; do bench "$v" 128 "$r" >> "$OUT/variants.txt"; done
  for v in $V64; do bench "$v" 64 "$r" >> "$OUT/variants.txt"; done
done
