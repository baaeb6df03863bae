#!/usr/bin/env bash
# The fp32 paths (tf32 and split tf32 on the sm90 and sm80 tiers) of this tree against a base
# commit's, in GPU calls on an H100/H200 (results under $OUT), from the repository root. The base's
# sources come from `bash scripts/gpu_fp32_ab.sh prepare <commit>` (into .base-src; carry it).
# STEPS (default "build tile bench tests fuzz") picks the parts; the builds are kept between calls:
#   build   this tree's CLI, GPU tests and tile tests (arch 90, head dims $AB_HEAD_DIMS, default
#           64;96;128;256) into $BUILD, the base's CLI ($BASE_HEAD_DIMS, default 64;128;256) into $BASE_BUILD            -> build.log
#   tile    the sm90 tile layer's tests (the split's rounding first) and the tile layer's
#           tf32 tests                                                            -> tile.log
#   bench   the seed shape (B4 H4 S4096, fp32), base and tree in $ROUNDS interleaved rounds:
#           sm90 split tf32 (D64) and tf32 (D64, D128) forward and backward, sm80 split tf32
#           (D128, D256) forward and backward, causal none                        -> fp32_ab.txt
#   tests   every sm90 and sm80 tf32/tf32x3 case, the split-tf32 accuracy tests, the peaked
#           softmax tests, refusals, edges and negative scales, in 6 shards    -> tests.log
#   fuzz    the GPU fuzz's sm90 tier (its tf32 and split-tf32 calls among them) and auto's
#           split-tf32 rule, in 6 shards                                          -> fuzz.log
set -u
source "$(dirname "$0")/sm90_ab.sh"
BASE_SRC=${BASE_SRC:-$PWD/.base-src}
if [[ "${1:-}" == prepare ]]; then sm90_prepare_base "${2:-}"; exit; fi
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS=${AB_HEAD_DIMS:-"64;96;128;256"}
STEPS=${STEPS:-"build tile bench tests fuzz"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-fp32-ab}
BB=${BASE_BUILD:-/tmp/fmha-fp32-base}
T=$B/tests/gpu/fmha_gpu_tests
if want build; then
  BASE_HEAD_DIMS=${BASE_HEAD_DIMS:-"64;128;256"} \
    sm90_build_tree_and_base "fmha_cli fmha_gpu_tests fmha_tile_tests fmha_tile_sm90_tests" || exit 1
fi
if want tile; then
  {
    timeout 60 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no --gtest_filter='Sm90Tile.SplitTf32RoundsToNearestEvenInFp32Layout'
    timeout 120 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no --gtest_brief=1
    timeout 120 "$B/tests/gpu/fmha_tile_tests" --gtest_color=no --gtest_brief=1
  } > "$OUT/tile.log" 2>&1
  grep -E "tests? from .* ran|PASSED|^\[  FAILED" "$OUT/tile.log" | sort | uniq -c
fi
if want bench; then
  seed() {  # label, cli, round, backend, mode, precision, head dim -> one line
    timeout 60 "$2" bench --no-progress --backend "$4" --mode "$5" --dtype fp32 --precision "$6" --batch 4 --heads 4 \
      --seqlen-q 4096 --head-dim "$7" --iters 10 2>&1 | tail -1 | awk -v l="$1" -v r="$3" '{print l, r, $0}'
  }
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for c in "sm90 fwd tf32x3 64" "sm90 bwd tf32x3 64" "sm90 fwd tf32 64" "sm90 bwd tf32 64" "sm90 fwd tf32 128" \
             "sm90 bwd tf32 128" "sm80 fwd tf32x3 128" "sm80 bwd tf32x3 128" "sm80 fwd tf32x3 256" "sm80 bwd tf32x3 256"; do
      [[ ";$AB_HEAD_DIMS;" == *";${c##* };"* ]] || continue  # head dims built only
      [[ $r -gt 1 && $c == sm80*256 ]] && continue  # one round at D256 (each call ~40 ms)
      seed base "$BB/fmha" $r $c
      seed tree "$B/fmha" $r $c
    done
  done | tee "$OUT/fp32_ab.txt"
fi
if want tests; then
  F='*sm90_tf32*:*sm80_tf32*:*Sm90Tf32*:Sm90BwdConfig.*:SplitTf32*:*GpuPeakedSoftmax*:GpuSplitTf32.Sm90*'
  F+=':Refuse.*:Edge.*:Tiers/FewKeys.*sm90*:Tiers/Deterministic.*sm90*:Fuzz/GpuNegativeScale.*'
  sm90_sharded_tests "$T" "$F" 6 "${TEST_LIMIT:-280}" tests.log
fi
if want fuzz; then
  sm90_sharded_tests "$T" 'Fuzz/GpuFuzz.*sm90*:GpuSplitTf32.Auto*' 6 "${TEST_LIMIT:-280}" fuzz.log
fi
