#!/usr/bin/env bash
# Where the split-tf32 backward's time goes, in one GPU call on an H100/H200 (results under $OUT),
# from the repository root: the seed shape's fp32 backward (B4 H4 S4096 D64, precision tf32x3) on
# the sm90 tier and, beside it, on sm80, each kernel of one call under Nsight Compute (duration,
# throughput, occupancy, stall reasons) -> split_<tier>.txt; with SOURCE=1 also the sm90 main
# kernel's per-instruction stall samples -> split_sm90_source.csv.
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${BUILD:-$PWD/build-split-profile}
if [[ ! -x "$B/fmha" ]]; then  # a build of head dim 64 that $BUILD already holds is reused
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS=64 \
    -DFMHA_TUNED_HEAD_DIMS=64 -DFMHA_DECODE_HEAD_DIMS=64 > "$OUT/profile_build.log" 2>&1 &&
    timeout 300 ninja -C "$B" fmha_cli >> "$OUT/profile_build.log" 2>&1 || { tail -20 "$OUT/profile_build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
SHAPE="--mode bwd --dtype fp32 --precision tf32x3 --batch 4 --heads 4 --seqlen-q 4096 --head-dim 64"
for tier in sm90 sm80; do
  # One untimed and one timed call: the second call's kernels are profiled (preprocess,
  # statistics, main, convert; sm80's dQ kernel where it has one).
  timeout 200 ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    -k "regex:^bwd_" -s 4 -c 5 -f -o "/tmp/split_$tier" \
    "$B/fmha" bench --backend "$tier" $SHAPE --iters 1 --warmup 1 --no-progress > "$OUT/split_${tier}_run.log" 2>&1
  ncu -i "/tmp/split_$tier.ncu-rep" --page details > "$OUT/split_$tier.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput" \
    "$OUT/split_$tier.txt" | head -60
done
if [[ ${SOURCE:-0} == 1 ]]; then
  timeout 200 ncu --set full --import-source no -k "regex:^bwd_kernel" -s 1 -c 1 -f -o /tmp/split_sm90_main \
    "$B/fmha" bench --backend sm90 $SHAPE --iters 1 --warmup 1 --no-progress > /dev/null 2>&1
  ncu -i /tmp/split_sm90_main.ncu-rep --page source --csv --print-source sass > "$OUT/split_sm90_source.csv" 2>&1
  echo "source page: $(wc -l < "$OUT/split_sm90_source.csv") lines"
fi
