#!/usr/bin/env bash
# The sm90 backward of this tree against a base commit's, in one GPU call on an H100/H200 (results
# under $OUT), from the repository root:
#   build     this tree (arch 90, head dims 64 and 128) into $BUILD with its GPU tests, and the
#             CLI of the base commit's sources in $BASE_SRC (default .base-src; written by
#             `bash scripts/gpu_fwd_ab.sh prepare <commit>`) into $BASE_BUILD
#   tests     the sm90 backward's kernel sweep, varlen, deterministic, few-key, peaked-softmax,
#             large-offset and edge tests in 6 processes, and the sm90 forward's      -> tests.log
#   sanitize  racecheck, synccheck and memcheck on the small sm90 bf16 backward cases at head dim
#             64 (a deterministic one among them)                            -> sanitize_*.log
#   bench     `fmha bench --backend sm90 --mode bwd --dtype bf16` at 16k tokens a call, hidden 2048,
#             head dims $DIMS, lengths $LENGTHS, causal none and bottom-right, base and tree,
#             $ROUNDS interleaved rounds                                          -> bwd_ab.txt
# STEPS (default "build tests sanitize bench") picks the parts.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
source "$(dirname "$0")/sm90_fwd_bench.sh"
STEPS=${STEPS:-"build tests sanitize bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
BASE_SRC=${BASE_SRC:-$PWD/.base-src}
B=${BUILD:-$PWD/build-sm90}
BB=${BASE_BUILD:-/tmp/fmha-base}
T=$B/tests/gpu/fmha_gpu_tests
DIMS=${DIMS:-64 128}
LENGTHS=${LENGTHS:-512 1024 2048 4096 16384}
if want build; then
  t0=$(date +%s)
  [[ -f "$BASE_SRC/CMakeLists.txt" ]] || { echo "no base sources in $BASE_SRC (gpu_fwd_ab.sh prepare <commit>)"; exit 1; }
  { sm90_fwd_configure . "$B" && sm90_fwd_configure "$BASE_SRC" "$BB"; } > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  timeout 400 ninja -C "$B" -j"$(nproc)" fmha_cli fmha_gpu_tests >> "$OUT/build.log" 2>&1 &&
    timeout 300 ninja -C "$BB" -j"$(nproc)" fmha_cli >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
  echo "built the tree and base $(cat "$BASE_SRC/.commit" 2>/dev/null) in $(( $(date +%s) - t0 )) s"
fi
if want tests; then
  FILTER='Sweep/Kernel.Backward/*sm90*:Tiers/VarlenKernel.Backward/*sm90*:Tiers/Deterministic.*sm90*'
  FILTER+=':Tiers/FewKeys.*sm90*:Fuzz/GpuPeakedSoftmax.*sm90*:LargeOffsets.*:Edge.*'
  FILTER+=':Sweep/Kernel.Forward/*sm90*:Sm90Schedule.*:Tiers/VarlenKernel.Forward/*sm90*'
  for i in 0 1 2 3 4 5; do
    GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout 200 $T --gtest_color=no --gtest_brief=1 \
      --gtest_filter="$FILTER" > "$OUT/shard_$i.log" 2>&1 &
  done
  wait
  cat "$OUT"/shard_*.log > "$OUT/tests.log"; rm -f "$OUT"/shard_*.log
  grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]|tests? from .* ran" "$OUT/tests.log" | sort | uniq -c
  grep -E "^\[  FAILED  \] [A-Z]" "$OUT/tests.log" | sort -u | head -20
fi
if want sanitize; then
  SMALL='Sweep/Kernel.Backward/Small_sm90_bf16_*_d64*'
  for tool in racecheck synccheck memcheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 $T --gtest_color=no --gtest_brief=1 \
      --gtest_filter="$SMALL" > "$OUT/sanitize_$tool.log" 2>&1; echo "$tool rc=$?"
    grep -E "ERROR SUMMARY|tests? from .* ran|PASSED|FAILED" "$OUT/sanitize_$tool.log" | tail -3
  done
fi
want bench || exit 0
bench() {  # label, cli, head dim, round -> label round d length causal TFLOP/s
  local h=$((2048 / $3)) c s
  for c in none bottom-right; do for s in $LENGTHS; do
    timeout 30 "$2" bench --backend sm90 --mode bwd --dtype bf16 --head-dim "$3" --heads $h --batch $((16384 / s)) \
      --seqlen-q $s --causal $c --iters 20 --no-progress 2>&1 | tail -1 |
      awk -v l="$1" -v r="$4" -v d="$3" -v s=$s -v c=$c '{print l, r, d, s, c, $(NF-1)}'
  done; done
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for d in $DIMS; do
    bench base "$BB/fmha" $d $r
    bench tree "$B/fmha" $d $r
  done
done | tee "$OUT/bwd_ab.txt"
