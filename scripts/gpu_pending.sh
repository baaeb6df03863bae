#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: what was changed
# after the last GPU run without being run on a GPU since.
#   build     the CLI and GPU tests (arch 90, head dims 64, 128, 256) into $BUILD  -> build.log
#   fill      the time of `fmha bench` on a 2 GiB decode cache (the harness's random inputs,
#             filled on every core) and a misspelt switch's warning                 -> fill.txt
#   python    the Python package built and its tests run (scripts/gpu_python.sh; COMPARE, default
#             seed, its comparison sweep): fp32 calls under `auto` take split tf32 where
#             common/precision.h says so
#                                                                                   -> s_python.log
#   detprof   Nsight Compute's warp states and source counters (the top stall locations) of the
#             sm90 D256 causal backward, default and deterministic: where the deterministic call's
#             +19-23 % goes (the dQ warps' turns, the consumers' wait on the one dQ buffer)
#                                                                -> detprof_{default,det}.txt
# STEPS (default "build fill detprof python") picks the parts.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS="64;128;256"
source "$(dirname "$0")/sm90_ab.sh"
STEPS=${STEPS:-"build fill detprof python"}
T0=$(date +%s)  # the call's start: the last step gets what is left of a 600 s call
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-sm90}
if want build; then sm90_build "fmha_cli fmha_gpu_tests" || exit 1; fi
if want fill; then
  {
    t0=$(date +%s%N)
    timeout 120 "$B/fmha" bench --no-progress --dtype bf16 --heads 32 --kv-heads 8 --head-dim 128 --seqlen-q 1 \
      --batch 64 --seqlen-k 8192 --iters 50 2>&1 | tail -1
    echo "fmha bench, 64 x 8k decode cache (2 GiB a set, rotated sets): $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    FMHA_SM90_FWD_ORDER=head timeout 60 "$B/fmha" bench --no-progress --backend sm90 --dtype bf16 --head-dim 128 \
      --heads 16 --batch 2 --seqlen-q 2048 --iters 2 2>&1 | grep -E "fmha:|bf16"
  } | tee "$OUT/fill.txt"
fi
if want detprof; then
  for form in default det; do
    flags=""; [[ $form == det ]] && flags="--deterministic"
    timeout 150 ncu --section SpeedOfLight --section WarpStateStats --section SourceCounters -k regex:bwd_kernel -s 2 -c 1 \
      "$B/fmha" bench --backend sm90 --mode bwd --dtype bf16 --head-dim 256 --heads 8 --batch 4 --seqlen-q 4096 \
      --causal bottom-right $flags --warmup 2 --iters 1 --no-progress > "$OUT/detprof_$form.txt" 2>&1
    echo "detprof $form rc=$?"; grep -E "Duration|Stall|stall" "$OUT/detprof_$form.txt" | head -12
  done
fi
if want python; then
  left=$(( 590 - ($(date +%s) - T0) ))
  if (( left < 120 )); then echo "python: skipped, $left s left of the call (STEPS=python alone)"; else
    COMPARE=${COMPARE:-seed} timeout "$left" bash scripts/gpu_python.sh > "$OUT/s_python.log" 2>&1
    echo "python rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/s_python.log" | tail -20
  fi
fi
