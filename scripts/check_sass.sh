#!/usr/bin/env bash
# Checks the machine code of the sm90 kernels: every kernel must issue HGMMA (Hopper's warpgroup
# tensor-core instruction) and touch no local memory (LDL/STL: register spills or arrays the
# compiler could not keep in registers). Usage: scripts/check_sass.sh DIR_WITH_OBJECTS
# Prints one line per kernel and exits non-zero when any kernel fails. Needs cuobjdump.
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
  count=$((count + 1))
  if [ "$hgmma" -gt 0 ] && [ "$local_ops" -eq 0 ]; then
    echo "ok   $name: $hgmma HGMMA, no local memory"
  else
    echo "FAIL $name: $hgmma HGMMA, $local_ops local-memory instructions"
    fail=1
  fi
done < <(find "$dir" -name 'sm90_*.cu.o' | sort)
[ "$count" -gt 0 ] || { echo "FAIL: no sm90 objects under $dir"; exit 1; }
echo "$count sm90 kernels checked: $([ $fail -eq 0 ] && echo all pass || echo FAILURES)"
exit $fail
