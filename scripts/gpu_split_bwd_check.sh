#!/usr/bin/env bash
# GPU calls on an H100/H200 (results under $OUT), from the repository root: the sm90 backward of
# fp32 storage — tf32 at head dims 64 to 128 and split tf32 (tf32x3) at 64 with its statistics
# kernel. STEPS picks the steps (default all; the build is kept between calls on one machine):
#   build     the CLI and GPU tests, arch 90, head dims $AB_HEAD_DIMS (default 64;96;128) -> build.log
#   tests     the sm90 tile layer's GPU tests; every sm90 tf32 and tf32x3 case (kernel sweep forward
#             and backward, packed, deterministic, few keys), the split-tf32 accuracy tests (beside
#             simt, by fuzz class) and peaked-softmax tests, the refusals, in four shards -> tests.log
#   sanitize  memcheck, racecheck and synccheck on the small sm90 fp32 backward cases  -> sanitize.log
#   bench     seed shape (B4 H4 S4096) backward: tf32 at 64, 96, 128 on sm90 and sm80; split tf32
#             at 64 on sm90 and sm80 and exact fp32 on simt; causal and not          -> bench.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS=${AB_HEAD_DIMS:-"64;96;128"}
source "$(dirname "$0")/sm90_ab.sh"
B=${BUILD:-$PWD/build-fp32bwd}
STEPS=${STEPS:-"build tests sanitize bench"}
T=$B/tests/gpu/fmha_gpu_tests
step() { [[ " $STEPS " == *" $1 "* ]]; }
if step build; then
  sm90_build "fmha_cli tests/gpu/fmha_gpu_tests tests/gpu/fmha_tile_sm90_tests" || exit 1
fi
if step tests; then
  echo "== tile tests $(date +%T)"
  timeout 120 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no --gtest_brief=1 > "$OUT/tile_tests.log" 2>&1
  echo "tile tests rc=$?"; grep -E "tests? from .* ran|PASSED|FAILED" "$OUT/tile_tests.log" | head -5
  echo "== tests $(date +%T)"
  sm90_sharded_tests "$T" '*sm90_tf32*:*Sm90Tf32*:Sm90BwdConfig.*:SplitTf32*:*GpuPeakedSoftmax*sm90*:GpuSplitTf32.Sm90*:Refuse.*:Edge.*' \
    4 300 tests.log
fi
if step sanitize; then
  echo "== sanitize $(date +%T)"
  sm90_sanitize "$T" 'Sweep/Kernel.Backward/Small*sm90_tf32*' 150 memcheck racecheck synccheck
  cat "$OUT"/sanitize_*.log > "$OUT/sanitize.log"; rm -f "$OUT"/sanitize_*.log
fi
if step bench; then
  echo "== bench $(date +%T)"
  seed() { timeout 60 "$B/fmha" bench --no-progress --mode bwd --dtype fp32 --batch 4 --heads 4 --seqlen-q 4096 \
    --iters 10 "$@" 2>&1 | tail -1; }
  for c in none bottom-right; do
    for d in 64 96 128; do for be in sm90 sm80; do
      echo "tf32 $be $d $c $(seed --backend $be --precision tf32 --head-dim $d --causal $c)"
    done; done
    for be in sm90 sm80; do echo "tf32x3 $be 64 $c $(seed --backend $be --precision tf32x3 --head-dim 64 --causal $c)"; done
    echo "ieee simt 64 $c $(seed --backend simt --precision ieee --head-dim 64 --causal $c)"
  done | tee "$OUT/bench.txt"
fi
