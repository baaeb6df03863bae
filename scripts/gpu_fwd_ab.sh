#!/usr/bin/env bash
# The sm90 forward of this tree against a base commit's, and against its own variants, in one GPU
# call on an H100/H200 (results under $OUT), from the repository root:
#   build     this tree (arch 90, head dims 64 and 128) into $BUILD with its GPU tests, and the
#             CLI of the base commit's sources in $BASE_SRC (default .base-src) into $BASE_BUILD
#   tests     the tile layer's softmax tests (TILE_FILTER), every forward variant against the
#             oracle (FMHA_TEST_FWD_VARIANTS=$VARIANTS), the sm90 forward sweep, schedule, few-key
#             and varlen tests                                                        -> tests.log
#   bench     `fmha bench --backend sm90 --mode fwd --dtype bf16` at 16k tokens a call, hidden 2048,
#             head dims $DIMS (default 64 and 128), lengths $LENGTHS, causal none and
#             bottom-right: the base's default, this tree's default and each of $VARIANTS,
#             $ROUNDS interleaved rounds                                        -> fwd_ab.txt
#   packed    `fmha bench --backend sm90 --mode fwd --sweep varlen` (64 packed sequences, D128
#             causal, bf16 and fp16, beside the dense batch at their mean length) in this tree,
#             under FMHA_SM90_FWD_CONFIG=each of $PACKED_VARIANTS (default pingpong spec),
#             $ROUNDS interleaved rounds                                        -> packed_ab.txt
# STEPS (default "build tests bench") picks the parts; TREE_TARGETS the tree's build targets.
# Head dims other than 64 and 128: AB_HEAD_DIMS and AB_TUNED_HEAD_DIMS (sm90_configure), DIMS.
# Where the GPU machine gets a copy of the working tree without its git history, the base's
# sources go along as a folder: in the repository, `bash scripts/gpu_fwd_ab.sh prepare <commit>`
# writes them into .base-src (ignored through .git/info/exclude); copy it with the tree.
# To spend no GPU time on building, `bash scripts/gpu_fwd_ab.sh prebuild <commit>` on any machine
# with nvcc prepares the base, builds both (as the build step would, $(nproc) jobs) and copies the
# binaries into build-bin/tree and build-bin/base (ignored; about 40 MB at head dims 64 and 128,
# AB_TUNED_HEAD_DIMS= to leave out the other variants); then on the GPU machine, with build-bin
# copied along: `BUILD=$PWD/build-bin/tree BASE_BUILD=$PWD/build-bin/base STEPS="tests bench" bash
# scripts/gpu_fwd_ab.sh`.
set -u
source "$(dirname "$0")/sm90_ab.sh"
BASE_SRC=${BASE_SRC:-$PWD/.base-src}
if [[ "${1:-}" == prepare ]]; then sm90_prepare_base "${2:-}"; exit; fi
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=${STEPS:-"build tests bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-sm90}
BB=${BASE_BUILD:-/tmp/fmha-base}
if [[ "${1:-}" == prebuild ]]; then
  sm90_prepare_base "${2:?usage: gpu_fwd_ab.sh prebuild <commit>}" || exit 1
  BUILD_TIMEOUT=${BUILD_TIMEOUT:-7200} BASE_BUILD_TIMEOUT=${BASE_BUILD_TIMEOUT:-7200} \
    sm90_build_tree_and_base "${TREE_TARGETS:-fmha_cli fmha_gpu_tests fmha_tile_tests}" || exit 1
  rm -rf build-bin/tree build-bin/base && mkdir -p build-bin/tree/tests/gpu build-bin/base
  cp "$B/fmha" build-bin/tree/ && cp "$BB/fmha" build-bin/base/ || exit 1
  for t in fmha_gpu_tests fmha_tile_tests; do
    [[ -x "$B/tests/gpu/$t" ]] && cp "$B/tests/gpu/$t" build-bin/tree/tests/gpu/
  done
  echo "binaries in build-bin/ ($(du -sh build-bin | cut -f1)): carry build-bin to the GPU machine"
  exit 0
fi
VARIANTS=${VARIANTS-spec}
LENGTHS=${LENGTHS:-512 1024 2048 16384}
if want build; then sm90_build_tree_and_base "${TREE_TARGETS:-fmha_cli fmha_gpu_tests fmha_tile_tests}" || exit 1; fi
if want tests; then
  T=$B/tests/gpu/fmha_gpu_tests
  {
    # The tile layer's softmax tests (the online softmax the forward's kernels run), where built.
    [[ -x $B/tests/gpu/fmha_tile_tests ]] && timeout 60 $B/tests/gpu/fmha_tile_tests --gtest_color=no \
      --gtest_brief=1 --gtest_filter="${TILE_FILTER:-TileOps.*Softmax*:TileOps.ScoresScaled*:TileOps.Exp2*}"
    FMHA_TEST_FWD_VARIANTS=$(echo $VARIANTS | tr ' ' ',') timeout 200 $T --gtest_color=no --gtest_brief=1 \
      --gtest_filter='*Sm90Variant*'
    timeout 300 $T --gtest_color=no --gtest_brief=1 \
      --gtest_filter='*Kernel.Forward/*sm90*:*Sm90Schedule*:*FewKeys*sm90*:*VarlenKernel.Forward/sm90*:LargeOffsets.Sm90*:Edge.*'
  } > "$OUT/tests.log" 2>&1
  grep -E "tests? from .* ran|PASSED|FAILED" "$OUT/tests.log" | head -20
fi
if want packed; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in ${PACKED_VARIANTS:-pingpong spec}; do
      FMHA_SM90_FWD_CONFIG=$v timeout 120 "$B/fmha" bench --backend sm90 --mode fwd --sweep varlen --iters 20 \
        --no-progress 2>&1 | grep -E "^fwd" | awk -v v=$v -v r=$r '{print v, r, $0}'
    done
  done | tee "$OUT/packed_ab.txt"
fi
want bench || exit 0
bench() {  # label, cli, variant (empty: the default), head dim, round -> label round d length causal TFLOP/s
  sm90_bench fwd "$1" "$2" "$3" "$4" "$5" "$LENGTHS" 30 | awk '{print $1, $2, $3, $4, $5, $(NF-1)}'
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for d in ${DIMS:-64 128}; do
    bench base "$BB/fmha" "" $d $r
    bench tree "$B/fmha" "" $d $r
    for v in $VARIANTS; do bench "$v" "$B/fmha" "$v" $d $r; done
  done
done | tee "$OUT/fwd_ab.txt"
