#!/usr/bin/env bash
# One GPU round on an H100/H200, from the repository root, every part chosen by the environment
# (results under $OUT):
#   build     arch 90 (ARCHS), head dims HEAD_DIMS (default every sm90 one), decode head dims
#             DECODE_HEAD_DIMS (default 128), -lineinfo                              -> build.log
#   tests     the sm90 tile tests, then fmha_gpu_tests --gtest_filter=$FILTER in SHARDS processes
#             of at most TEST_TIMEOUT s each                                          -> tests.log
#   sanitize  memcheck and racecheck over SANITIZE_FILTER                              -> sanitize.log
#   amx       the CPU suite's AMX cases with FMHA_CPU_ISA=amxbf16 (on a CPU with AMX)   -> amx.log
#   cputorch  the CPU-only Python module (build-py), then bench/compare_torch_cpu.py on the
#             machine's cores, CPU_SETS (default long), CPU_ARGS (more of its options, e.g.
#             "--dtypes bf16 --directions fwd")         -> cpu/compare_torch_cpu.csv, cputorch.log
#   pytorch   pip install . (HEAD_DIMS, ARCHS), then bench/compare_varlen.py and the package's
#             CUDA tests (pytest -k cuda)                                     -> varlen.log, pytest.log
#   decodecmp pip install . (head dim 128 only), then bench/compare_decode.py: the decode cases
#             beside PyTorch's SDPA backends and the device copy       -> decode/compare_decode.csv, decode.log
#   profile   scripts/gpu_profile.sh with PROFILE_CASES                                -> ncu_*
#   bench     the groups in BENCHES: fa-fwd, fa-bwd (sm90, bf16), seed (every tier), varlen (sm90),
#             merge, decode; BENCH_EXTRA: more `fmha bench` argument lines, one per line -> bench.txt
# STEPS (default "build tests bench") picks the parts.
set -u -o pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${BUILD:-$PWD/build-sm90}
STEPS=${STEPS:-"build tests bench"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $* ($(date +%T))"; }
status=0
T="$B/tests/gpu/fmha_gpu_tests"

if want build; then
  step build
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS="${ARCHS:-90}" \
    -DFMHA_HEAD_DIMS="${HEAD_DIMS:-64;96;128;192;256}" -DFMHA_DECODE_HEAD_DIMS="${DECODE_HEAD_DIMS:-128}" -DCMAKE_CUDA_FLAGS=-lineinfo \
    > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  timeout "${BUILD_TIMEOUT:-300}" ninja -C "$B" -j"$(nproc)" fmha_cli fmha_gpu_tests fmha_tile_sm90_tests \
    fmha_tile_tests fmha_dispatch_tests fmha_tests >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  echo "   built in $(( $(date +%s) - t0 )) s"
fi

if want tests; then
  step "tests -> tests.log"
  timeout 60 "$B/tests/gpu/fmha_tile_sm90_tests" --gtest_color=no > "$OUT/tests.log" 2>&1 || status=1
  timeout 60 "$B/tests/gpu/fmha_tile_tests" --gtest_color=no >> "$OUT/tests.log" 2>&1 || status=1
  timeout 60 "$B/tests/gpu/fmha_dispatch_tests" --gtest_color=no >> "$OUT/tests.log" 2>&1 || status=1
  SHARDS=${SHARDS:-8}
  for ((i = 0; i < SHARDS; ++i)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout "${TEST_TIMEOUT:-200}" "$T" --gtest_color=no \
      --gtest_brief=1 --gtest_filter="${FILTER:-*sm90*}" > "$OUT/shard_$i.log" 2>&1 &
  done
  wait
  for ((i = 0; i < SHARDS; ++i)); do
    grep -q "tests\? from .* ran" "$OUT/shard_$i.log" || echo "   shard $i: cut by its time limit"
    cat "$OUT/shard_$i.log" >> "$OUT/tests.log"; rm -f "$OUT/shard_$i.log"
  done
  grep -hE "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" "$OUT/tests.log" |
    awk '{s[$2" "$3]+=$4} END{for(k in s) print "  ", k, s[k]}'
  grep -E "^\[  FAILED  \] [A-Z]" "$OUT/tests.log" | sort -u | head -30
fi

if want sanitize; then
  step "memcheck, racecheck -> sanitize.log"
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$OUT/sanitize.log"
    timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 1 "$T" --gtest_color=no --gtest_brief=1 \
      --gtest_filter="$SANITIZE_FILTER" >> "$OUT/sanitize.log" 2>&1 || { status=1; echo "   $tool: failed or cut"; }
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | tail -1
  done
fi

if want amx; then
  step "AMX cases -> amx.log"
  grep -o 'amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  "$B/fmha" info 2>&1 | grep -i "cpu path" | tee "$OUT/amx.log"
  FMHA_CPU_ISA=amxbf16 timeout 240 "$B/tests/fmha_tests" --gtest_color=no --gtest_brief=1 \
    --gtest_filter='CpuPaths.*:CpuAmxGemm.*:*amxbf16*:Fuzz/CpuFuzz.*:Varlen.*:Semantics.*' >> "$OUT/amx.log" 2>&1 ||
    status=1
  grep -E "^\[  PASSED|^\[  FAILED|tests? from .* ran" "$OUT/amx.log" | head
fi

if want cputorch; then
  step "CPU beside PyTorch -> cputorch.log"
  (cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA=OFF -DFMHA_PYTHON=ON \
     -DFMHA_BUILD_TESTS=OFF -DFMHA_BUILD_CLI=OFF && ninja -C build-py -j"$(nproc)") > "$OUT/cputorch_build.log" 2>&1 ||
    { tail -20 "$OUT/cputorch_build.log"; status=1; }
  PKG=$(mktemp -d); mkdir -p "$PKG/fmha"; cp python/fmha/*.py "$PKG/fmha/"; find build-py -name "_C*.so" -exec cp {} "$PKG/fmha/" \;
  PYTHONPATH=$PKG timeout 300 python3 bench/compare_torch_cpu.py --set "${CPU_SETS:-long}" --rounds 3 \
    --threads "$(nproc)" ${CPU_ARGS:-} --out "$OUT/cpu" > "$OUT/cputorch.log" 2>&1 || status=1
  tail -15 "$OUT/cputorch.log"
fi

if want pytorch; then
  step "pip install ., compare_varlen, pytest -k cuda -> varlen.log, pytest.log"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps . \
    -C cmake.define.FMHA_CUDA_ARCHS="${ARCHS:-90}" -C cmake.define.FMHA_HEAD_DIMS="${HEAD_DIMS:-32;64;128}" \
    > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
  timeout 200 python3 bench/compare_varlen.py --out "$OUT/varlen" > "$OUT/varlen.log" 2>&1 || status=1
  tail -12 "$OUT/varlen.log"
  timeout 200 python3 -m pytest tests/python -q -rs -p no:cacheprovider -k cuda > "$OUT/pytest.log" 2>&1 || status=1
  tail -3 "$OUT/pytest.log"
fi

if want decodecmp; then
  step "pip install ., compare_decode -> decode.log"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-build-isolation --no-deps . \
    -C cmake.define.FMHA_CUDA_ARCHS="${ARCHS:-90}" -C cmake.define.FMHA_HEAD_DIMS=128 \
    -C cmake.define.FMHA_DECODE_HEAD_DIMS=128 > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
  timeout "${DECODE_TIMEOUT:-240}" python3 bench/compare_decode.py --out "$OUT/decode" ${DECODE_ARGS:-} \
    > "$OUT/decode.log" 2>&1 || status=1
  cat "$OUT/decode.log"
fi

if want profile; then
  step "ncu"
  OUT=$OUT BUILD=$B CASES="${PROFILE_CASES:-fwd128s}" scripts/gpu_profile.sh || status=1
fi

if want bench; then
  step "bench -> bench.txt"
  F="$B/fmha bench --no-progress"
  for g in ${BENCHES:-fa-fwd}; do
    echo "---- $g" >> "$OUT/bench.txt"
    case $g in
      fa-fwd) timeout 120 $F --sweep fa --backend sm90 --mode fwd --dtype bf16 --iters 10 ;;
      fa-bwd) timeout 150 $F --sweep fa --backend sm90 --mode bwd --dtype bf16 --iters 10 ;;
      seed) timeout 120 $F --sweep seed --iters 10 ;;
      varlen) timeout 120 $F --sweep varlen --backend sm90 --iters 10 ;;
      merge) timeout 60 $F --sweep merge ;;
      decode) timeout 90 $F --sweep decode --page-size 64 ;;
    esac >> "$OUT/bench.txt" 2>&1 || status=1
  done
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    echo "---- $line" >> "$OUT/bench.txt"
    timeout 60 $F $line >> "$OUT/bench.txt" 2>&1 || status=1
  done <<< "${BENCH_EXTRA:-}"
fi
exit $status
