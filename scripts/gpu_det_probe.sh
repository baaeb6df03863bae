#!/usr/bin/env bash
# One GPU call on an H100/H200 (results under $OUT), from the repository root: where the sm90
# deterministic backward's extra time goes. CLIs at head dims DIMS (default 256; e.g. "128 256"):
# this tree (B), and probes, each built from a copy of the tree with parts of the dQ warps' turn
# protocol taken out (timing probes only: without the wait dQ is added in no fixed order, and
# their results are not checked):
#   nowait   the dQ warps skip the wait for their turn (tile::wait_turn)
#   nopass   no wait, and no completion wait, fence or pass after the reduction (the default
#            kernel's dQ hand-off, with the deterministic kernel's order and registers)
#   regs     the deterministic (and packed) kernels with the default kernel's register split
#            (24 / 240 for 40 / 232; the producer warpgroup may spill)
#   onewarp  one dQ warp, as the default kernel has
# PROBES (default nowait; empty: none) names them, joined by + to combine. (Run 67 also had
# `nofence`, pass_turn without the __threadfence it then had; the tree has since dropped it,
# docs/PERF.md.)
#   bench    FORMS (default: default, det, and each probe as det), each of DIMS (heads 2048 / head
#            dim), LENGTHS (4k and 16k), causal none and bottom-right, ROUNDS rounds
#            interleaved                                                    -> bench.txt
#   source   Nsight Compute's per-instruction stall samples (SASS, CSV) of SOURCE_FORMS
#            (default det; det and/or default), D256 causal 4k              -> source_<form>.csv
set -u
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
DIMS=${DIMS:-256}
export PATH=/usr/local/cuda/bin:$PATH AB_HEAD_DIMS="${DIMS// /;}"
source "$(dirname "$0")/sm90_ab.sh"
STEPS=${STEPS:-"build bench source"}; ROUNDS=${ROUNDS:-3}; PROBES=${PROBES-nowait}
want() { [[ " $STEPS " == *" $1 "* ]]; }
B=${BUILD:-$PWD/build-sm90-256}
K=src/cuda/sm90/sm90_bwd_kernel.cuh; C=src/cuda/sm90/sm90_config.h
# Probe $1's edits of the copy in $2; each edit must take effect.
probe_patch() {
  local part n
  for part in ${1//+/ }; do
    case $part in
      nowait) sed -i 's|^\( *\)tile::wait_turn(turn_counter(), turn);|\1/* probe */|' "$2/$K"; n=$(grep -c '^ */\* probe \*/$' "$2/$K") ;;
      nopass) sed -i -e 's|^\( *\)tile::wait_turn(turn_counter(), turn);|\1/* probe */|' \
                -e '/shared.dq_empty.arrive();/,/pass_turn/s#^\( *\)tile::\(tma::store_wait\|fence_async_global\|pass_turn\)(.*#\1/* probe */#' "$2/$K"
              n=$(grep -c '^ */\* probe \*/$' "$2/$K"); [[ $n == 4 ]] || n=0 ;;
      regs) sed -i -e 's|^\(inline constexpr int kBwdWideProducerRegisters = \)40;|\124; // probe|' \
              -e 's|^\(inline constexpr int kBwdWideConsumerRegisters = \)232;|\1240; // probe|' "$2/$C"
            n=$(grep -c "Registers = [0-9]*; // probe" "$2/$C"); [[ $n == 2 ]] || n=0 ;;
      onewarp) sed -i 's|^constexpr int bwd_dq_warps(bool ordered) { return ordered ? 2 : 1; }|constexpr int bwd_dq_warps(bool) { return 1; }  // probe|' "$2/$C"
               n=$(grep -c "return 1; }  // probe" "$2/$C") ;;
      *) echo "unknown probe $part"; return 1 ;;
    esac
    [[ $n -ge 1 ]] || { echo "probe $part: the edit did not apply"; return 1; }
  done
}
if want build; then
  t0=$(date +%s); jobs=$(( $(nproc) / ($(wc -w <<< "$PROBES") + 1) )); pids=()
  sm90_configure . "$B" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  timeout 400 ninja -C "$B" -j$jobs fmha_cli > "$OUT/build_tree.log" 2>&1 & pids+=($!)
  for pr in $PROBES; do
    src=/tmp/fmha-probe-$pr; rm -rf "$src" && mkdir -p "$src"
    tar -c --exclude='./build*' --exclude=./.git . | tar -x -C "$src"
    probe_patch "$pr" "$src" || exit 1
    { sm90_configure "$src" "$PWD/build-probe-$pr" > "$OUT/build_$pr.log" 2>&1 &&
      timeout 400 ninja -C "$PWD/build-probe-$pr" -j$jobs fmha_cli >> "$OUT/build_$pr.log" 2>&1; } & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { grep -hE "error|FAILED" "$OUT"/build*.log | head -20; exit 1; }; done
  echo "built the tree and probes $PROBES in $(( $(date +%s) - t0 )) s"
fi
if want bench; then
  # FORMS: default, det, or a probe's name (run --deterministic), each optionally :keys
  # (FMHA_SM90_BWD_ORDER=keys, one pair per section) or :<MB> (FMHA_SM90_L2_SECTION_MB=<MB>).
  for r in $(seq "$ROUNDS"); do for d in $DIMS; do for s in ${LENGTHS:-4096 16384}; do for c in none bottom-right; do
    for form in ${FORMS:-default det $PROBES}; do
      kind=${form%%:*}; opt=${form#"$kind"}; opt=${opt#:}; cli=$B/fmha; flags=""; env=()
      [[ $kind != default ]] && flags="--deterministic"
      [[ $kind != default && $kind != det ]] && cli=$PWD/build-probe-$kind/fmha
      [[ $opt == keys ]] && env=(FMHA_SM90_BWD_ORDER=keys); [[ $opt =~ ^[0-9]+$ ]] && env=(FMHA_SM90_L2_SECTION_MB=$opt)
      env "${env[@]}" timeout 60 "$cli" bench --backend sm90 --mode bwd --dtype bf16 --head-dim $d --heads $((2048 / d)) \
        --batch $((16384 / s)) --seqlen-q $s --causal $c $flags --iters 10 --no-progress 2>&1 | tail -1 |
        awk -v f=$form -v r=$r '{print f, r, $0}'
    done
  done; done; done; done | tee "$OUT/bench.txt"
fi
if want source; then
  # SOURCE_FORMS: default and/or det.
  for form in ${SOURCE_FORMS:-det}; do
    flags=""; [[ $form == det ]] && flags="--deterministic"
    timeout 200 ncu --section WarpStateStats --section SourceCounters --page source --csv --print-source sass \
      -k regex:bwd_kernel -s 2 -c 1 "$B/fmha" bench --backend sm90 --mode bwd --dtype bf16 --head-dim 256 --heads 8 \
      --batch 4 --seqlen-q 4096 --causal bottom-right $flags --warmup 2 --iters 1 --no-progress \
      > "$OUT/source_$form.csv" 2> "$OUT/source_$form.err"
    echo "source $form rc=$? $(wc -l < "$OUT/source_$form.csv") lines"; tail -3 "$OUT/source_$form.err"
  done
fi
