#!/usr/bin/env bash
# fmha beside PyTorch's SDPA backends on an H100/H200, the issues' side-by-side measurements in one
# GPU call, from the repository root (results under $OUT):
#   pip install . (arch 90, head dims 64, 128 and 256, each tier's default kernels; FULL_INSTALL=1:
#   every variant, as before 2026-12-08)                                        -> pip.log
#   bench/compare_torch.py --sweep fa, $DTYPES (default bf16,fp16), forward and backward, beside
#     FlashAttention-2 and cuDNN, at least 5 repeats and about 50 ms of timed calls a point
#     (--min-time 0.05: a 0.2 ms call is the median of ~250 samples)            -> fa.log, fa/
#   bench/compare_torch.py --sweep seed beside cuDNN and the memory-efficient backend, 10 repeats
#                                                                              -> seed.log, seed/
#   bench/compare_decode.py beside FlashAttention-2 and cuDNN, with the paged cache -> decode.log, decode/
# then each sweep's fmha ÷ cuDNN table (`scripts/side_by_side_table.py`).
# STEPS (default "install fa seed decode") picks the parts; empty, only the tables of the results
# already in $OUT are printed.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
STEPS=${STEPS-"install fa seed decode"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if want install; then
  t0=$(date +%s)
  install() {  # pip install . with the given extra config settings
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -v --no-build-isolation --no-deps . \
      -C cmake.define.FMHA_CUDA_ARCHS=90 -C cmake.define.FMHA_HEAD_DIMS="64;128;256" "$@" > "$OUT/pip.log" 2>&1
  }
  # Each tier's default kernels only (no tuned variants; the decode kernel at 128, the one the
  # decode sweep calls): what these measurements run, in under half the compiles. A build that
  # refuses the lean settings is retried with every kernel.
  if [[ -n "${FULL_INSTALL:-}" ]] || ! install -C cmake.define.FMHA_TUNED_HEAD_DIMS= -C cmake.define.FMHA_DECODE_HEAD_DIMS=128; then
    [[ -z "${FULL_INSTALL:-}" ]] && { echo "lean install failed:"; tail -5 "$OUT/pip.log"; }
    install || { tail -30 "$OUT/pip.log"; exit 1; }
  fi
  echo "installed in $(( $(date +%s) - t0 )) s"
fi
cd /tmp  # the installed package, not the source tree's python/ folder
run() {  # name, time limit, command...
  local name=$1 limit=$2 t0=$(date +%s); shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
}
want fa && run fa 400 python3 "$ROOT/bench/compare_torch.py" --sweep fa --dtypes "${DTYPES:-bf16,fp16}" \
  --providers fmha,flash,cudnn --directions fwd,bwd --repeats 5 --min-time 0.05 --out "$OUT/fa"
want seed && run seed 120 python3 "$ROOT/bench/compare_torch.py" --sweep seed --providers fmha,cudnn,efficient \
  --repeats 10 --out "$OUT/seed"
want decode && run decode 120 python3 "$ROOT/bench/compare_decode.py" --providers fmha,fmha-paged,flash,cudnn \
  --out "$OUT/decode"
[[ -f "$OUT/fa/compare_torch.csv" ]] && python3 "$ROOT/scripts/side_by_side_table.py" "$OUT/fa/compare_torch.csv"
[[ -f "$OUT/seed.log" ]] && grep -E "^seed" "$OUT/seed.log"
[[ -f "$OUT/decode.log" ]] && grep -vE "^(wrote|TB/s)" "$OUT/decode.log"
exit 0
