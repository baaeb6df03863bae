#!/usr/bin/env bash
# The tuner on a CUDA machine, from the repository root, with a build made by scripts/gpu_check.sh
# (STEPS=build is enough):
#   BUILD=build-gpu-check scripts/gpu_autotune.sh
# 1. the GPU tuner tests (tests/gpu/tune_gpu_test.cpp: every tier's compiled variants agree with
#    the default, the winner is cached and dispatch runs it);
# 2. `fmha tune --sweep seed` and `fmha tune --sweep fa` into a cache of its own ($OUT/tune.json);
# 3. `fmha bench` of both sweeps with the built-in defaults (an empty cache) and with the tuned
#    cache, and one table: case, default TFLOP/s, tuned TFLOP/s, gain (what docs/PERF.md records).
# Environment: BUILD (default build-gpu-check), OUT (default ./out/autotune), SWEEPS (default
# "seed fa"), ITERS (default 20).
set -u -o pipefail
BUILD=${BUILD:-build-gpu-check}
OUT=${OUT:-$PWD/out/autotune}
SWEEPS=${SWEEPS:-"seed fa"}
ITERS=${ITERS:-20}
FMHA="$BUILD/fmha"
mkdir -p "$OUT"
status=0
start=$(date +%s)
unset FMHA_CPU_CONFIG FMHA_SIMT_CONFIG FMHA_SIMT_BWD_CONFIG FMHA_SM80_FWD_CONFIG FMHA_SM80_BWD_CONFIG FMHA_SM90_FWD_CONFIG

echo "== tuner tests ($(date +%T))"
if "$BUILD/tests/gpu/fmha_gpu_tests" --gtest_color=no --gtest_filter='Tiers/GpuTune.*' > "$OUT/tests.log" 2>&1; then
  grep -E "PASSED|SKIPPED" "$OUT/tests.log" | tail -3
else
  echo "   tuner tests FAIL (see $OUT/tests.log)"; status=1
fi

export FMHA_TUNE_CACHE="$OUT/tune.json"
rm -f "$FMHA_TUNE_CACHE"
for sweep in $SWEEPS; do
  echo "== fmha tune --sweep $sweep ($(date +%T))"
  if ! "$FMHA" tune --sweep "$sweep" --iters "$ITERS" --no-progress > "$OUT/tune_$sweep.txt" 2>&1; then status=1; fi
  tail -1 "$OUT/tune_$sweep.txt"
done
"$FMHA" tune --show > "$OUT/cache.txt" 2>&1
grep -c "^  [a-z]" "$OUT/cache.txt" | sed 's/^/   classes in the cache: /'

for sweep in $SWEEPS; do
  echo "== fmha bench --sweep $sweep: defaults, then tuned ($(date +%T))"
  FMHA_TUNE_CACHE="$OUT/empty.json" "$FMHA" bench --sweep "$sweep" --iters "$ITERS" --no-progress \
    --csv "$OUT/bench_${sweep}_default.csv" > "$OUT/bench_${sweep}_default.txt" 2>&1 || status=1
  "$FMHA" bench --sweep "$sweep" --iters "$ITERS" --no-progress --csv "$OUT/bench_${sweep}_tuned.csv" \
    > "$OUT/bench_${sweep}_tuned.txt" 2>&1 || status=1
  echo
  printf '%-44s %9s %9s %7s\n' case default tuned gain
  # Columns: backend,device,mode,dtype,batch,heads,kv_heads,seqlen_q,seqlen_k,head_dim,head_dim_v,causal,ms,tflops,status
  awk -F, 'FNR == 1 { next }
           { key = $1 " " $3 " " $4 " b" $5 " h" $6 " s" $8 " d" $10 " " $12 }
           NR == FNR { base[key] = $14; next }
           { if (key in base && base[key] > 0) printf "%-44s %9.1f %9.1f %6.2fx\n", key, base[key], $14, $14 / base[key] }' \
    "$OUT/bench_${sweep}_default.csv" "$OUT/bench_${sweep}_tuned.csv" | tee "$OUT/gain_$sweep.txt"
done
echo "== done in $(( $(date +%s) - start )) s (status $status); logs, CSVs and the cache in $OUT"
exit $status
