#!/bin/bash
# `make demo` and `make demo-torch` N times in a row (default 10), each in a fresh state
# directory, printing each run's exit status, seconds and the load average after it; exits 1
# if any run failed. Usage: bash scripts/demo_runs.sh [N] [OUT_DIR]
set -u
n=${1:-10}
out=${2:-var/demo-runs}
mtc=${MTC:-.venv/bin/mtc}
mkdir -p "$out"
failed=0
for kind in demo torch; do
  for i in $(seq 1 "$n"); do
    start=$(date +%s)
    if [ "$kind" = demo ]; then args=(demo); else args=(demo --torch); fi
    MTC_STATE_DIR="$out/$kind-$i" "$mtc" "${args[@]}" > "$out/$kind-$i.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || failed=1
    echo "$kind $i rc=$rc $(( $(date +%s) - start ))s load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
exit "$failed"
