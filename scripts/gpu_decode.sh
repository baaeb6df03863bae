#!/usr/bin/env bash
# The decode kernel's GPU pass, from the repository root on an H100/H200 (results under $OUT):
# build; the whole GPU suite in shards and `fmha run --check` (scripts/gpu_check.sh);
# memcheck and racecheck on the sm80 decode kernel (broken device table, many splits, append_kv,
# graph replay); the decode sweep (contiguous and paged, page 64); 1 x 128k with forced splits.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH; B=$PWD/build-all; T=$B/tests/gpu/fmha_gpu_tests
OUT=$OUT BUILD=$B STEPS="build tests cli" SIMT_BWD_VARIANTS="" SHARDS=14 TEST_TIMEOUT=150 scripts/gpu_check.sh 2>&1 | grep -vE "^\[  SKIPPED|^\[  PASSED|tests from" | tail -14
grep -hE "^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | sort -u | head -20
grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" $OUT/gpu_tests.log | awk '{s[$2" "$3]+=$4} END{for(k in s) print k, s[k]}'
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_color=no --gtest_filter='DecodeGpu.BrokenDeviceTableIsClamped:DecodeGpu.SplitCountsFromOneToMany:DecodeGpu.AppendKvOnDevice:DecodeGpu.CudaGraphCaptureAndReplay' > $OUT/decode_memcheck.log 2>&1; echo "decode memcheck rc=$?"; tail -2 $OUT/decode_memcheck.log
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_color=no --gtest_filter='DecodeGpu.SplitCountsFromOneToMany:DecodeGpu.DenseCallSplitAcrossCtas' > $OUT/decode_racecheck.log 2>&1; echo "decode racecheck rc=$?"; tail -2 $OUT/decode_racecheck.log
timeout 240 $B/fmha bench --sweep decode --page-size 64 --no-progress --csv $OUT/decode.csv 2>&1 | tee $OUT/bench_decode.txt
for s in 1 8 32; do timeout 30 $B/fmha bench --backend sm80 --paged --page-size 64 --batch 1 --heads 32 --kv-heads 8 --seqlen-q 1 --seqlen-k 131072 --head-dim 128 --dtype bf16 --causal bottom-right --num-splits $s 2>&1 | tail -1; done | tee $OUT/bench_decode_splits.txt
