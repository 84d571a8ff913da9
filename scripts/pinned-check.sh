#!/usr/bin/env bash
# `trace stats` beside the simulator on a Mixtral-8x7B-shaped trace the size of a real vLLM
# Mixtral-8x7B routing log (2 requests of a 1-token prompt and 168 decode tokens: 338 tokens, 21,632
# accesses), synthesized with the family's calibrated defaults (traces/SYNTH.md): per capacity C
# (per-layer pools of C experts, batch 1), the LRU hit rate under the simulator's rule from
# `trace stats` and from `moesim sim --policy lru`, Belady's hit rate and misses under the same
# rule from `trace stats` and the loads of `moesim sim --policy oracle`, and the per-slot LRU
# (nothing pinned). Each pair must agree (tests/test_sim.c checks the same on small traces).
#
#   scripts/pinned-check.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results. The table goes to stdout (make docs puts it
# in traces/STATS.md).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
mkdir -p "$out"
trace="$out/pinned-check.h5"
"$moesim" trace synth --model mixtral-8x7b --requests 2 --prompt-len 1 --gen-len 168 --seed 1 \
    -q -o "$trace"
stats=$(mktemp)
trap 'rm -f "$stats"' EXIT
"$moesim" trace stats "$trace" --json > "$stats"

# A top-level number ("  \"key\": v") or an entry of a top-level object ("  \"key\": {" then
# "    \"sub\": v") of moesim's indented JSON.
top() { awk -v k="  \"$1\":" 'index($0, k) == 1 { sub(/,$/, ""); print $NF; exit }' "$2"; }
entry() {
    awk -v k="  \"$1\": {" -v s="    \"$2\":" '
        $0 == k { inside = 1; next }
        inside && /^  [}]/ { exit }
        inside && index($0, s) == 1 { sub(/,$/, ""); print $NF; exit }' "$3"
}

accesses=$(top accesses "$stats")
echo "| C | LRU: trace stats | LRU: sim | Belady: trace stats | Belady misses: trace stats | oracle loads: sim | LRU per slot |"
echo "|---|---|---|---|---|---|---|"
for c in 2 3 4 6; do
    run() {
        "$moesim" sim --trace "$trace" --hw rtx3090-pcie4 --policy "$1" \
            --set cache.experts_per_layer=$c --set expert.precision=int4 --json
    }
    sim_lru=$(run lru | awk '/^  "hit_rate":/ { sub(/,$/, ""); print $NF; exit }')
    oracle_loads=$(run oracle | awk '/^    "loads":/ { sub(/,$/, ""); print $NF; exit }')
    lru=$(entry lru_hit_rate $c "$stats")
    opt=$(entry opt_hit_rate $c "$stats")
    slot=$(entry lru_slot_hit_rate $c "$stats")
    awk -v c=$c -v lru="$lru" -v sim="$sim_lru" -v opt="$opt" -v n="$accesses" \
        -v loads="$oracle_loads" -v slot="$slot" 'BEGIN {
        printf "| %d | %.4f | %.4f | %.4f | %.0f | %.0f | %.4f |\n", c, lru, sim, opt, (1 - opt) * n, \
            loads, slot
    }'
done
