#!/usr/bin/env bash
# Checks the machine code of the sm90 kernels: every kernel must issue HGMMA (Hopper's warpgroup
# tensor-core instruction) and touch no local memory (LDL/STL: register spills or arrays the
# compiler could not keep in registers), and no kernel may have its HGMMAs serialised: where
# ptxas cannot prove a wgmma's registers safe it brackets every HGMMA with a WARPGROUP.ARRIVE and
# a wait, so a kernel with more than one ARRIVE per two HGMMAs is flagged (chains of k-steps
# share one ARRIVE: about one per eight HGMMAs). Usage: scripts/check_sass.sh DIR_WITH_OBJECTS
# Prints one line per kernel (its generated file, then the kernel: storage type, head dim,
# variant, packed) and exits non-zero when any fails. Needs cuobjdump (c++filt, where present,
# names the kernels).
set -u -o pipefail
dir=${1:?usage: check_sass.sh DIR}
demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }
fail=0
count=0
failed=0
while IFS= read -r obj; do
  sass=$(cuobjdump --dump-sass "$obj" 2>/dev/null) || { echo "FAIL $obj: cuobjdump failed"; fail=1; continue; }
  file=$(basename "$obj" .cu.o)
  # Per kernel (a generated file holds the tier's kernels for dense and packed calls, and the
  # backward's also the preprocess and dQ-convert kernels every tier shares, which have no matrix
  # work and are checked for local memory alone): name, HGMMAs, local-memory instructions,
  # ARRIVEs (more than half the HGMMAs: serialised).
  while read -r name hgmma local_ops arrives; do
    [ -n "$name" ] || continue
    count=$((count + 1))
    short=$(echo "$name" | demangle | sed -E 's/fmha::cuda::(sm90::)?//g; s/^void //; s/\(.*\)$//;
                                               s/__nv_bfloat16/bf16/; s/__half/fp16/; s/tile::tf32x3/tf32x3/')
    tensor=1
    [[ "$name" == *4sm90* ]] || tensor=0  # the tier's own kernels (namespace fmha::cuda::sm90)
    serialised=$(( hgmma > 0 && 2 * arrives > hgmma ? 1 : 0 ))
    if { [ "$tensor" -eq 0 ] || [ "$hgmma" -gt 0 ]; } && [ "$local_ops" -eq 0 ] && [ "$serialised" -eq 0 ]; then
      echo "ok   $file $short: $hgmma HGMMA, no local memory$([ "$hgmma" -gt 0 ] && echo ', not serialised')"
    else
      echo "FAIL $file $short: $hgmma HGMMA, $local_ops local-memory instructions$([ "$serialised" -eq 1 ] && echo ', HGMMAs serialised')"
      fail=1
      failed=$((failed + 1))
    fi
  done < <(awk '/Function :/ { f = $3; names[f] = 1 }
                /HGMMA/ { h[f]++ } /WARPGROUP\.ARRIVE/ { a[f]++ } /(^|[^A-Z])(LDL|STL)(\.| )/ { l[f]++ }
                END { for (f in names) print f, h[f] + 0, l[f] + 0, a[f] + 0 }' <<<"$sass" | sort)
done < <(find "$dir" -name 'sm90_*.cu.o' | sort)
[ "$count" -gt 0 ] || { echo "FAIL: no sm90 kernels under $dir"; exit 1; }
echo "$count kernels in the sm90 objects checked: $([ $fail -eq 0 ] && echo all pass || echo "$failed fail")"
exit $fail
