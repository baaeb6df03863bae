#!/usr/bin/env bash
# One short GPU pass over what changed last, from the repository root on an H100/H200 (results
# under $OUT): build; the whole GPU suite in shards and `fmha run --check` (scripts/gpu_check.sh);
# SASS and compute-sanitizer on the sm90 kernels (scripts/gpu_sm90.sh); memcheck on the packed
# (varlen) kernels; the sm90 backward at D128, default and deterministic, 4k and 16k.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH; B=$PWD/build-all; T=$B/tests/gpu/fmha_gpu_tests
OUT=$OUT BUILD=$B STEPS="build tests cli" SIMT_BWD_VARIANTS="" SHARDS=14 TEST_TIMEOUT=150 scripts/gpu_check.sh 2>&1 | grep -vE "^\[  SKIPPED|^\[  PASSED|tests from" | tail -14
grep -hE "^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | sort -u | head -20
grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" $OUT/gpu_tests.log | awk '{s[$2" "$3]+=$4} END{for(k in s) print k, s[k]}'
OUT=$OUT BUILD=$B STEPS="sass sanitize" timeout 90 scripts/gpu_sm90.sh 2>&1 | grep -v "^ok" | tail -9
timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_color=no --gtest_filter='Varlen.*:*VarlenKernel*causalBR_varlen8*' > $OUT/varlen_memcheck.log 2>&1; echo "varlen memcheck rc=$?"; tail -2 $OUT/varlen_memcheck.log
F="$B/fmha bench --backend sm90 --mode bwd --dtype bf16 --iters 10 --head-dim 128"
for c in none bottom-right; do for d in "" --deterministic; do timeout 25 $F --batch 4 --heads 16 --seqlen-q 4096 --seqlen-k 4096 --causal $c $d 2>&1 | tail -1; timeout 25 $F --batch 1 --heads 16 --seqlen-q 16384 --seqlen-k 16384 --causal $c $d 2>&1 | tail -1; done; done | tee $OUT/bench_det.txt

