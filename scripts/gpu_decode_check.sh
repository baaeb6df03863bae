#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root, for decoding:
#   pip install . (head dim 128), then bench/compare_decode.py: the decode cases beside PyTorch's
#   SDPA backends and the same run's device copy, fmha on its own cache layout, on PyTorch's
#   ([B, Hkv, S, D] memory) and paged                         -> decode/compare_decode.csv, decode.log
#   Nsight Compute on fmha's decode kernel at 16 × 8k, each layout: duration, DRAM throughput,
#   L2 hit rate and sectors per request                                           -> ncu_decode.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=decodecmp bash scripts/gpu_round.sh
echo "== ncu $(date +%T)"
for p in fmha fmha-bhsd fmha-paged; do
  echo "---- $p"
  timeout 90 ncu --kernel-name regex:decode_kernel --launch-skip 1 --launch-count 1 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    python3 bench/compare_decode.py --cases 16x8192 --providers $p --warmup 0 --repeats 1 --graph-bytes 1 \
    --copy-gib 0.25 --out "$OUT/ncu_tmp" 2>&1 | grep -E "decode_kernel|duration|throughput|bytes|hit|sectors|active|==ERROR" | head -12
done | tee "$OUT/ncu_decode.txt"
