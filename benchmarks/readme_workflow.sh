#!/bin/bash
# Runs the README's workflow commands as written (the code blocks under "## The workflow in four
# commands"), in order, from the repository root with .venv/bin on PATH, and times each. It refuses
# a results/ folder that holds anything: the commands are documented on an empty one.
#   bash benchmarks/readme_workflow.sh
set -u
cd "$(dirname "$0")/.." || exit 2
export PATH=$PWD/.venv/bin:$PATH
if [ -n "$(ls -A results | grep -v '^.gitkeep$')" ]; then
    echo "results/ is not empty: move its contents aside first" >&2; exit 2
fi
mapfile -t commands < <(awk '/^## The workflow in four commands/{on=1; next} /^## /{on=0}
    on && /^```/{block=!block; next} on && block && NF' README.md)
[ "${#commands[@]}" -ge 4 ] || { echo "found ${#commands[@]} commands in README.md" >&2; exit 2; }
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git rev-parse --short HEAD); $(uptime)"
logs=$(mktemp -d /tmp/readme_workflow.XXXXXX)
echo "each command's output: $logs/<n>.log"
failed=0
n=0
for command in "${commands[@]}"; do
    n=$((n + 1))
    t0=$(date +%s)
    echo "=== $(date -u +%T) $command"
    bash -c "$command" > "$logs/$n.log" 2>&1
    rc=$?
    echo "=== exit $rc after $(( $(date +%s) - t0 )) s"
    tr '\r' '\n' < "$logs/$n.log" | tail -n 4
    [ $rc -eq 0 ] || failed=1
done
echo "rows: $(ls results/runs | wc -l); engine files: $(ls results/tuned/engine 2>/dev/null | wc -l);" \
     "decisions: $(ls results/decisions | wc -l); output lines: $(wc -l < results/backlog/output.jsonl)"
exit $failed
