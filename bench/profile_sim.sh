#!/usr/bin/env bash
# The simulator's profile by instruction count: `valgrind --tool=callgrind` of `moesim sim` (the
# whole process: opening the stream, the run and its block reads with their checks) on a synthesized
# Qwen3-30B-A3B trace of TOKENS tokens (requests of 32 prompt + 968 decode tokens, no look-ahead:
# the emulated predictor runs), on HW (default rtx3090-pcie4) at batch BATCH (default 4), with
# SET (default none: "memory.budget_gb=24" adds --set memory.budget_gb=24). Instruction counts do
# not depend on what else the machine runs, so two binaries compare on a shared machine; they do
# not see cache misses or mispredicted branches (`perf record -e cpu-clock` does). For each policy:
# its total instructions, then the TOP functions by self count as markdown table rows (share,
# function). With STATS=1, each binary's `moesim trace stats` of the same trace first, and after
# each sim its instruction ratio stats / sim (the throughput ratio sim / stats, as instructions).
# JSON=0 runs sim without --json (whose provenance hashes the trace file; stats does not).
# The trace is made by the first binary; every binary runs the same file.
# Usage: bench/profile_sim.sh TOKENS TOP "POLICY ..." MOESIM [MOESIM ...]
set -euo pipefail
tokens=${1:?usage: bench/profile_sim.sh TOKENS TOP "POLICY ..." MOESIM [MOESIM ...]}
top=${2:?usage}
policies=${3:?usage}
shift 3
[[ $# -ge 1 ]] || { echo "usage: bench/profile_sim.sh TOKENS TOP \"POLICY ...\" MOESIM ..." >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-profile.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$1" trace synth --model qwen3-30b-a3b --requests $((tokens / 1000)) --prompt-len 32 \
    --gen-len 968 --lookahead 0 --seed 1 -q -o "$work/trace.h5"
hw=${HW:-rtx3090-pcie4}
batch=${BATCH:-4}
extra=()
for kv in ${SET:-}; do extra+=(--set "$kv"); done
json=()
[[ ${JSON:-1} == 1 ]] && json=(--json)
# total instructions of a callgrind output
total_of() { callgrind_annotate "$1" 2> /dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; }
declare -A stats_ir
if [[ ${STATS:-0} == 1 ]]; then
    for bin in "$@"; do
        valgrind --tool=callgrind --callgrind-out-file="$work/cg.stats" "$bin" trace stats \
            "$work/trace.h5" > /dev/null 2> "$work/cg.err"
        stats_ir[$bin]=$(total_of "$work/cg.stats")
        awk -v b="$bin" -v t="${stats_ir[$bin]}" \
            'BEGIN {printf "trace stats, %s: %.2f G instructions\n", b, t / 1e9}'
    done
fi
for pol in $policies; do
    for bin in "$@"; do
        valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" sim \
            --trace "$work/trace.h5" --hw "$hw" --policy "$pol" --set batch.size="$batch" \
            "${extra[@]}" "${json[@]}" > /dev/null 2> "$work/cg.err"
        # "N (p%)  file:function [object]" lines after the totals; keep the function's name
        callgrind_annotate "$work/cg.out" 2> /dev/null | awk -v pol="$pol" -v bin="$bin" -v top="$top" \
            -v st="${stats_ir[$bin]:-}" '
            /PROGRAM TOTALS/ { total = $1; gsub(",", "", total)
                               printf "%s, %s: %.2f G instructions", pol, bin, total / 1e9
                               if (st != "") printf " (stats / sim: %.3f)", st / total
                               printf "\n" }
            total && /^ *[0-9,]+ +\([ 0-9.]+%\) +[^ ]+:[^ ]+ \[/ && shown < top {
                share = $0; sub(/^ *[0-9,]+ +\( */, "", share); sub(/%\).*/, "", share)
                name = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", name); sub(/ \[.*/, "", name)
                sub(/^.*:/, "", name)
                printf "| %5.1f %% | %s |\n", share, name; shown++
            }'
    done
done
