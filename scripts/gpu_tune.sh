#!/usr/bin/env bash
# What tuning gains on a GPU, from the repository root with a build in $BUILD (default ./build-sm90):
# `fmha tune` over the fa sweep (bf16, DIRECTIONS, default fwd, on BACKEND, default sm90) and the
# seed shape (fp32 and tf32, backend auto) into a fresh cache $OUT/tune_cache.json, then the same
# sweeps benchmarked with that cache and without one -> $OUT/tune.txt, $OUT/tune_bench.txt.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-$PWD/build-sm90}
FMHA="$BUILD/fmha"
mkdir -p "$OUT"
export FMHA_TUNE_CACHE="$OUT/tune_cache.json"
rm -f "$FMHA_TUNE_CACHE"
status=0
for mode in ${DIRECTIONS:-fwd}; do
  "$FMHA" tune --sweep fa --dtype bf16 --mode "$mode" --backend "${BACKEND:-sm90}" --iters 10 --no-progress >> "$OUT/tune.txt" 2>&1 || status=1
done
for dtype in fp32 tf32; do "$FMHA" tune --sweep seed --dtype $dtype --iters 10 --no-progress >> "$OUT/tune.txt" 2>&1 || status=1; done
tail -3 "$OUT/tune.txt"
bench() {  # label, then the cache to use
  for mode in ${DIRECTIONS:-fwd}; do
    FMHA_TUNE_CACHE="$2" "$FMHA" bench --sweep fa --backend "${BACKEND:-sm90}" --mode "$mode" --dtype bf16 --iters 10 --no-progress 2>&1 |
      awk -v l="$1" 'NR > 1 {print l, $0}'
  done
  for dtype in fp32 tf32; do
    FMHA_TUNE_CACHE="$2" "$FMHA" bench --sweep seed --dtype $dtype --iters 20 --no-progress 2>&1 | awk -v l="$1" 'NR > 1 {print l, $0}'
  done
}
for round in 1 2; do
  bench default "$OUT/no_cache.json" >> "$OUT/tune_bench.txt"
  bench tuned "$FMHA_TUNE_CACHE" >> "$OUT/tune_bench.txt"
done
# Per shape: the best of the two rounds, default vs tuned.
awk '{key = $2 " " $3 " " $4 " " $5 " " $6 " " $7 " " $9 " " $10; tf = ($NF ~ /\./ && NF >= 13) ? $(NF-1) : $NF;
      if (tf > best[$1, key]) best[$1, key] = tf; keys[key] = 1}
     END {for (k in keys) printf "%-40s default %7.1f  tuned %7.1f  (%+.1f %%)\n", k, best["default", k], best["tuned", k],
          100 * (best["tuned", k] / best["default", k] - 1)}' "$OUT/tune_bench.txt" | sort -k3,3n -k2 | tee "$OUT/tune_gain.txt"
exit $status
