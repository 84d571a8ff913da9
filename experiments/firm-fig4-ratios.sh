#!/usr/bin/env bash
# FIRM-MoE Figure 4's three stated ratios on Qwen1.5-MoE-A2.7B (BB / FIRM-MoE at 128 and 768
# experts, FIRM-MoE 128 / 768) under the profile (rtx3090-pcie4) and with one physical quantity
# changed at a time: the fixed time of every kernel (a stand-in for per-layer time that does not
# depend on the cache: framework overhead, slower kernels), the PCIe bandwidth, and the accuracy
# of the predictor (emulated). Same trace and budgets as experiments/cache-size-sweep.ini; make
# docs puts the table in policies/README.md ("firm-moe", Figure 4).
#
#   experiments/firm-fig4-ratios.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results (traces in OUT_DIR/traces, hardware
# variants in OUT_DIR/firm-fig4-hw).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
trace="$out/traces/qwen1.5-moe-a2.7b-r8-p100-g150.h5"
plain="$out/traces/qwen1.5-moe-a2.7b-r8-p100-g150-nolookahead.h5"
mkdir -p "$out/traces" "$out/firm-fig4-hw"
[ -f "$trace" ] || "$moesim" trace synth --model qwen1.5-moe-a2.7b --requests 8 \
    --prompt-len 100 --gen-len 150 --seed 1 -o "$trace" >&2
[ -f "$plain" ] || "$moesim" trace synth --model qwen1.5-moe-a2.7b --requests 8 \
    --prompt-len 100 --gen-len 150 --seed 1 --lookahead 0 -o "$plain" >&2
# label | kernel_launch_us | h2d_gb_per_s | predictor accuracy (empty: the trace's look-ahead)
cases=(
    "the profile (rtx3090-pcie4)|5|24|"
    "kernel launch 200 us|200|24|"
    "kernel launch 500 us|500|24|"
    "PCIe 6 GB/s|5|6|"
    "PCIe 2 GB/s|5|2|"
    "predictor accuracy 0.3, PCIe 6 GB/s|5|6|0.3"
)
bb=(--set firm-moe.K=0 --set firm-moe.P=1 --set firm-moe.n=3 --set firm-moe.heop=false)
tpot() { # hw, budget, trace, extra arguments...
    local hw=$1 budget=$2 tr=$3
    shift 3
    "$moesim" sim --trace "$tr" --hw "$hw" --policy firm-moe --set batch.size=1 \
        --set memory.budget_gb="$budget" "$@" --json |
        python3 -c 'import json, sys; print("%.1f" % json.load(sys.stdin)["tpot_ms"]["mean"])'
}
echo "| setting | FIRM-MoE TPOT ms, 128 / 768 experts | BB TPOT ms, 128 / 768 | BB / FIRM-MoE at 128 | at 768 | FIRM-MoE 128 / 768 |"
echo "|---|---|---|---|---|---|"
echo "| paper (Figure 4 text) | | | 1.8 | 1.6 | < 1.3 |"
for c in "${cases[@]}"; do
    IFS='|' read -r label launch bw acc <<< "$c"
    hw="$out/firm-fig4-hw/launch$launch-pcie$bw.ini"
    sed -e "s/^kernel_launch_us = 5 /kernel_launch_us = $launch /" \
        -e "s/^h2d_gb_per_s = 24 /h2d_gb_per_s = $bw /" configs/hw/rtx3090-pcie4.ini > "$hw"
    tr=$trace pred=()
    if [ -n "$acc" ]; then tr=$plain pred=(--set predictor.depth=3 --set predictor.accuracy="$acc"); fi
    f128=$(tpot "$hw" 5.6395 "$tr" "${pred[@]}")
    f768=$(tpot "$hw" 15.9520 "$tr" "${pred[@]}")
    b128=$(tpot "$hw" 5.6395 "$tr" "${pred[@]}" "${bb[@]}")
    b768=$(tpot "$hw" 15.9520 "$tr" "${pred[@]}" "${bb[@]}")
    awk -v l="$label" -v f1="$f128" -v f7="$f768" -v b1="$b128" -v b7="$b768" 'BEGIN {
        printf "| %s | %s / %s | %s / %s | %.2f | %.2f | %.2f |\n", l, f1, f7, b1, b7, b1 / f1, b7 / f7, f1 / f7 }'
done
