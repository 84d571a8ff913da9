#!/usr/bin/env bash
# FIRM-MoE Table 1, HEOP against the best fixed (K, P) of the same run: sweeps
# experiments/firm-ablation.ini (the five Table 1 rows and a grid of fixed (K, P) with n = 1, no
# HEOP) and prints, per cache size, each row's mean TPOT, the (K, P) HEOP fixed per depth group,
# the best fixed (K, P) and how far All is from it; then the grid's TPOT and the two measurable
# terms of HEOP's loss (Eq. 11) per (K, P), which show what HEOP's search optimizes.
#
#   experiments/firm-table1.sh [MOESIM] [OUT_DIR] [EXPERIMENT]
# MOESIM defaults to build/moesim, OUT_DIR to results, EXPERIMENT to the file above (a test runs a
# smaller one). The tables go to stdout and OUT_DIR/firm-table1.md (make docs puts them in
# policies/README.md).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results}
experiment=${3:-experiments/firm-ablation.ini}
mkdir -p "$out"
csv="$out/firm-table1.csv"
rm -f "$csv" # rows of an older build must not stand in for this one's
"$moesim" sweep "$experiment" -j "$(nproc)" -o "$csv" >&2

awk -F, '
NR == 1 {
    for (i = 1; i <= NF; i++) if (!($i in col)) col[$i] = i  # first of duplicate names: setting
    next
}
{
    if ($col["status"] != "ok") { print "firm-table1: " $col["row"] " at " $col["label.cache_experts"] ": " $col["status"] > "/dev/stderr"; bad = 1; next }
    c = $col["label.cache_experts"] + 0; row = $col["row"]; tpot = $col["tpot_ms.mean"] + 0
    if (!(c in seen)) { seen[c] = 1; caches[++n_caches] = c }
    n_rep = split($col["policy_report"], kv, ";")
    for (i = 1; i <= n_rep; i++) { split(kv[i], f, "="); rep[f[1]] = f[2] }
    if (row ~ /^K[0-9]+ P[0-9]+$/) {
        split(substr(row, 2), kp, " P"); k = kp[1] + 0; p = kp[2] + 0
        if (k > k_max) k_max = k
        if (p > p_max) p_max = p
        grid[c, k, p] = tpot
        if (!((c, "best") in grid) || tpot < grid[c, "best"]) { grid[c, "best"] = tpot; best_k[c] = k; best_p[c] = p }
        # Eq. 7-8 over every MoL set: per predicted layer, n_unused = |S| (1 - utilization) and
        # n_miss = |A| - |S n A| = |S| utilization (1 / accuracy - 1); printed for the smallest
        # cache (the sets follow the look-ahead of the trace, not the cache)
        s = rep["mol.mean_set_size"]; u = rep["mol.utilization"]; a = rep["mol.accuracy"]
        unused[c, k, p] = s * (1 - u)
        miss[c, k, p] = a > 0 ? s * u * (1 / a - 1) : 0
        mol_u[c, k, p] = u; mol_a[c, k, p] = a; pf_u[c, k, p] = $col["prefetch.utilization"]
    } else {
        t[c, row] = tpot
        if (row ~ /^All / && !(row in is_diag)) { is_diag[row] = 1; diag[++n_diag] = row }  # in file order
        if (row ~ /^All/) kp_all[c, row == "All" ? "" : row] = sprintf("(%d, %d) / (%d, %d) / (%d, %d)", rep["shallow.K"], rep["shallow.P"], rep["middle.K"], rep["middle.P"], rep["deep.K"], rep["deep.P"])
    }
}
END {
    if (bad) exit 1
    if (n_caches == 0 || k_max == 0) { print "firm-table1: no rows, or no fixed (K, P) grid (rows named K<k> P<p>)" > "/dev/stderr"; exit 1 }
    n_rows = split("Baseline +FG +MoL +FG+MoL All", rows, " ")
    for (i = 1; i <= n_caches; i++)  # ascending cache sizes
        for (j = i + 1; j <= n_caches; j++)
            if (caches[j] < caches[i]) { x = caches[i]; caches[i] = caches[j]; caches[j] = x }
    print "| cache (experts) | Baseline | + FG | + MoL | + FG + MoL | All | All: (K, P) shallow / middle / deep | best fixed (K, P) | its TPOT | All vs best fixed |"
    print "|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= n_caches; i++) {
        c = caches[i]; line = "| " c
        for (r = 1; r <= n_rows; r++) {
            if (!((c, rows[r]) in t)) { print "firm-table1: no " rows[r] " row at cache " c > "/dev/stderr"; exit 1 }
            line = line sprintf(" | %.1f", t[c, rows[r]])
        }
        b = grid[c, "best"]; gap = 100 * (t[c, "All"] / b - 1)
        print line sprintf(" | %s | (%d, %d) | %.1f | %+.1f %% |", kp_all[c, ""], best_k[c], best_p[c], b, gap)
        if (t[c, "All"] > b) slower = slower sprintf("%s %d (%+.1f %%)", slower == "" ? "" : ",", c, gap)
    }
    print ""
    if (slower == "") print "All (HEOP) at least matches the best fixed (K, P) at every cache size."
    else print "All (HEOP) is slower than the best fixed (K, P) at cache sizes" slower "."
    if (n_diag > 0) {
        print ""
        print "HEOP diagnostics (not in the paper; rows named All + knobs): mean TPOT (ms), the (K, P) fixed per group, and the gap to the best fixed (K, P):"
        print ""
        print "| cache (experts) | row | TPOT | (K, P) shallow / middle / deep | vs best fixed |"
        print "|---|---|---|---|---|"
        for (i = 1; i <= n_caches; i++)
            for (d = 1; d <= n_diag; d++) {
                c = caches[i]; r = diag[d]
                if ((c, r) in t) printf "| %d | %s | %.1f | %s | %+.1f %% |\n", c, r, t[c, r], kp_all[c, r], 100 * (t[c, r] / grid[c, "best"] - 1)
            }
    }
    print ""
    print "Mean TPOT (ms) of every fixed (K, P), n = 1, no HEOP:"
    print ""
    ks = ""; rule = "|---|---"
    for (k = 1; k <= k_max; k++) { ks = ks " | K = " k; rule = rule "|---" }
    print "| cache (experts) | P" ks " |"; print rule "|"
    for (i = 1; i <= n_caches; i++)
        for (p = 1; p <= p_max; p++) {
            line = "| " caches[i] " | " p
            for (k = 1; k <= k_max; k++)
                line = line (((caches[i], k, p) in grid) ? sprintf(" | %.1f", grid[caches[i], k, p]) : " | -")
            print line " |"
        }
    print ""
    c = caches[1]
    print "Eq. 11 terms per predicted layer of every fixed (K, P) at a cache of " c " experts: n_unused (predicted, not used), n_miss (used, not predicted) and Eq. 11 at alpha = beta = 0.5 before its - n_hit credit (the unpredicted experts the cache held, which the sweep does not report):"
    print ""
    print "| term | P" ks " |"; print rule "|"
    for (p = 1; p <= p_max; p++) {
        lu = "| n_unused | " p; lm = "| n_miss | " p
        for (k = 1; k <= k_max; k++) {
            lu = lu (((c, k, p) in unused) ? sprintf(" | %.2f", unused[c, k, p]) : " | -")
            lm = lm (((c, k, p) in miss) ? sprintf(" | %.2f", miss[c, k, p]) : " | -")
        }
        ls = "| (n_unused + n_miss) / 2 | " p
        for (k = 1; k <= k_max; k++)
            ls = ls (((c, k, p) in miss) ? sprintf(" | %.2f", (unused[c, k, p] + miss[c, k, p]) / 2) : " | -")
        print lu " |"; print lm " |"; print ls " |"
    }
    # Eq. 7-8 at the K = 3 of the Table 1 caption (when the grid has it): the MoL sets against the
    # simulator, which counts only the experts a prefetch was issued for
    if (k_max < 3) exit
    print ""
    print "Eq. 7-8 at K = 3 (the Table 1 caption): over every MoL set (mol.utilization, mol.accuracy) and over the issued prefetches (prefetch.utilization of the simulator) per cache:"
    print ""
    line = "| P | mol.utilization | mol.accuracy"; rule = "|---|---|---"
    for (i = 1; i <= n_caches; i++) { line = line " | prefetch.utilization, " caches[i]; rule = rule "|---" }
    print line " |"; print rule "|"
    for (p = 1; p <= p_max; p++) {
        if (!((c, 3, p) in mol_u)) continue
        line = sprintf("| %d | %.3f | %.3f", p, mol_u[c, 3, p], mol_a[c, 3, p])
        for (i = 1; i <= n_caches; i++) line = line sprintf(" | %.3f", pf_u[caches[i], 3, p])
        print line " |"
    }
}' "$csv" | tee "$out/firm-table1.md"
