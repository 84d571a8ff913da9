#!/usr/bin/env bash
# The committed GPU validation (validate-<budget>.json: the replays measured on the H200) against
# the simulator as it is now, with the same calibrated profile and cost table, plus the figure
# that run's calibrate measured but its profile could not yet hold (op_issue_us: calibrate.log,
# "two timing events around a launch add X us"). Prints one row per configuration (replayed
# TPOT, simulated TPOT as committed and now, errors) and the median |TPOT error| of each.
#
#   experiments/validation/gpu/resimulate.sh [MOESIM]     (from the repository root)
set -euo pipefail
moesim=${1:-build/moesim}
here=experiments/validation/gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

issue_us=$(sed -n 's/.*two timing events around a launch add \([0-9.]*\) us.*/\1/p' "$here/calibrate.log")
[ -n "$issue_us" ] || { echo "resimulate: $here/calibrate.log names no timing-event figure" >&2; exit 2; }
# the profile as calibrate now writes it: op_issue_us after kernel_launch_us
awk -v us="$issue_us" '{ print } /^kernel_launch_us/ && !done {
        print "op_issue_us = " us " ; derived: measured by moesim calibrate (calibrate.log)"; done = 1 }' \
    "$here/gpu-measured.ini" >"$work/gpu-measured.ini"
sed "s|^hw = .*|hw = $work/gpu-measured.ini|" "$here/validate.ini" >"$work/validate.ini"
"$moesim" sweep "$work/validate.ini" -o "$work/sim.csv" -q >/dev/null

python3 - "$work/sim.csv" "$here"/validate-*.json <<'EOF'
import csv, json, statistics, sys
now = {(r["policy"], float(r["memory.budget_gb"])): float(r["tpot_ms.mean"])
       for r in csv.DictReader(open(sys.argv[1])) if r["status"] == "ok"}
rows = []
for path in sys.argv[2:]:
    d = json.load(open(path))
    budget = float(path.rsplit("validate-", 1)[1][:-len(".json")])
    for r in d["rows"]:
        if "real_tpot_ms" not in r:
            continue
        real, then = r["real_tpot_ms"], r["sim_tpot_ms"]
        rows.append((budget, r["policy"], real, then, now[(r["policy"], budget)]))
rows.sort()
print("| budget GiB | policy | TPOT replay ms | sim as committed | err | sim now | err |")
print("|---|---|---|---|---|---|---|")
err = lambda s, real: (s - real) / real * 100
for b, p, real, then, cur in rows:
    print(f"| {b:g} | {p} | {real:.3f} | {then:.3f} | {err(then, real):+.1f} % | {cur:.3f} | {err(cur, real):+.1f} % |")
print()
print(f"median |TPOT error|: as committed {statistics.median(abs(err(t, r)) for _, _, r, t, _ in rows):.2f} %, "
      f"now {statistics.median(abs(err(c, r)) for _, _, r, _, c in rows):.2f} % ({len(rows)} configurations)")
EOF
