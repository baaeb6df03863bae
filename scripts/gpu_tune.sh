#!/usr/bin/env bash
# Compares the kernel variants of the simt and sm80 tiers in one run on a CUDA machine,
# from the repository root, with a build made by scripts/gpu_check.sh (STEPS=build is enough):
#   BUILD=build-gpu-check scripts/gpu_tune.sh
# For each variant (FMHA_SIMT_CONFIG / FMHA_SIMT_BWD_CONFIG / FMHA_SM80_FWD_CONFIG /
# FMHA_SM80_BWD_CONFIG, listed in simt_config.h and sm80_config.h) it first runs the kernel tests of that tier and direction under
# the variant (CHECK=0 skips them), then `fmha bench` on the seed shape (B4 H4 S4096 D64: fp32
# simt, tf32 and bf16 sm80, plus D128) and on FlashAttention's bf16 shapes at S=4096
# (B = 16384/S, H = 2048/D, D 64 and 128, causal and not), and prints one table: variant, case,
# TFLOP/s.
# Environment: BUILD (default build-gpu-check), OUT (default ./out/tune), ITERS (default 20),
# CHECK (default 1), SIMT_VARIANTS / SIMT_BWD_VARIANTS / SM80_VARIANTS / SM80_BWD_VARIANTS
# (default: all).
set -u -o pipefail
BUILD=${BUILD:-build-gpu-check}
OUT=${OUT:-$PWD/out/tune}
ITERS=${ITERS:-20}
CHECK=${CHECK:-1}
SIMT_VARIANTS=${SIMT_VARIANTS:-"grid16 m128n64 m128n32 m64n64 compact"}
SIMT_BWD_VARIANTS=${SIMT_BWD_VARIANTS:-"grid16 micro compact"}
SM80_VARIANTS=${SM80_VARIANTS:-"w4r16 w4r32 w8r16 w4r32n32 compact"}
SM80_BWD_VARIANTS=${SM80_BWD_VARIANTS:-"w4 w8 w8b2 compact"}
FMHA="$BUILD/fmha"
TESTS="$BUILD/tests/gpu/fmha_gpu_tests"
mkdir -p "$OUT"
: > "$OUT/results.tsv"
: > "$OUT/checks.log"
status=0
start=$(date +%s)

# case name | fmha bench arguments
SIMT_CASES=(
  "seed fp32 d64|--backend simt --dtype fp32 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 64 --mode fwd"
  "seed fp32 d128|--backend simt --dtype fp32 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 128 --mode fwd"
)
SM80_CASES=(
  "seed tf32 d64|--backend sm80 --dtype tf32 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 64 --mode fwd"
  "seed tf32 d128|--backend sm80 --dtype tf32 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 128 --mode fwd"
  "seed bf16 d64|--backend sm80 --dtype bf16 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 64 --mode fwd"
  "fa bf16 d64 s4k|--backend sm80 --dtype bf16 --batch 4 --heads 32 --seqlen-q 4096 --head-dim 64 --causal none --mode fwd"
  "fa bf16 d64 s4k causal|--backend sm80 --dtype bf16 --batch 4 --heads 32 --seqlen-q 4096 --head-dim 64 --causal bottom-right --mode fwd"
  "fa bf16 d128 s4k|--backend sm80 --dtype bf16 --batch 4 --heads 16 --seqlen-q 4096 --head-dim 128 --causal none --mode fwd"
  "fa bf16 d128 s4k causal|--backend sm80 --dtype bf16 --batch 4 --heads 16 --seqlen-q 4096 --head-dim 128 --causal bottom-right --mode fwd"
)
# The same shapes, backward.
SIMT_BWD_CASES=()
for entry in "${SIMT_CASES[@]}"; do SIMT_BWD_CASES+=("${entry%%|*} bwd|${entry#*|}"); done
SIMT_BWD_CASES=("${SIMT_BWD_CASES[@]//--mode fwd/--mode bwd}")
SM80_BWD_CASES=()
for entry in "${SM80_CASES[@]}"; do SM80_BWD_CASES+=("${entry%%|*} bwd|${entry#*|}"); done
SM80_BWD_CASES=("${SM80_BWD_CASES[@]//--mode fwd/--mode bwd}")

# bench VAR VARIANT CASE...: one `fmha bench` per case under VAR=VARIANT, rows into results.tsv.
bench() {
  local var=$1 variant=$2; shift 2
  local entry name args csv tflops
  for entry in "$@"; do
    name=${entry%%|*}
    args=${entry#*|}
    csv="$OUT/$variant-${name// /_}.csv"
    if env "$var=$variant" timeout 60 "$FMHA" bench $args --iters "$ITERS" --no-progress --csv "$csv" \
        > "$csv.log" 2>&1; then
      tflops=$(awk -F, 'NR == 2 { printf "%.1f", $14 }' "$csv")
    else
      tflops="FAIL"
      status=1
    fi
    printf '%s\t%s\t%s\n' "$variant" "$name" "${tflops:-FAIL}" >> "$OUT/results.tsv"
  done
}

# check VAR VARIANT FILTER: the tier's kernel tests of one direction under that variant.
check() {
  [ "$CHECK" = 1 ] || return 0
  if env "$1=$2" timeout 120 "$TESTS" --gtest_color=no --gtest_brief=1 --gtest_filter="$3" >> "$OUT/checks.log" 2>&1; then
    echo "   $1=$2: kernel tests pass"
  else
    echo "   $1=$2: kernel tests FAIL (see $OUT/checks.log)"
    status=1
  fi
}

echo "== simt forward variants ($(date +%T))"
for v in $SIMT_VARIANTS; do
  check FMHA_SIMT_CONFIG "$v" "*Kernel.Forward/*_simt_*:Edge.*:*Deterministic.*"
  bench FMHA_SIMT_CONFIG "$v" "${SIMT_CASES[@]}"
done
echo "== simt backward variants ($(date +%T))"
for v in $SIMT_BWD_VARIANTS; do
  check FMHA_SIMT_BWD_CONFIG "$v" "*Kernel.Backward/*_simt_*:*Deterministic.*:Edge.*"
  bench FMHA_SIMT_BWD_CONFIG "$v" "${SIMT_BWD_CASES[@]}"
done
echo "== sm80 forward variants ($(date +%T))"
for v in $SM80_VARIANTS; do
  check FMHA_SM80_FWD_CONFIG "$v" "*Kernel.Forward/*_sm80_*:Edge.*"
  bench FMHA_SM80_FWD_CONFIG "$v" "${SM80_CASES[@]}"
done
echo "== sm80 backward variants ($(date +%T))"
for v in $SM80_BWD_VARIANTS; do
  check FMHA_SM80_BWD_CONFIG "$v" "*Kernel.Backward/*_sm80_*:*Deterministic.*:Edge.*"
  bench FMHA_SM80_BWD_CONFIG "$v" "${SM80_BWD_CASES[@]}"
done

echo
printf '%-10s  %-24s  %8s\n' variant case TFLOP/s
awk -F'\t' '{ printf "%-10s  %-24s  %8s\n", ($1 == "" ? "(default)" : $1), $2, $3 }' "$OUT/results.tsv"
echo "== done in $(( $(date +%s) - start )) s (status $status); CSVs and logs in $OUT"
exit $status
