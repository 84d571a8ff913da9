"""The examples of python/examples, run as a user runs them, against the CLI: dymoe_table3.py
prints the table experiments/dymoe-table3.sh prints with the CLI (make docs puts it in
sim/README.md, "DyMoE Table 3")."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(args, cwd):
    p = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(map(str, args))}: {p.stderr}"
    return p.stdout


def test_dymoe_table3_example_prints_the_table_the_cli_script_prints(work):
    # both run from a folder laid out like the repository root (experiments/ linked in), so the
    # experiment's trace and results land here, not in the source tree
    root = work / "dymoe-table3"
    root.mkdir()
    (root / "experiments").symlink_to(ROOT / "experiments")
    # the script first: its sweep (the CLI) also makes the trace the example needs
    want = run(["bash", "experiments/dymoe-table3.sh", os.environ["MOESIM_BIN"], "out"], root)
    got = run([sys.executable, ROOT / "python/examples/dymoe_table3.py"], root)
    rows = [line for line in want.splitlines() if line.startswith("| ") and " ms" in line]
    assert len(rows) == 6, want  # Table 3's six rows, each with its paper and simulated TPOT
    assert got == want
