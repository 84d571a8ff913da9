#!/usr/bin/env bash
# The counter-example of policies/README.md ("oracle"): on prompt steps of 64 tokens, lfu has a
# higher hit rate and loads fewer experts than oracle (the same run as
# tests/test_policy_oracle.c); make docs puts the table in the README.
#
#   experiments/oracle-counterexample.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results (the trace is made in OUT_DIR/traces).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
trace="$out/traces/deepseek-v2-lite-r24-p64-g0-s1.h5"
mkdir -p "$out/traces"
[ -f "$trace" ] || "$moesim" trace synth --model deepseek-v2-lite --requests 24 --prompt-len 64 \
    --gen-len 0 --seed 1 -o "$trace" >&2
echo "| policy | hit rate | makespan ms | expert GB moved (placement before the clock included) | skipped gate mass |"
echo "|---|---|---|---|---|"
for policy in lfu lru oracle; do
    "$moesim" sim --trace "$trace" --hw rtx3090-pcie4 --policy "$policy" \
        --set expert.precision=int4 --set memory.budget_gb=3.3 --json |
        python3 -c '
import json, sys
p, j = sys.argv[1], json.load(sys.stdin)
moved = (j["h2d_bytes"] + j["warmup_h2d_bytes"]) / 1e9
print("| %s | %.4f | %.1f | %.3f | %.4f |" % (p, j["hit_rate"], j["makespan_ms"], moved,
                                              j["precision_mix"]["skip"]))
' "$policy"
done
