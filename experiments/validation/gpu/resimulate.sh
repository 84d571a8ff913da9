#!/usr/bin/env bash
# The committed GPU validation (validate-<budget>.json: the replays measured on the H200) against
# the simulator as it is now, with the same calibrated profile and cost table, plus the figure
# that run's calibrate measured but its profile could not yet hold (op_issue_us: calibrate.log,
# "two timing events around a launch add X us"). A control run without that figure must give
# the committed simulated TPOTs (it says how far it is from them). Prints one row per
# configuration (replayed TPOT, simulated TPOT as committed and now, errors) and the median
# |TPOT error| of each. The trace is made under results/validate-gpu/ of the repository.
#
#   experiments/validation/gpu/resimulate.sh [MOESIM]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
moesim=$(realpath "${1:-$root/build/moesim}")
here=experiments/validation/gpu
cd "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

issue_us=$(sed -n 's/.*two timing events around a launch add \([0-9.]*\) us.*/\1/p' "$here/calibrate.log")
[ -n "$issue_us" ] || { echo "resimulate: $here/calibrate.log names no timing-event figure" >&2; exit 2; }
if grep -q '^op_issue_us' "$here/gpu-measured.ini"; then
    echo "resimulate: $here/gpu-measured.ini has op_issue_us already: nothing to add" >&2
    exit 2
fi
# the profile as the run wrote it (control) and as calibrate now writes it (op_issue_us added)
cp "$here/gpu-measured.ini" "$work/control.ini"
awk -v us="$issue_us" '{ print } /^kernel_launch_us/ && !done {
        print "op_issue_us = " us " ; derived: measured by moesim calibrate (calibrate.log)"; done = 1 }' \
    "$here/gpu-measured.ini" >"$work/now.ini"
for p in control now; do
    sed "s|^hw = .*|hw = $work/$p.ini|" "$here/validate.ini" >"$work/$p-experiment.ini"
    # the simulator refuses `static` (the experts do not fit): said on stderr, left out below
    "$moesim" sweep "$work/$p-experiment.ini" -o "$work/$p.csv" -q >/dev/null 2>&1 || true
done

python3 - "$work/control.csv" "$work/now.csv" "$here"/validate-*.json <<'EOF'
import csv, json, statistics, sys
def tpots(path):
    return {(r["policy"], float(r["memory.budget_gb"])): float(r["tpot_ms.mean"])
            for r in csv.DictReader(open(path)) if r["status"] == "ok"}
control, now = tpots(sys.argv[1]), tpots(sys.argv[2])
rows = []
for path in sys.argv[3:]:
    budget = float(path.rsplit("validate-", 1)[1][:-len(".json")])
    for r in json.load(open(path))["rows"]:
        if "real_tpot_ms" in r:
            key = (r["policy"], budget)
            rows.append((budget, r["policy"], r["real_tpot_ms"], r["sim_tpot_ms"], control[key], now[key]))
rows.sort()
err = lambda s, real: (s - real) / real * 100
drift = max(abs(c - t) / t for _, _, _, t, c, _ in rows) * 100
print(f"control (this simulator, the profile as run 3 wrote it): at most {drift:.3f} % from the committed simulated TPOTs")
print()
print("| budget GiB | policy | TPOT replay ms | sim as committed | err | sim now | err |")
print("|---|---|---|---|---|---|---|")
for b, p, real, then, _, cur in rows:
    print(f"| {b:g} | {p} | {real:.3f} | {then:.3f} | {err(then, real):+.1f} % | {cur:.3f} | {err(cur, real):+.1f} % |")
print()
print(f"median |TPOT error|: as committed {statistics.median(abs(err(t, r)) for _, _, r, t, _, _ in rows):.2f} %, "
      f"now {statistics.median(abs(err(c, r)) for _, _, r, _, _, c in rows):.2f} % ({len(rows)} configurations)")
EOF
