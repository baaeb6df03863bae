#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root, for decoding:
#   build (scripts/gpu_round.sh, head dims HEAD_DIMS, default 128; decode head dims 64, 128, 256),
#   then the decode and merge GPU tests and memcheck on the decode tests      -> decode_tests.log
#   pip install . (head dim 128), then bench/compare_decode.py (DECODE_ARGS): the decode cases
#   beside PyTorch's SDPA backends and the same run's device copy, fmha on its own cache layout,
#   on PyTorch's ([B, Hkv, S, D] memory) and paged               -> decode/compare_decode.csv, decode.log
#   NCU=1: Nsight Compute on fmha's decode kernel at 16 × 8k, each layout: duration, DRAM
#   throughput, L2 hit rate and sectors                                            -> ncu_decode.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=build HEAD_DIMS="${HEAD_DIMS:-128}" DECODE_HEAD_DIMS="64;128;256" BUILD_TIMEOUT=200 bash scripts/gpu_round.sh || exit 1
T=build-sm90/tests/gpu/fmha_gpu_tests
echo "== decode tests $(date +%T)"
timeout 120 $T --gtest_color=no --gtest_brief=1 --gtest_filter='DecodeGpu.*:MergeCuda.*:*Paged*' > $OUT/decode_tests.log 2>&1
grep -E "tests? from .* ran|PASSED|FAILED" $OUT/decode_tests.log | head -12
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 $T --gtest_color=no --gtest_brief=1 \
  --gtest_filter='DecodeGpu.*' >> $OUT/decode_tests.log 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY" $OUT/decode_tests.log | tail -1
STEPS=decodecmp bash scripts/gpu_round.sh
if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu $(date +%T)"
  for p in fmha fmha-bhsd fmha-paged; do
    echo "---- $p"
    timeout 90 ncu --kernel-name regex:decode_kernel --launch-skip 1 --launch-count 1 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,smsp__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed \
      python3 bench/compare_decode.py --cases 16x8192 --providers $p --warmup 0 --repeats 1 --graph-bytes 1 \
      --copy-gib 0.25 --out "$OUT/ncu_tmp" 2>&1 | grep -E "decode_kernel|duration|throughput|bytes|hit|sectors|active|==ERROR" | head -12
  done | tee "$OUT/ncu_decode.txt"
fi
