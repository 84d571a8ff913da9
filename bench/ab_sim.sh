#!/usr/bin/env bash
# Two moesim binaries' CPU time on the same runs, for a change whose gain is a few %: each case
# runs REPS times with the old and the new binary alternating, pinned to one core (taskset -c
# CORE), and the least CPU time (user + sys of the whole process) of each is kept, so that the
# machine's drift and other jobs (which only ever add time) weigh on both alike. Prints one line
# per case: the old and new least CPU seconds and old / new (> 1: the new binary is faster).
# With PAIR=1 the two binaries run at once, one on each of cores 0 and 1, the cores swapped
# every run: a drift of the machine over minutes then falls on both runs of a pair alike (each
# is slowed by the other beside it, so the seconds read higher than alone); the line adds the
# medians and their ratio.
# A case is POLICY:TRACE:BATCH (`moesim sim --policy POLICY --hw a6000 --set memory.budget_gb=24
# --set batch.size=BATCH -q`), or stats:TRACE (`moesim trace stats TRACE`); TRACE is a path.
# Usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE [CASE ...]
# Environment: CORE (default 0; unused with PAIR=1), PAIR (default 0).
set -euo pipefail
old=${1:?usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE [CASE ...]}
new=${2:?usage}
reps=${3:?usage}
shift 3
[[ $# -ge 1 ]] || { echo "usage: bench/ab_sim.sh OLD_MOESIM NEW_MOESIM REPS CASE ..." >&2; exit 2; }
core=${CORE:-0}
pair=${PAIR:-0}
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-ab.XXXXXX")
trap 'rm -rf "$work"' EXIT

# CPU seconds of one run of binary $1 for case $2 on core $3
cpu_of() {
    local bin=$1 policy trace batch
    IFS=: read -r policy trace batch <<< "$2"
    local cmd=(sim --trace "$trace" --policy "$policy" --hw a6000 --set memory.budget_gb=24
        --set "batch.size=${batch:-1}" -q)
    [[ $policy == stats ]] && cmd=(trace stats "$trace")
    { /usr/bin/time -f "%U %S" taskset -c "$3" "$bin" "${cmd[@]}" > /dev/null; } 2>&1 |
        awk 'END {print $1 + $2}'
}

least() { awk -v a="$1" -v b="$2" 'BEGIN {print (b == "" || a < b) ? a : b}'; }
median() { sort -n "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

for case in "$@"; do
    best_old="" best_new=""
    : > "$work/old" && : > "$work/new"
    for ((i = 0; i < reps; i++)); do
        if [[ $pair == 1 ]]; then
            cpu_of "$old" "$case" $((i % 2)) > "$work/o" &
            cpu_of "$new" "$case" $((1 - i % 2)) > "$work/n" &
            wait
        else
            cpu_of "$old" "$case" "$core" > "$work/o"
            cpu_of "$new" "$case" "$core" > "$work/n"
        fi
        cat "$work/o" >> "$work/old" && cat "$work/n" >> "$work/new"
        best_old=$(least "$(cat "$work/o")" "$best_old")
        best_new=$(least "$(cat "$work/n")" "$best_new")
    done
    line=$(awk -v c="$case" -v o="$best_old" -v n="$best_new" \
        'BEGIN {printf "%s: old %.2f s, new %.2f s, old / new %.3f", c, o, n, o / n}')
    if [[ $pair == 1 ]]; then
        line+=$(awk -v o="$(median "$work/old")" -v n="$(median "$work/new")" \
            'BEGIN {printf "; medians %.2f / %.2f s, %.3f", o, n, o / n}')
    fi
    echo "$line"
done
