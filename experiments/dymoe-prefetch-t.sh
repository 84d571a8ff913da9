#!/usr/bin/env bash
# DyMoE's decode prefetch count t (Eq. 8) under its two rules, on the Table 3 setting of
# experiments/dymoe-ablation.ini: mean TPOT of the rows with the prefetcher, t = Eq. 5's critical
# count t_{l+1} (the default) against t = top_k with the sub-critical ones at lo (make docs puts
# the table in sim/README.md, "DyMoE Table 3").
#
#   experiments/dymoe-prefetch-t.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results (the trace is made in OUT_DIR/traces).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
trace="$out/traces/mixtral-8x7b-r8-p64-256-g64.h5"
mkdir -p "$out/traces"
[ -f "$trace" ] || "$moesim" trace synth --model mixtral-8x7b --requests 8 --prompt-len 64:256 \
    --gen-len 64 --seed 1 -o "$trace" >&2
# row | its knobs (experiments/dymoe-ablation.ini, [axis ablation])
rows=(
    "3 cache + prefetch|dyquant=false lo=int2"
    "5 cache + dyquant 4/2 + prefetch|dyquant=true lo=int2"
    "6 cache + dyquant 4/0 + prefetch|dyquant=true lo=skip"
)
echo "| row | TPOT 16 GiB, t = t_{l+1} | t = top_k | TPOT 24 GiB, t = t_{l+1} | t = top_k |"
echo "|---|---|---|---|---|"
for row in "${rows[@]}"; do
    IFS='|' read -r label knobs <<< "$row"
    line="| $label"
    for gb in 16 24; do
        for rule in critical top_k; do
            sets=(--set memory.budget_gb=$gb --set dymoe.prefetch_t_rule=$rule)
            for k in $knobs; do sets+=(--set "dymoe.$k"); done
            tpot=$("$moesim" sim --trace "$trace" --hw rtx3090-pcie3 --policy dymoe --set sim.seed=1 \
                --set expert.precision=int4 --set batch.size=1 --set dymoe.lambda=0.5 \
                --set dymoe.hi=int4 --set dymoe.cache=true --set dymoe.prefetch=true \
                "${sets[@]}" --json |
                python3 -c 'import json, sys; print("%.1f ms" % json.load(sys.stdin)["tpot_ms"]["mean"])')
            line="$line | $tpot"
        done
    done
    echo "$line |"
done
