# Sourced by the sm90 tier's GPU comparison scripts (gpu_fwd_ab.sh, gpu_bwd_ab.sh,
# gpu_fwd_variants.sh): their build configuration, the base commit's sources, the build of this
# tree beside the base, and the benchmark step.

# cmake configure of source dir $1 into build dir $2: arch 90, head dims $AB_HEAD_DIMS (default 64
# and 128), every variant compiled at $AB_TUNED_HEAD_DIMS (default 64 and 128; of 64, 128, 256),
# more cmake arguments in $AB_CMAKE_ARGS (`-DFMHA_SM90_SPEC_HEAD_DIMS=...`: spec at more head dims).
sm90_configure() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS="${AB_HEAD_DIMS:-64;128}" \
    -DFMHA_TUNED_HEAD_DIMS="${AB_TUNED_HEAD_DIMS:-64;128}" -DFMHA_DECODE_HEAD_DIMS=128 ${AB_CMAKE_ARGS:-}
}

# The sources of commit $1 (docs/ left out) into $BASE_SRC, run in the repository: where the GPU
# machine gets a copy of the working tree without its git history, the base's sources go along as
# this folder (ignored through .git/info/exclude); copy it with the tree.
sm90_prepare_base() {
  local commit=${1:?usage: <script> prepare <commit>}
  mkdir -p .git/info && { grep -qx '/.base-src/' .git/info/exclude 2>/dev/null || echo /.base-src/ >> .git/info/exclude; }
  rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC"
  git archive "$commit" $(git ls-tree --name-only "$commit" | grep -v '^docs$') | tar -x -C "$BASE_SRC"
  echo "$(git rev-parse --short "$commit")" > "$BASE_SRC/.commit"
  echo "base sources of $(cat "$BASE_SRC/.commit") in $BASE_SRC ($(du -sh "$BASE_SRC" | cut -f1))"
}

# This tree's targets $1 into $B (log: $OUT/build.log).
sm90_build() {
  local t0=$(date +%s)
  sm90_configure . "$B" > "$OUT/build.log" 2>&1 && timeout 400 ninja -C "$B" -j"$(nproc)" $1 >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -20; return 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
}

# This tree's targets $1 into $B and the CLI of $BASE_SRC into $BB (log: $OUT/build.log); the
# base at head dims $BASE_HEAD_DIMS where set (those it is benchmarked at), else the tree's.
# BUILD_TIMEOUT and BASE_BUILD_TIMEOUT (seconds, default 400 and 300) bound the two builds.
sm90_build_tree_and_base() {
  local t0=$(date +%s)
  [[ -f "$BASE_SRC/CMakeLists.txt" ]] || { echo "no base sources in $BASE_SRC (<script> prepare <commit>)"; return 1; }
  { sm90_configure . "$B" && AB_HEAD_DIMS="${BASE_HEAD_DIMS:-${AB_HEAD_DIMS:-}}" sm90_configure "$BASE_SRC" "$BB"; } \
    > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; return 1; }
  timeout "${BUILD_TIMEOUT:-400}" ninja -C "$B" -j"$(nproc)" $1 >> "$OUT/build.log" 2>&1 &&
    timeout "${BASE_BUILD_TIMEOUT:-300}" ninja -C "$BB" -j"$(nproc)" fmha_cli >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -20; return 1; }
  echo "built the tree and base $(cat "$BASE_SRC/.commit" 2>/dev/null) in $(( $(date +%s) - t0 )) s"
}

# `fmha bench --backend sm90 --mode $1 --dtype bf16` at 16k tokens a call, hidden 2048, causal
# none and bottom-right, for: mode $1 (fwd, bwd), label $2, CLI $3, forward variant $4 (empty: the
# call's default), head dim $5, round $6, lengths $7, iterations $8. One line per case: label
# round head_dim length causal, then the bench line. BENCH_EXTRA: more `fmha bench` arguments
# (`--deterministic`).
sm90_bench() {
  local h=$((2048 / $5)) c s
  for c in none bottom-right; do for s in $7; do
    env ${4:+FMHA_SM90_FWD_CONFIG=$4} timeout 30 "$3" bench --backend sm90 --mode "$1" --dtype bf16 --head-dim "$5" \
      --heads $h --batch $((16384 / s)) --seqlen-q $s --causal $c --iters "$8" --no-progress ${BENCH_EXTRA:-} 2>&1 | tail -1 |
      awk -v l="$2" -v r="$6" -v d="$5" -v s=$s -v c=$c '{print l, r, d, s, c, $0}'
  done; done
}

# GPU tests binary $1 with gtest filter $2 in $3 shards run side by side (each at most $4 s), the
# shards' output in $OUT/$5, then the pass/fail/skip counts and the failed tests' names. The
# caller's environment (a prefix assignment such as FMHA_SM90_FWD_ORDER=heads) reaches the tests.
sm90_sharded_tests() {
  local i
  for i in $(seq 0 $(($3 - 1))); do
    GTEST_TOTAL_SHARDS=$3 GTEST_SHARD_INDEX=$i timeout "$4" "$1" --gtest_color=no --gtest_brief=1 \
      --gtest_filter="$2" > "$OUT/shard_$i.log" 2>&1 &
  done
  wait
  cat "$OUT"/shard_*.log > "$OUT/$5"; rm -f "$OUT"/shard_*.log
  grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]|tests? from .* ran" "$OUT/$5" | sort | uniq -c
  grep -E "^\[  FAILED  \] [A-Z]" "$OUT/$5" | sort -u | head -20
}

# compute-sanitizer tools $4.. on GPU tests binary $1 with gtest filter $2, each at most $3 s:
# $OUT/sanitize_<tool>.log per tool, its exit status and summary lines printed. The whole run
# exits 1 from the tool where it reports an error or hazard.
sm90_sanitize() {
  local tests=$1 filter=$2 limit=$3 tool
  shift 3
  for tool in "$@"; do
    timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 1 "$tests" --gtest_color=no --gtest_brief=1 \
      --gtest_filter="$filter" > "$OUT/sanitize_$tool.log" 2>&1
    echo "$tool rc=$?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests? from .* ran|FAILED" "$OUT/sanitize_$tool.log" | tail -3
  done
}
