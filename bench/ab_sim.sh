#!/usr/bin/env bash
# Two moesim binaries' CPU time on the same runs, for a change whose gain is a few %: each case
# runs REPS times with the old and the new binary alternating, pinned to one core (taskset -c
# CORE), and the least CPU time (user + sys of the whole process) of each is kept, so that the
# machine's drift and other jobs (which only ever add time) weigh on both alike. Prints one line
# per case: the old and new least CPU seconds and old / new (> 1: the new binary is faster).
# A case is POLICY:TRACE:BATCH (`moesim sim --policy POLICY --hw a6000 --set memory.budget_gb=24
# --set batch.size=BATCH -q`), or stats:TRACE (`moesim trace stats TRACE`); TRACE is a path.
# Usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE [CASE ...]
# Environment: CORE (default 0).
set -euo pipefail
old=${1:?usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE [CASE ...]}
new=${2:?usage}
reps=${3:?usage}
shift 3
[[ $# -ge 1 ]] || { echo "usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE ..." >&2; exit 2; }
core=${CORE:-0}

# CPU seconds of one run of binary $1 for case $2
cpu_of() {
    local bin=$1 policy trace batch
    IFS=: read -r policy trace batch <<< "$2"
    local cmd=(sim --trace "$trace" --policy "$policy" --hw a6000 --set memory.budget_gb=24
        --set "batch.size=${batch:-1}" -q)
    [[ $policy == stats ]] && cmd=(trace stats "$trace")
    { /usr/bin/time -f "%U %S" taskset -c "$core" "$bin" "${cmd[@]}" > /dev/null; } 2>&1 |
        awk 'END {print $1 + $2}'
}

least() { awk -v a="$1" -v b="$2" 'BEGIN {print (b == "" || a < b) ? a : b}'; }

for case in "$@"; do
    best_old="" best_new=""
    for _ in $(seq "$reps"); do
        best_old=$(least "$(cpu_of "$old" "$case")" "$best_old")
        best_new=$(least "$(cpu_of "$new" "$case")" "$best_new")
    done
    awk -v c="$case" -v o="$best_old" -v n="$best_new" \
        'BEGIN {printf "%s: old %.2f s, new %.2f s, old / new %.3f\n", c, o, n, o / n}'
done
