#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: the wide tf32
# backward (fp32 storage at head dims 96 and 128, sm90_bwd_mainloop.cuh's step_wide_tf32) and the
# transposing one at 64.
#   build     the CLI and GPU tests, arch 90, head dims $AB_HEAD_DIMS (default 64;96;128) -> build.log
#   tile      the sm90 tile layer's GPU tests (fmha_tile_sm90_tests)                  -> tile_tests.log
#   tests     every sm90 tf32 case (kernel sweep forward and backward, packed, deterministic,
#             few keys), the tf32 and config tests, in four shards                   -> tests.log
#   sanitize  memcheck, racecheck and synccheck on the small sm90 tf32 backward cases -> sanitize.log
#   bench     seed shape (B4 H4 S4096), head dims 64, 96, 128, tf32 backward, causal and not,
#             sm90 against sm80 (the tier those calls took before)                   -> bench.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS=${AB_HEAD_DIMS:-"64;96;128"}
source "$(dirname "$0")/sm90_ab.sh"
B=${BUILD:-$PWD/build-wide}
sm90_build "fmha_cli tests/gpu/fmha_gpu_tests tests/gpu/fmha_tile_sm90_tests" || exit 1
T=$B/tests/gpu/fmha_gpu_tests
echo "== tile tests $(date +%T)"  # the sm90 tile layer's own GPU tests (MBarrier, TMA, wgmma layouts)
timeout 120 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no --gtest_brief=1 > "$OUT/tile_tests.log" 2>&1
echo "tile tests rc=$?"; grep -E "tests? from .* ran|PASSED|FAILED" "$OUT/tile_tests.log" | head -5
echo "== tests $(date +%T)"
sm90_sharded_tests "$T" '*sm90_tf32*:Sm90Tf32*:Sm90BwdConfig.*:*FewKeys*sm90*:*Deterministic*sm90*' 4 240 tests.log
echo "== sanitize $(date +%T)"
sm90_sanitize "$T" 'Sweep/Kernel.Backward/Small*sm90_tf32*' 150 memcheck racecheck synccheck
cat "$OUT"/sanitize_*.log > "$OUT/sanitize.log"; rm -f "$OUT"/sanitize_*.log
echo "== bench $(date +%T)"
for d in 64 96 128; do for c in none bottom-right; do for be in sm90 sm80; do
  echo "$be $d $c $(timeout 60 "$B/fmha" bench --no-progress --backend $be --mode bwd --dtype tf32 --batch 4 --heads 4 \
    --seqlen-q 4096 --head-dim $d --causal $c --iters 10 2>&1 | tail -1)"
done; done; done | tee "$OUT/bench.txt"
