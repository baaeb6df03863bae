#!/usr/bin/env bash
# Checks the machine code of the sm90 kernels: every kernel must issue HGMMA (Hopper's warpgroup
# tensor-core instruction) and touch no local memory (LDL/STL: register spills or arrays the
# compiler could not keep in registers), and no kernel may have its HGMMAs serialised: where
# ptxas cannot prove a wgmma's registers safe it brackets every HGMMA with a WARPGROUP.ARRIVE and
# a wait, so a kernel with more than one ARRIVE per two HGMMAs is flagged (chains of k-steps
# share one ARRIVE: about one per eight HGMMAs). Usage: scripts/check_sass.sh DIR_WITH_OBJECTS
# Prints one line per object and exits non-zero when any fails. Needs cuobjdump.
set -u -o pipefail
dir=${1:?usage: check_sass.sh DIR}
fail=0
count=0
while IFS= read -r obj; do
  sass=$(cuobjdump --dump-sass "$obj" 2>/dev/null) || { echo "FAIL $obj: cuobjdump failed"; fail=1; continue; }
  # One kernel per generated file.
  name=$(basename "$obj" .cu.o)
  hgmma=$(grep -c "HGMMA" <<<"$sass")
  local_ops=$(grep -cE "\b(LDL|STL)(\.| )" <<<"$sass")
  # Kernels whose ARRIVEs outnumber half their HGMMAs (per function).
  serialised=$(awk '/Function :/ { if (h > 0 && 2 * a > h) n++; h = 0; a = 0 }
                    /HGMMA/ { h++ } /WARPGROUP.ARRIVE/ { a++ }
                    END { if (h > 0 && 2 * a > h) n++; print n + 0 }' <<<"$sass")
  count=$((count + 1))
  if [ "$hgmma" -gt 0 ] && [ "$local_ops" -eq 0 ] && [ "$serialised" -eq 0 ]; then
    echo "ok   $name: $hgmma HGMMA, no local memory, none serialised"
  else
    echo "FAIL $name: $hgmma HGMMA, $local_ops local-memory instructions, $serialised kernels with serialised HGMMAs"
    fail=1
  fi
done < <(find "$dir" -name 'sm90_*.cu.o' | sort)
[ "$count" -gt 0 ] || { echo "FAIL: no sm90 objects under $dir"; exit 1; }
echo "$count sm90 kernels checked: $([ $fail -eq 0 ] && echo all pass || echo FAILURES)"
exit $fail
