#!/usr/bin/env bash
# What DynaExq does on one synthetic OLMoE trace, beside static low precision and offloading:
# the rows of policies/README.md's DynaExq table (make docs puts the table there).
#
#   experiments/dynaexq-check.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results (the trace is made in OUT_DIR/traces).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
trace="$out/traces/olmoe-r16-p64-g64-code-s5.h5"
mkdir -p "$out/traces"
[ -f "$trace" ] || "$moesim" trace synth --model olmoe-1b-7b --requests 16 --prompt-len 64 \
    --gen-len 64 --workload code --seed 5 -o "$trace" >&2

# label | policy | --set / --config arguments
runs=(
    "dynaexq, budget 5 GB|dynaexq|--set memory.budget_gb=5"
    "dynaexq (defaults: [DynaExq-v2]'s top-n_l)|dynaexq|"
    "dynaexq, budget 8 GB|dynaexq|--set memory.budget_gb=8"
    "dynaexq, dynaexq-revised.ini|dynaexq|--config configs/policies/dynaexq-revised.ini"
    "dynaexq, dynaexq-first.ini ([DynaExq-v1]'s fixed threshold)|dynaexq|--config configs/policies/dynaexq-first.ini"
    "dynaexq, dynaexq.prefetch = true ([DynaExq-v1]'s cross-layer prefetch)|dynaexq|--set dynaexq.prefetch=true"
    "lru at int4 (every expert fits: static INT4 after a cold start)|lru|--set expert.precision=int4"
    "lru at bf16 (offloading)|lru|"
)
echo "| run (memory.budget_gb = 6 unless said) | HI share of gate mass | n_l / E | HI set / n_l at the end | TPOT mean / P99 ms | TTFT mean ms | promotions | PCIe GB: migrations / all |"
echo "|---|---|---|---|---|---|---|---|"
for run in "${runs[@]}"; do
    IFS='|' read -r label policy args <<< "$run"
    # shellcheck disable=SC2086 # args is a list of words
    "$moesim" sim --trace "$trace" --hw a6000 --set batch.size=4 --set memory.budget_gb=6 \
        --policy "$policy" $args --json |
        python3 -c '
import json, sys
label, j = sys.argv[1], json.load(sys.stdin)
rep = j.get("policy_report", {})
if "hi_slots_per_layer" in rep:
    share = "%.3f" % j["precision_mix"]["hi"]
    slots = rep["hi_slots_per_layer"]
    nl = "%.3f" % rep["hi_share_of_experts"]
    held = "%.2f" % (rep["hi_set_per_layer"] / slots) if slots else "-"
    promos = "%d" % rep["promotions"]
    if rep["prefetch_moved"]:
        promos += " (%d moved ahead)" % rep["prefetch_moved"]
else:
    share, nl, held, promos = "(all %s)" % sys.argv[2], "", "", ""
print("| %s | %s | %s | %s | %.2f / %.2f | %.1f | %s | %.2f / %.2f |" % (label, share, nl, held,
      j["tpot_ms"]["mean"], j["tpot_ms"]["p99"], j["ttft_ms"]["mean"], promos,
      j["h2d_bytes_by_class"]["background"] / 1e9, j["h2d_bytes"] / 1e9))
' "$label" "$( [[ $args == *int4* ]] && echo int4 || echo bf16 )"
done

# The hysteresis margin against churn ([DynaExq-v2] §3.5), at a short interval so the set is challenged often.
echo
echo "With \`dynaexq.interval = 4\` (budget 6 GB), the promotions and the HI share as the margin grows:"
echo
echo "| hysteresis | promotions | HI share of gate mass |"
echo "|---|---|---|"
for margin in 0 0.25 1 4; do
    "$moesim" sim --trace "$trace" --hw a6000 --set batch.size=4 --set memory.budget_gb=6 \
        --policy dynaexq --set dynaexq.interval=4 --set dynaexq.hysteresis="$margin" --json |
        python3 -c '
import json, sys
j = json.load(sys.stdin)
print("| %s | %d | %.3f |" % (sys.argv[1], j["policy_report"]["promotions"], j["precision_mix"]["hi"]))
' "$margin"
done
