#!/usr/bin/env bash
# DyMoE Table 3 beside the simulation: sweeps experiments/dymoe-ablation.ini and prints, per row
# and budget, the paper's TPOT (experiments/paper/dymoe-table3.csv) and the simulated one, and
# whether each row is faster than the row before it in both (the ordering the paper reports).
#
#   experiments/dymoe-table3.sh [MOESIM] [OUT_DIR]
# MOESIM defaults to build/moesim, OUT_DIR to results; the table goes to stdout and
# OUT_DIR/dymoe-table3.md (make docs puts it in sim/README.md).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
mkdir -p "$out"
csv="$out/dymoe-table3.csv"
rm -f "$csv" # rows of an older build must not stand in for this one's
"$moesim" sweep experiments/dymoe-ablation.ini -j "$(nproc)" -o "$csv" >&2
awk -F, '
FNR == 1 { file++ }
file == 1 && /^#/ { next }
file == 1 && $1 == "row" { next }
file == 1 { name[$1] = $2; paper[$1, 16] = $4 * 1000; paper[$1, 24] = $6 * 1000; next }
FNR == 1 { for (i = 1; i <= NF; i++) if (!($i in col)) col[$i] = i; next }
{
    if ($col["status"] != "ok") { print "dymoe-table3: " $col["ablation"] ": " $col["status"] > "/dev/stderr"; exit 1 }
    r = substr($col["ablation"], 1, 1); b = $col["memory.budget_gb"] + 0
    sim[r, b] = $col["tpot_ms.mean"]
}
END {
    print "| row | configuration | paper 16 GB | sim 16 GiB | paper 24 GB | sim 24 GiB |"
    print "|---|---|---|---|---|---|"
    for (r = 1; r <= 6; r++) {
        line = sprintf("| %d | %s", r, name[r])
        for (bi = 0; bi < 2; bi++) {
            b = bi ? 24 : 16
            mark_p = r > 1 && paper[r, b] >= paper[r - 1, b] ? " (not faster)" : ""
            mark_s = r > 1 && sim[r, b] >= sim[r - 1, b] ? " (not faster)" : ""
            if (r > 1 && (mark_p == "") != (mark_s == "")) differ = differ sprintf(" row %d at %d;", r, b)
            line = line sprintf(" | %.1f ms%s | %.1f ms%s", paper[r, b], mark_p, sim[r, b], mark_s)
        }
        print line " |"
    }
    print ""
    if (differ == "") print "Every row is faster than the one before it in the paper and in the simulation."
    else print "Rows whose step from the row before differs from the paper:" differ
}' experiments/paper/dymoe-table3.csv "$csv" | tee "$out/dymoe-table3.md"
