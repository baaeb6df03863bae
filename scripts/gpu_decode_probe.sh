#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root, for decoding's
# split merge launched as a programmatic dependent of the decode kernel, and the split counts:
#   build (scripts/gpu_round.sh: head dims 64 and 128, decode head dims 64, 128, 256) while
#   `pip install .` builds the module (head dim 128)
#   the decode, merge and paged GPU tests, the decode tests 20 times more (the merge reading the
#   parts of a kernel that may still run), memcheck and racecheck on a split decode test, the
#   package's CUDA tests of the KV cache and graph capture                      -> tests.log
#   bench/compare_decode.py twice: the merge launched dependent, then FMHA_DEPENDENT_LAUNCH=0
#                                                               -> decode_dep.csv, decode_nodep.csv
#   fmha bench at 1 × 8k and 1 × 128k (bf16, 32/8 heads, D128) at forced split counts
#   (scripts/gpu_decode_splits.sh)                                                   -> splits.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
(CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps . \
   -C cmake.define.FMHA_CUDA_ARCHS=90 -C cmake.define.FMHA_HEAD_DIMS=128 -C cmake.define.FMHA_DECODE_HEAD_DIMS=128 \
   > "$OUT/pip.log" 2>&1; echo "pip rc=$?" >> "$OUT/pip.log") &
STEPS=build HEAD_DIMS="64;128" DECODE_HEAD_DIMS="64;128;256" BUILD_TIMEOUT=250 bash scripts/gpu_round.sh || exit 1
wait; tail -1 "$OUT/pip.log"
T=build-sm90/tests/gpu/fmha_gpu_tests
echo "== tests $(date +%T)"
{
  timeout 120 $T --gtest_color=no --gtest_brief=1 --gtest_filter='DecodeGpu.*:MergeCuda.*:*Paged*'
  timeout 120 $T --gtest_color=no --gtest_brief=1 --gtest_filter='DecodeGpu.*' --gtest_repeat=20 | grep -E "FAILED|Failure" | sort | uniq -c
  for tool in memcheck racecheck; do
    echo "---- $tool"
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_color=no --gtest_brief=1 \
      --gtest_filter='DecodeGpu.DenseCallSplitAcrossCtas:DecodeGpu.ContiguousCacheWithLengths'; echo "$tool rc=$?"
  done
  timeout 200 python3 -m pytest tests/python -q -rs -p no:cacheprovider -k "cuda or graph"
} > "$OUT/tests.log" 2>&1
grep -E "tests? from .* ran|PASSED|FAILED|Failure|ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|failed" "$OUT/tests.log" | head -30
echo "== compare_decode $(date +%T)"
for round in 1 2; do
  timeout 100 python3 bench/compare_decode.py --providers fmha,fmha-paged,cudnn --out "$OUT/dep$round" > "$OUT/dep$round.log" 2>&1
  FMHA_DEPENDENT_LAUNCH=0 timeout 100 python3 bench/compare_decode.py --providers fmha,fmha-paged,cudnn \
    --out "$OUT/nodep$round" > "$OUT/nodep$round.log" 2>&1
done
for f in dep1 nodep1 dep2 nodep2; do echo "---- $f"; grep -E "^ +[0-9]" "$OUT/$f.log"; done | tee "$OUT/decode_ab.txt"
echo "== splits $(date +%T)"
{
  CASES=1x8192 SPLITS="0 8 16 24 32 48 64 96 128" ROUNDS=1 BUILD=build-sm90 OUT=/tmp/probe-splits bash scripts/gpu_decode_splits.sh
  CASES=1x131072 SPLITS="0 16 32 64 128 256" ROUNDS=1 BUILD=build-sm90 OUT=/tmp/probe-splits bash scripts/gpu_decode_splits.sh
} | tee "$OUT/splits.txt"
cd "$OUT" && tar czf probe_logs.tar.gz ./*.log dep1 nodep1 dep2 nodep2 && rm -rf ./*.log dep1 nodep1 dep2 nodep2
