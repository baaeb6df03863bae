#!/usr/bin/env bash
# The sm90 forward's walks of its work tiles (TileScheduler: each head's query tiles together, the
# default for calls without a causal mask or window since run 60, or the heads of an L2 section
# fastest under FMHA_SM90_FWD_ORDER=heads; sections of a 32 MB budget, or 16 under
# FMHA_SM90_L2_SECTION_MB=16) checked and measured in one GPU call on an H100/H200, from the
# repository root:
#   build    the CLI and GPU tests (arch 90, head dims 64, 128, 256) into $BUILD
#   tests    the sm90 forward suite under FMHA_SM90_FWD_ORDER=heads             -> tests.log
#   bench    `fmha bench --backend sm90 --mode fwd --dtype bf16`, 16k tokens a call, hidden 2048,
#            head dims $DIMS, lengths $LENGTHS, causal none and bottom-right, three forms:
#            `heads` (FMHA_SM90_FWD_ORDER=heads), `tiles` (the default), `tiles16` (that and 16 MB
#            sections: causal calls' sections halve), $ROUNDS interleaved rounds
#                                                                                 -> order_ab.txt
#   dram     Nsight Compute's DRAM bytes and duration of the D256 2k forward and the D64 2k causal
#            one under each form                                                  -> order_dram.txt
#   det      the deterministic backward (whose sections take the same budget) at 32 and 16 MB
#            beside the default backward: D256 and D64, causal, 4k and 16k, $ROUNDS rounds
#                                                                                 -> det_ab.txt
# STEPS (default "build tests bench dram det") picks the parts. The model that predicts the bytes:
# docs/perf/sm90_forward_order_l2_model.py.
set -u
source "$(dirname "$0")/sm90_ab.sh"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS="64;128;256"
STEPS=${STEPS:-"build tests bench dram det"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-sm90}
if want build; then sm90_build "fmha_cli fmha_gpu_tests" || exit 1; fi
if want tests; then
  filter='Sweep/Kernel.Forward/*sm90*:Tiers/VarlenKernel.Forward/*sm90*:*Sm90Schedule*:LargeOffsets.*:Edge.*'
  FMHA_SM90_FWD_ORDER=heads sm90_sharded_tests "$B/tests/gpu/fmha_gpu_tests" "$filter" 4 200 tests.log
fi
if want bench; then
  lengths=${LENGTHS:-2048 4096 16384}
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for d in ${DIMS:-256 64}; do
      FMHA_SM90_FWD_ORDER=heads sm90_bench fwd heads "$B/fmha" "" "$d" "$r" "$lengths" 20
      sm90_bench fwd tiles "$B/fmha" "" "$d" "$r" "$lengths" 20
      FMHA_SM90_L2_SECTION_MB=16 sm90_bench fwd tiles16 "$B/fmha" "" "$d" "$r" "$lengths" 20
    done
  done | awk '{print $1, $2, $3, $4, $5, $(NF-1)}' | tee "$OUT/order_ab.txt"
fi
if want dram; then
  dram() {  # label, environment assignments (may be empty), then the bench arguments
    local label=$1 vars=$2; shift 2
    env $vars timeout 120 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
      -k regex:^fwd_kernel -s 2 -c 1 "$B/fmha" bench --backend sm90 --mode fwd --dtype bf16 "$@" --warmup 2 --iters 1 \
      --no-progress 2>&1 | grep -E "dram__bytes|gpu__time" | sed "s/^/$label /"
  }
  for form in heads tiles tiles16; do
    case $form in
      heads) vars="FMHA_SM90_FWD_ORDER=heads" ;;
      tiles) vars="" ;;
      tiles16) vars="FMHA_SM90_L2_SECTION_MB=16" ;;
    esac
    dram "$form D256-2k" "$vars" --head-dim 256 --heads 8 --batch 8 --seqlen-q 2048
    dram "$form D64-2k-causal" "$vars" --head-dim 64 --heads 32 --batch 8 --seqlen-q 2048 --causal bottom-right
  done | tee "$OUT/order_dram.txt"
fi
if want det; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for d in 256 64; do for s in 4096 16384; do
      for form in default det det16; do
        case $form in
          default) vars="" flags="" ;;
          det) vars="" flags="--deterministic" ;;
          det16) vars="FMHA_SM90_L2_SECTION_MB=16" flags="--deterministic" ;;
        esac
        env $vars timeout 30 "$B/fmha" bench --backend sm90 --mode bwd --dtype bf16 --head-dim "$d" --heads $((2048 / d)) \
          --batch $((16384 / s)) --seqlen-q "$s" --causal bottom-right $flags --iters 20 --no-progress 2>&1 | tail -1 |
          awk -v f=$form -v r=$r -v d=$d -v s=$s '{print f, r, d, s, "bottom-right", $(NF-1)}'
      done
    done; done
  done | tee "$OUT/det_ab.txt"
fi
