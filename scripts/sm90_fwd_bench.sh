# Sourced by the sm90 forward's GPU scripts (gpu_fwd_variants.sh, gpu_fwd_ab.sh): their build
# configuration and their benchmark step.

# cmake configure of source dir $1 into build dir $2: arch 90, head dims 64 and 128.
sm90_fwd_configure() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_CUDA_ARCHS=90 -DFMHA_HEAD_DIMS="64;128" \
    -DFMHA_TUNED_HEAD_DIMS="64;128" -DFMHA_DECODE_HEAD_DIMS=128
}

# `fmha bench --backend sm90 --mode fwd --dtype bf16` at 16k tokens a call, hidden 2048, causal
# none and bottom-right, for: label $1, CLI $2, variant $3 (empty: the call's default), head dim
# $4, round $5, lengths $6, iterations $7. One line per case: label round head_dim length causal,
# then the bench line.
sm90_fwd_bench() {
  local h=$((2048 / $4)) c s
  for c in none bottom-right; do for s in $6; do
    env ${3:+FMHA_SM90_FWD_CONFIG=$3} timeout 30 "$2" bench --backend sm90 --mode fwd --dtype bf16 --head-dim "$4" \
      --heads $h --batch $((16384 / s)) --seqlen-q $s --causal $c --iters "$7" --no-progress 2>&1 | tail -1 |
      awk -v l="$1" -v r="$5" -v d="$4" -v s=$s -v c=$c '{print l, r, d, s, c, $0}'
  done; done
}
