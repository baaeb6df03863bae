#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: the sm90 split-tf32
# forward with K split a tile ahead of V and two V landing buffers, against a base commit's tree.
# Here first: `bash scripts/gpu_fwd_ab.sh prepare <base>` (the base's sources into .base-src, which
# must travel with the call). On the GPU:
#   build   this tree (CLI and GPU tests) and the base's CLI, head dims $AB_HEAD_DIMS (default 64) -> build.log
#   tests   the sm90 tf32 and split-tf32 cases, SplitTf32.*, *Sm90Tf32*          -> tests.log
#   sanitize racecheck and synccheck on the small tf32 and split-tf32 forward cases -> sanitize.log
#   bench   seed shape (B4 H4 S4096 D64), tf32x3 and tf32, causal and not, base and tree
#           interleaved, ROUNDS rounds (default 2)                                -> bench.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS=${AB_HEAD_DIMS:-64}
source "$(dirname "$0")/sm90_ab.sh"
B=build-sm90-64; BB=build-base-64; BASE_SRC=${BASE_SRC:-$PWD/.base-src}
sm90_build_tree_and_base "fmha_cli tests/gpu/fmha_gpu_tests" || exit 1
T=$B/tests/gpu/fmha_gpu_tests
echo "== tests $(date +%T)"
timeout 300 $T --gtest_color=no --gtest_brief=1 --gtest_filter='*sm90*tf32*:SplitTf32*:*Sm90Tf32*:Sm90Tile.Split*' \
  > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "tests? from .* ran|PASSED|FAILED|SKIPPED \]" $OUT/tests.log | head -12
echo "== sanitize $(date +%T)"
sm90_sanitize $T 'Sweep/Kernel.Forward/Small*sm90*tf32*' 120 racecheck synccheck
cat $OUT/sanitize_*.log > $OUT/sanitize.log; rm -f $OUT/sanitize_*.log
echo "== bench $(date +%T)"
for r in $(seq "${ROUNDS:-2}"); do for d in tf32x3 tf32; do for c in none bottom-right; do for b in $BB $B; do
  echo "$b $d $c $r $(timeout 60 $b/fmha bench --no-progress --backend sm90 --mode fwd --dtype $d --batch 4 --heads 4 \
    --seqlen-q 4096 --head-dim 64 --causal $c --iters 20 2>&1 | tail -1)"
done; done; done; done | tee $OUT/bench.txt
