#!/usr/bin/env bash
# scripts/gpu_check.sh's `pack` and PREBUILT, without a GPU (CTest gpu_check_pack_roundtrip): a
# made-up build folder's three binaries (copies of this machine's `true`) packed, then put into a
# fresh build folder by PREBUILT with no step to run; each must come back stripped, executable and
# byte-equal to its stripped original. A pack of a folder without the binaries must fail.
# Skips (exit 77) where xz or strip is missing.
set -u
command -v xz >/dev/null && command -v strip >/dev/null || { echo "xz or strip missing: skipped"; exit 77; }
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$work/build/tests/gpu"
for f in build/fmha build/tests/gpu/fmha_gpu_tests build/tests/gpu/fmha_tile_tests; do cp "$(type -P true)" "$work/$f"; done
bash "$root/scripts/gpu_check.sh" pack "$work/build" "$work/carry" || fail "pack exited $?"
for f in fmha.xz fmha_gpu_tests.xz fmha_tile_tests; do [[ -f "$work/carry/$f" ]] || fail "pack left no $f"; done
OUT="$work/out" BUILD="$work/unpacked" PREBUILT="$work/carry" STEPS=none bash "$root/scripts/gpu_check.sh" ||
  fail "PREBUILT exited $?"
strip -o "$work/stripped" "$(type -P true)"
for f in fmha tests/gpu/fmha_gpu_tests tests/gpu/fmha_tile_tests; do
  [[ -x "$work/unpacked/$f" ]] || fail "$f not unpacked or not executable"
  cmp -s "$work/stripped" "$work/unpacked/$f" || fail "$f differs from its stripped original"
  "$work/unpacked/$f" || fail "$f does not run"
done
mkdir -p "$work/empty"
if bash "$root/scripts/gpu_check.sh" pack "$work/empty" "$work/carry2" 2>/dev/null; then fail "pack of an empty folder succeeded"; fi
echo "pack and PREBUILT round trip: ok"
