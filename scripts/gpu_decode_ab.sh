#!/usr/bin/env bash
# The decode kernel of this tree against a base commit's, in one GPU call on an H100/H200, from
# the repository root. First, on a machine with the git history: `bash scripts/gpu_decode_ab.sh
# prepare <commit>` writes the base's sources into $BASE_SRC (default .base-src; carry it to the
# GPU machine). Then, there: builds this tree's CLI and GPU tests into $BUILD (default
# ./build-sm90) and the base's CLI into $BASE_BUILD (default /tmp/fmha-base; sm90_ab.sh); runs
# the decode and paged GPU tests and memcheck on the decode tests (-> decode_tests.log,
# memcheck.log); then `fmha bench` of both CLIs interleaved (bf16, one query token, 32 query heads
# over 8 KV heads, D128; contiguous and paged with pages of 64) at each batch × KV length of
# $CASES, $ROUNDS rounds (-> decode_ab.txt: round, case, layout, cli, then the bench line).
set -u
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS="${AB_HEAD_DIMS:-64;128;256}"
source "$(dirname "$0")/sm90_ab.sh"
BASE_SRC=${BASE_SRC:-$PWD/.base-src}
if [[ "${1:-}" == prepare ]]; then sm90_prepare_base "${2:-}"; exit; fi
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=${BUILD:-$PWD/build-sm90}; BB=${BASE_BUILD:-/tmp/fmha-base}
sm90_build_tree_and_base "fmha_cli fmha_gpu_tests" || exit 1
T=$B/tests/gpu/fmha_gpu_tests
timeout 200 "$T" --gtest_color=no --gtest_brief=1 --gtest_filter='DecodeGpu.*:*Paged*' > "$OUT/decode_tests.log" 2>&1
grep -E "tests? from .* ran|PASSED|FAILED" "$OUT/decode_tests.log" | head -12
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 "$T" --gtest_color=no --gtest_brief=1 \
  --gtest_filter='DecodeGpu.*' > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1
for r in $(seq 1 "${ROUNDS:-2}"); do for c in ${CASES:-16x8192 16x32768 64x8192 1x131072}; do
  for layout in contiguous paged; do for cli in base tree; do
    bin=$B/fmha; [[ $cli == base ]] && bin=$BB/fmha
    pg=""; [[ $layout == paged ]] && pg="--paged --page-size 64"
    line=$(timeout 60 "$bin" bench --no-progress --dtype bf16 --heads 32 --kv-heads 8 --head-dim 128 --seqlen-q 1 \
      --batch "${c%x*}" --seqlen-k "${c#*x}" $pg --iters 50 --rotate 1 2>&1 | tail -1)
    echo "$r $c $layout $cli | $line"
  done; done
done; done | tee "$OUT/decode_ab.txt"
