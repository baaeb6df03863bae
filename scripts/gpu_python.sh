#!/usr/bin/env bash
# The Python package on a CUDA machine, from the repository root: builds and installs it with the
# CUDA backends (no network needed where scikit-build-core, nanobind, CMake and ninja are
# installed), runs its tests (PyTorch, CuPy, JAX on the GPU), the seed example, and the side-by-side
# comparison with PyTorch's SDPA backends.
# Environment: OUT (default ./out), ARCHS (default 90), COMPARE (compare_torch.py sweep: seed, fa,
# all or none; default seed), COMPARE_ARGS (extra arguments for it).
set -u -o pipefail
OUT=${OUT:-$PWD/out}
ARCHS=${ARCHS:-90}
COMPARE=${COMPARE:-seed}
mkdir -p "$OUT"
status=0
step() { echo "== $* ($(date +%T))"; }
export PYTHONUNBUFFERED=1

step "pip install . (CUDA archs $ARCHS) -> $OUT/python_build.log"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -v --no-build-isolation --no-deps . \
  -C cmake.define.FMHA_CUDA_ARCHS="$ARCHS" > "$OUT/python_build.log" 2>&1 || { tail -30 "$OUT/python_build.log"; exit 1; }
python3 -c 'import fmha; print(fmha.info())'

step "pytest tests/python (one process per file) -> $OUT/python_tests.log"
: > "$OUT/python_tests.log"
for file in tests/python/test_*.py; do
  timeout 200 python3 -X faulthandler -m pytest "$file" -v -rs -p no:cacheprovider >> "$OUT/python_tests.log" 2>&1 ||
    { status=1; echo "   $file: FAILED (exit $?)"; }
done
grep -E "FAILED|ERROR|Fatal|passed|failed" "$OUT/python_tests.log" | tail -30

step "bench/python_overhead.py"
timeout 60 python3 bench/python_overhead.py --iterations 20000 2>&1 | tee "$OUT/python_overhead.txt" || status=1

step "examples/seed_benchmark.py"
timeout 120 python3 examples/seed_benchmark.py --device cuda 2>&1 | tee "$OUT/seed_benchmark.txt" || status=1

if [ "$COMPARE" != "none" ]; then
  step "bench/compare_torch.py --sweep $COMPARE -> $OUT/compare"
  timeout 400 python3 bench/compare_torch.py --sweep "$COMPARE" --out "$OUT/compare" ${COMPARE_ARGS:-} 2>&1 |
    tee "$OUT/compare.log" | tail -60 || status=1
fi
step "done (status $status)"
exit $status
