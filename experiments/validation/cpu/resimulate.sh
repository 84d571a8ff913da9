#!/usr/bin/env bash
# A finished CPU validation run (run.sh's OUT_DIR/NAME: its experiment, trace, report.csv and the
# calibrations of its rounds) against the simulator as it is now: every configuration simulated
# again with each round's calibration (calibration/round-R.ini and its cost table) and compared
# with the replays the run measured. As validate does, the simulation compared is the round's of median
# makespan (the lower one of an even count), its TPOT that round's. Run with the binary that made the run, it must give the reported
# simulated TPOTs (the "at most X % from the reported" line is the control); with a changed
# simulator it shows what the change does to that run's errors without replaying anything.
#
#   experiments/validation/cpu/resimulate.sh RUN_DIR [MOESIM]
set -euo pipefail
run=${1:?usage: experiments/validation/cpu/resimulate.sh RUN_DIR [MOESIM]}
moesim=$(realpath "${2:-build/moesim}")
for f in experiment.ini report.csv; do
    [ -f "$run/$f" ] || { echo "resimulate: $run/$f: missing (not a run.sh output folder)" >&2; exit 2; }
done
rounds=$(find "$run/calibration" -maxdepth 1 -name 'round-*-cost.txt' | sed -n 's/.*round-\([0-9]*\)-cost.txt$/\1/p' | sort -n)
[ -n "$rounds" ] || { echo "resimulate: $run/calibration: no round-R.ini profiles (run without --calibrate-rounds?)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for r in $rounds; do
    profile=$(realpath "$run/calibration/round-$r.ini")
    table=$(realpath "$run/calibration/round-$r-cost.txt")
    # the round's profile in place of the base, its cost table beside it; without the [traces]
    # recipes, so that the run's trace is read as it is, never remade
    awk -v hw="$profile" -v table="$table" '
        /^\[/ { fixed = ($1 == "[fixed]"); recipes = ($1 == "[traces]") }
        recipes { next }
        fixed && /^hw *=/ { print "hw = " hw; print "sim.cost_table = " table; next }
        { print }' "$run/experiment.ini" >"$work/round-$r.ini"
    "$moesim" sweep "$work/round-$r.ini" -o "$work/round-$r.csv" -q >/dev/null
done

python3 - "$run/report.csv" "$work"/round-*.csv <<'EOF'
import csv, statistics, sys
reported = list(csv.DictReader(open(sys.argv[1])))
sims = {}
for path in sys.argv[2:]:
    for r in csv.DictReader(open(path)):
        if r["status"] == "ok":
            key = (r["policy"], f"budget {r['memory.budget_gb']} GiB")
            sims.setdefault(key, []).append((float(r["makespan_ms"]), float(r["tpot_ms.mean"])))
def median_makespan_tpot(runs):  # sorted() is stable: ties by round, as validate breaks them
    return sorted(runs, key=lambda run: run[0])[(len(runs) - 1) // 2][1]
err = lambda s, real: (s - real) / real * 100
rows = []
for r in reported:
    key = (r["policy"], r["configuration"])
    if key not in sims or not r["real_tpot_ms"]:
        continue
    rows.append((r["configuration"], r["policy"], float(r["real_tpot_ms"]), float(r["sim_tpot_ms"]),
                 median_makespan_tpot(sims[key])))
off = max(abs(now - then) / then for *_, then, now in rows) * 100
print(f"at most {off:.3f} % from the reported simulated TPOTs ({len(sims[key])} rounds)")
print()
print("| configuration | policy | TPOT replay ms | sim reported | err | sim now | err |")
print("|---|---|---|---|---|---|---|")
for conf, pol, real, then, now in rows:
    print(f"| {conf} | {pol} | {real:.3f} | {then:.3f} | {err(then, real):+.2f} % | {now:.3f} | {err(now, real):+.2f} % |")
print()
med = lambda i: statistics.median(abs(err(row[i], row[2])) for row in rows)
print(f"median |TPOT error|: reported {med(3):.2f} %, now {med(4):.2f} % ({len(rows)} configurations)")
EOF
