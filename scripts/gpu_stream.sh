#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root, for the sm90
# forward's streamed key tiles (variant `stream`) and the decode split counts open to the tuner:
#   build (scripts/gpu_round.sh: arch 90, head dims 64 and 128, decode head dims 64 and 128)
#   tests: every forward variant against the oracle (`stream` and `spec`), the sm90 forward sweep,
#   schedule, few-key, fuzz, edge, large-offset and varlen tests under FMHA_SM90_FWD_CONFIG=stream
#   (the fuzz cases also run the backward, which reads the forward's LSE), the decode tuner's and decode
#   GPU tests; memcheck and racecheck on `fmha run --check` under `stream`          -> tests.log
#   `fmha tune --sweep decode --dry-run`                                           -> tune_decode.txt
#   `fmha bench` spec against stream (ROUNDS interleaved rounds, 16k tokens a call, hidden 2048)
#                                                                                  -> stream_ab.txt
# PARTS (default "tune"): "tune" runs the decode tuner's tests and sweep, "profile" Nsight Compute
# profiles of both variants at head dim 64, 512 keys                 -> prof_<variant>/stalls.txt
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=build HEAD_DIMS="64;128" DECODE_HEAD_DIMS="64;128" BUILD_TIMEOUT=280 bash scripts/gpu_round.sh || exit 1
B=build-sm90
T=$B/tests/gpu/fmha_gpu_tests
echo "== tests $(date +%T)"
{
  FMHA_TEST_FWD_VARIANTS=stream,spec timeout 150 $T --gtest_color=no --gtest_brief=1 --gtest_filter='Sm90Variants.*'
  FMHA_SM90_FWD_CONFIG=stream timeout 200 $T --gtest_color=no --gtest_brief=1 \
    --gtest_filter='*Kernel.Forward/*sm90*:Sm90Schedule.*:*FewKeys*sm90*:Fuzz/GpuFuzz.*sm90*:Fuzz/GpuPeakedSoftmax.*:Edge.*:LargeOffsets.Sm90*:*VarlenKernel.Forward/sm90*-*tf32*:Edge.*'
  echo "---- tf32 few keys, default configuration, seed 157711677127"
  FMHA_TEST_SEED=157711677127 timeout 60 $T --gtest_color=no --gtest_brief=1 --gtest_filter='*FewKeys*sm90_tf32'
  [[ " ${PARTS:-tune} " == *" tune "* ]] &&
    timeout 150 $T --gtest_color=no --gtest_brief=1 --gtest_filter='GpuTuneDecode.*:DecodeGpu.*:MergeCuda.*'
  for tool in memcheck racecheck; do
    for causal in none bottom-right; do
      echo "---- $tool $causal"
      FMHA_SM90_FWD_CONFIG=stream timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $B/fmha run \
        --backend sm90 --dtype bf16 --head-dim 64 --heads 4 --kv-heads 2 --batch 2 --seqlen-q 700 --seqlen-k 900 \
        --causal $causal --check 2>&1 | tail -3
      echo "$tool $causal rc=${PIPESTATUS[0]}"
    done
  done
} > "$OUT/tests.log" 2>&1
grep -E "tests? from .* ran|PASSED|FAILED|Failure|ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$OUT/tests.log" | head -40
if [[ " ${PARTS:-tune} " == *" tune "* ]]; then
echo "== tune decode $(date +%T)"
timeout 150 $B/fmha tune --sweep decode --dry-run --no-progress > "$OUT/tune_decode.txt" 2>&1; echo "tune rc=$?"
tail -12 "$OUT/tune_decode.txt"
fi
if [[ " ${PARTS:-} " == *" profile "* ]]; then
  echo "== profile $(date +%T)"
  for v in spec stream; do
    mkdir -p "$OUT/prof_$v"
    FMHA_SM90_FWD_CONFIG=$v OUT="$OUT/prof_$v" BUILD=$B CASES="fwd64s" bash scripts/gpu_profile.sh
    ncu -i /tmp/ncu_fwd64s.ncu-rep --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
for name, value in zip(rows[0], rows[-1]):
    if 'pcsamp_warps_issue_stalled' in name and not name.endswith('not_issued') or name == 'gpu__time_duration.sum':
        print(name, value)" > "$OUT/prof_$v/stalls.txt"
    echo "-- $v"; sort -t' ' -k2 -g -r "$OUT/prof_$v/stalls.txt" | head -14
  done
fi
echo "== bench $(date +%T)"
bench() {  # variant, head dim, round
  local h=$((2048 / $2))
  for c in none bottom-right; do for s in ${LENGTHS:-512 1024 2048 16384}; do
    FMHA_SM90_FWD_CONFIG=$1 timeout 20 $B/fmha bench --backend sm90 --mode fwd --dtype bf16 --head-dim "$2" --heads $h \
      --batch $((16384 / s)) --seqlen-q $s --causal $c --iters 30 --no-progress 2>&1 | tail -1 |
      awk -v v="$1" -v r="$3" -v d="$2" -v s=$s -v c=$c '{print v, r, d, s, c, $0}'
  done; done
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for d in 64 128; do for v in spec stream; do bench $v $d $r; done; done
done | tee "$OUT/stream_ab.txt"
