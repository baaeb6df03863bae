#!/usr/bin/env bash
# Nsight Compute profiles of fmha's kernels beside cuDNN's (PyTorch SDPA's cuDNN backend) on the
# same shapes, on an H100/H200, from the repository root: builds the CLI (arch 90, head dims 64,
# 128 and 256) into $BUILD (default /tmp/fmha-peers), then for each case profiles fmha's kernels
# (`fmha bench`, the main kernels after the warm-up calls) and every kernel of one cuDNN call (the
# call after the warm-up ones, between cudaProfilerStart/Stop), with the full section set:
#   $OUT/peers_summary.txt   duration, DRAM/L2/SM throughput, pipes, occupancy per kernel
#   $OUT/peers.tar.gz        the details page of each case and provider (peers_<case>_<provider>.txt)
#                            and the profiled runs' output (peers_<case>_<provider>_run.log)
# CASES (default "fwd256 decode fwd64c bwd64") picks the cases below, in that order; fwd64s,
# fwd64sc and fwd128s are the 512-key forwards (16k tokens, hidden 2048) where fmha trails cuDNN;
# decode1 is decoding one sequence of 8k keys (decode: 16 of them).
# SOURCE=1 adds each report's source page (per SASS instruction: executions, stall samples by
# reason; `ncu --page source --csv --print-source sass`) as peers_<case>_<provider>_source.csv.
# `python3 scripts/ncu_source_top.py <page>.csv` summarises one: samples by reason, opcode, instruction.
set -u -o pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
B=${BUILD:-/tmp/fmha-peers}
if [[ ! -x "$B/fmha" ]]; then
  t0=$(date +%s)
  # PEERS_HEAD_DIMS (default 64;128;256) narrows the build to the cases' head dims (CMake keeps
  # the tuned and decode head dims that are among them).
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 \
    -DFMHA_HEAD_DIMS="${PEERS_HEAD_DIMS:-64;128;256}" -DFMHA_TUNED_HEAD_DIMS="64;128" -DFMHA_DECODE_HEAD_DIMS=128 \
    > "$OUT/peers_build.log" 2>&1 &&
    timeout 300 ninja -C "$B" fmha_cli >> "$OUT/peers_build.log" 2>&1 || { tail -20 "$OUT/peers_build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
# case -> fmha bench arguments | ncu kernel filter and launches to skip / profile | torch shape
declare -A FMHA=(
  [fwd256]="--mode fwd --head-dim 256 --heads 8 --batch 8 --seqlen-q 2048"
  [fwd64c]="--mode fwd --head-dim 64 --heads 32 --batch 8 --seqlen-q 2048 --causal bottom-right"
  [decode]="--mode fwd --head-dim 128 --heads 32 --kv-heads 8 --batch 16 --seqlen-q 1 --seqlen-k 8192"
  [decode1]="--mode fwd --head-dim 128 --heads 32 --kv-heads 8 --batch 1 --seqlen-q 1 --seqlen-k 8192"
  [bwd64]="--mode bwd --head-dim 64 --heads 32 --batch 4 --seqlen-q 4096"
  [fwd64s]="--mode fwd --head-dim 64 --heads 32 --batch 32 --seqlen-q 512"
  [fwd64sc]="--mode fwd --head-dim 64 --heads 32 --batch 32 --seqlen-q 512 --causal bottom-right"
  [fwd128s]="--mode fwd --head-dim 128 --heads 16 --batch 32 --seqlen-q 512"
)
declare -A FILTER=([fwd256]="regex:^fwd_kernel" [fwd64c]="regex:^fwd_kernel"
                   [decode]="regex:^(decode_kernel|merge_splits_kernel)"
                   [decode1]="regex:^(decode_kernel|merge_splits_kernel)" [bwd64]="regex:^bwd_"
                   [fwd64s]="regex:^fwd_kernel" [fwd64sc]="regex:^fwd_kernel" [fwd128s]="regex:^fwd_kernel")
declare -A SKIP=([fwd256]="2 1" [fwd64c]="2 1" [decode]="2 2" [decode1]="2 2" [bwd64]="6 3" [fwd64s]="2 1" [fwd64sc]="2 1" [fwd128s]="2 1")
# torch: batch heads kv_heads seqlen_q seqlen_k head_dim causal direction
declare -A TORCH=([fwd256]="8 8 8 2048 2048 256 0 fwd" [fwd64c]="8 32 32 2048 2048 64 1 fwd"
                  [decode]="16 32 8 1 8192 128 0 fwd" [decode1]="1 32 8 1 8192 128 0 fwd" [bwd64]="4 32 32 4096 4096 64 0 bwd"
                  [fwd64s]="32 32 32 512 512 64 0 fwd" [fwd64sc]="32 32 32 512 512 64 1 fwd"
                  [fwd128s]="32 16 16 512 512 128 0 fwd")
cat > /tmp/peers_torch.py <<'EOF'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
b, h, hkv, sq, sk, d, causal, direction = sys.argv[1:]
b, h, hkv, sq, sk, d, causal = map(int, (b, h, hkv, sq, sk, d, causal))
g = torch.Generator(device="cuda").manual_seed(1)
def rnd(shape): return torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
if sq == 1:  # decoding: [B, H, 1, D] queries, contiguous [B, Hkv, S, D] caches (bench/compare_decode.py)
    q, k, v = rnd((b, h, 1, d)), rnd((b, hkv, sk, d)), rnd((b, hkv, sk, d))
else:        # [B, S, H, D] tensors seen as [B, H, S, D] (bench/compare_torch.py)
    q, k, v = (rnd((b, s, n, d)).transpose(1, 2) for s, n in ((sq, h), (sk, hkv), (sk, hkv)))
leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
dout = rnd((b, sq, h, d)).transpose(1, 2)
def call():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if direction == "fwd":
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=h != hkv)
        out = F.scaled_dot_product_attention(*leaves, is_causal=bool(causal))
        return torch.autograd.grad(out, leaves, dout)
for _ in range(3): call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart(); call(); torch.cuda.synchronize(); torch.cuda.cudart().cudaProfilerStop()
EOF
summary() {  # details page -> one line per kernel
  awk -v label="$1" '
    function flush() { if (name != "") printf "%s %s | %s | dram %s%% l2 %s%% sm %s%% tensor %s | issue %s%% occ %s%% regs %s | mem %s | l2hit %s%%\n",
                         label, name, dur, dram, l2, sm, tensor, issue, occ, regs, bw, hit; name = "" }
    /^  [^ ]/ { flush(); name = $0; sub(/^  (void )?/, "", name); gsub(/<unnamed>::/, "", name); sub(/[(<].*/, "", name); tensor = "-" }
    /^    Duration / { dur = $NF " " $(NF-1) }
    /^    DRAM Throughput/ { dram = $NF } /^    L2 Cache Throughput/ { l2 = $NF }
    /^    Compute \(SM\) Throughput/ { sm = $NF } /^    Achieved Occupancy/ { occ = $NF }
    /^    Issue Slots Busy/ { issue = $NF } /^    Registers Per Thread/ { regs = $NF }
    /^    Memory Throughput/ && $(NF-1) ~ /byte/ { bw = $NF " " $(NF-1) } /^    L2 Hit Rate/ { hit = $NF }
    /Tensor is the highest-utilized pipeline/ { tensor = $0; sub(/.*pipeline \(/, "", tensor); sub(/\).*/, "", tensor) }
    END { flush() }
  ' "$2"
}
source_page() {  # report -> its source page as CSV, per SASS instruction
  ncu -i "$1" --page source --csv --print-source sass > "$2" 2>&1 || echo "no source page for $1"
}
for c in ${CASES:-fwd256 decode fwd64c bwd64}; do
  read -r skip count <<< "${SKIP[$c]}"
  echo "== $c fmha ($(date +%T))"
  timeout 150 ncu --set full -k "${FILTER[$c]}" -s "$skip" -c "$count" -f -o "/tmp/peers_${c}_fmha" \
    "$B/fmha" bench --dtype bf16 ${FMHA[$c]} --warmup 2 --iters 1 --no-progress > "$OUT/peers_${c}_fmha_run.log" 2>&1 ||
    tail -5 "$OUT/peers_${c}_fmha_run.log"
  ncu -i "/tmp/peers_${c}_fmha.ncu-rep" --page details > "$OUT/peers_${c}_fmha.txt" 2>&1
  [[ ${SOURCE:-0} == 1 ]] && source_page "/tmp/peers_${c}_fmha.ncu-rep" "$OUT/peers_${c}_fmha_source.csv"
  summary "$c/fmha" "$OUT/peers_${c}_fmha.txt" | tee -a "$OUT/peers_summary.txt"
  echo "== $c cudnn ($(date +%T))"
  timeout 150 ncu --set full --profile-from-start off -f -o "/tmp/peers_${c}_cudnn" \
    python3 /tmp/peers_torch.py ${TORCH[$c]} > "$OUT/peers_${c}_cudnn_run.log" 2>&1 || tail -5 "$OUT/peers_${c}_cudnn_run.log"
  ncu -i "/tmp/peers_${c}_cudnn.ncu-rep" --page details > "$OUT/peers_${c}_cudnn.txt" 2>&1
  [[ ${SOURCE:-0} == 1 ]] && source_page "/tmp/peers_${c}_cudnn.ncu-rep" "$OUT/peers_${c}_cudnn_source.csv"
  summary "$c/cudnn" "$OUT/peers_${c}_cudnn.txt" | tee -a "$OUT/peers_summary.txt"
done
tar czf "$OUT/peers.tar.gz" -C "$OUT" $(cd "$OUT" && ls peers_*_fmha* peers_*_cudnn* 2>/dev/null) &&
  rm -f "$OUT"/peers_*_fmha* "$OUT"/peers_*_cudnn*
