#!/usr/bin/env bash
# The sm90 backward of this tree against a base commit's, in one GPU call on an H100/H200 (results
# under $OUT), from the repository root:
#   build     this tree (arch 90, head dims $AB_HEAD_DIMS, default 64 and 128) into $BUILD with its
#             GPU tests, and the CLI of the base commit's sources in $BASE_SRC (default .base-src; written by
#             `bash scripts/gpu_bwd_ab.sh prepare <commit>` in the repository) into $BASE_BUILD
#   tests     the sm90 backward's kernel sweep, varlen, deterministic, few-key, peaked-softmax,
#             large-offset and edge tests in 6 processes, and the sm90 forward's      -> tests.log
#   sanitize  racecheck, synccheck and memcheck on the small sm90 bf16 backward cases at head dim
#             64 (a deterministic one among them)                            -> sanitize_*.log
#   bench     `fmha bench --backend sm90 --mode bwd --dtype bf16` at 16k tokens a call, hidden 2048,
#             head dims $DIMS, lengths $LENGTHS, causal none and bottom-right, base and tree,
#             $ROUNDS interleaved rounds                                          -> bwd_ab.txt
# STEPS (default "build tests sanitize bench") picks the parts.
set -u
source "$(dirname "$0")/sm90_ab.sh"
BASE_SRC=${BASE_SRC:-$PWD/.base-src}
if [[ "${1:-}" == prepare ]]; then sm90_prepare_base "${2:-}"; exit; fi
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=${STEPS:-"build tests sanitize bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-sm90}
BB=${BASE_BUILD:-/tmp/fmha-base}
T=$B/tests/gpu/fmha_gpu_tests
DIMS=${DIMS:-64 128}
LENGTHS=${LENGTHS:-512 1024 2048 4096 16384}
if want build; then sm90_build_tree_and_base "fmha_cli fmha_gpu_tests" || exit 1; fi
if want tests; then
  FILTER='Sweep/Kernel.Backward/*sm90*:Tiers/VarlenKernel.Backward/*sm90*:Tiers/Deterministic.*sm90*'
  FILTER+=':Tiers/FewKeys.*sm90*:Fuzz/GpuPeakedSoftmax.*sm90*:LargeOffsets.*:Edge.*'
  FILTER+=':Sweep/Kernel.Forward/*sm90*:*Sm90Schedule*:Tiers/VarlenKernel.Forward/*sm90*'
  sm90_sharded_tests "$T" "$FILTER" 6 200 tests.log
fi
if want sanitize; then
  sm90_sanitize "$T" 'Sweep/Kernel.Backward/Small_sm90_bf16_*_d64*' 90 racecheck synccheck memcheck
fi
want bench || exit 0
bench() {  # label, cli, head dim, round -> label round d length causal TFLOP/s
  sm90_bench bwd "$1" "$2" "" "$3" "$4" "$LENGTHS" 20 | awk '{print $1, $2, $3, $4, $5, $(NF-1)}'
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for d in $DIMS; do
    bench base "$BB/fmha" $d $r
    bench tree "$B/fmha" $d $r
  done
done | tee "$OUT/bwd_ab.txt"
