#!/usr/bin/env bash
# Nsight Compute profiles of the sm90 kernels on an H100/H200, from the repository root, with a
# build in $BUILD (default ./build-sm90, built with -lineinfo by scripts/gpu_sm90.sh): for each
# case, one launch of the main kernel after the warm-up ones, the full section set, then
#   $OUT/ncu_<case>.txt   the details page (speed of light, occupancy, warp states, pipes)
#   $OUT/ncu_<case>_sass.csv  per-SASS-line samples (stall reasons) — where the warps wait
#                             (summarised by `python3 scripts/ncu_source_top.py <file>`)
# CASES (default "fwd128 fwd64 bwd128") picks the cases below.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-$PWD/build-sm90}
mkdir -p "$OUT"
status=0
launch="--iters 1 --warmup 3 --no-progress"
shape="--dtype bf16 $launch"
seed="--backend sm90 --head-dim 64 --heads 4 --batch 4 --seqlen-q 4096 $launch"  # the seed shape
declare -A ARGS=(
  [fwd128]="--backend sm90 --mode fwd --head-dim 128 --heads 16 --batch 4 --seqlen-q 4096 $shape"
  [fwd128s]="--backend sm90 --mode fwd --head-dim 128 --heads 16 --batch 32 --seqlen-q 512 $shape"
  [fwd128c]="--backend sm90 --mode fwd --head-dim 128 --heads 16 --batch 4 --seqlen-q 4096 --causal top-left $shape"
  [fwd64]="--backend sm90 --mode fwd --head-dim 64 --heads 32 --batch 4 --seqlen-q 4096 $shape"
  [bwd128]="--backend sm90 --mode bwd --head-dim 128 --heads 16 --batch 4 --seqlen-q 4096 $shape"
  [bwd128s]="--backend sm90 --mode bwd --head-dim 128 --heads 16 --batch 8 --seqlen-q 2048 $shape"
  [fwd64s]="--backend sm90 --mode fwd --head-dim 64 --heads 32 --batch 32 --seqlen-q 512 $shape"
  [fwd64sc]="--backend sm90 --mode fwd --head-dim 64 --heads 32 --batch 32 --seqlen-q 512 --causal bottom-right $shape"
  [bwd64]="--backend sm90 --mode bwd --head-dim 64 --heads 32 --batch 8 --seqlen-q 2048 $shape"
  [bwd256]="--backend sm90 --mode bwd --head-dim 256 --heads 8 --batch 4 --seqlen-q 4096 $shape"
  [fwd64t]="--mode fwd --dtype tf32 $seed"
  [fwd64x3]="--mode fwd --dtype tf32x3 $seed"
  [bwd64t]="--mode bwd --dtype tf32 $seed"
  [decode]="--mode fwd --head-dim 128 --heads 32 --kv-heads 8 --batch 16 --seqlen-q 1 --seqlen-k 8192 $shape"
)
declare -A KERNEL=([fwd128]=fwd_kernel [fwd128s]=fwd_kernel [fwd128c]=fwd_kernel [fwd64]=fwd_kernel [bwd128]=bwd_kernel
                  [bwd128s]=bwd_kernel [fwd64s]=fwd_kernel [fwd64sc]=fwd_kernel [bwd64]=bwd_kernel [bwd256]=bwd_kernel
                  [fwd64t]=fwd_kernel [fwd64x3]=fwd_kernel [bwd64t]=bwd_kernel [decode]=decode_kernel)
for c in ${CASES:-fwd128 fwd64 bwd128}; do
  echo "== ncu $c ($(date +%T))"
  timeout 240 ncu --set full --import-source yes -k "regex:^${KERNEL[$c]}" -s 3 -c 1 -f -o "/tmp/ncu_$c" \
    "$BUILD/fmha" bench ${ARGS[$c]} > "$OUT/ncu_${c}_run.log" 2>&1 || { status=1; tail -5 "$OUT/ncu_${c}_run.log"; continue; }
  ncu -i "/tmp/ncu_$c.ncu-rep" --page details > "$OUT/ncu_$c.txt" 2>&1 || status=1
  ncu -i "/tmp/ncu_$c.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${c}_sass.csv" 2>&1 || status=1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|L2 Hit|Issue Slots Busy|No Eligible" \
    "$OUT/ncu_$c.txt" | head -12
done
exit $status
