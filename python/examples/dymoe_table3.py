"""Notebook-style example (cells: `# %%`): DyMoE Table 3 from Python, in-process over libmoesim.

The README's experiment `dymoe-ablation` reproduces DyMoE Table 3 (Mixtral-8x7B on an RTX 3090,
PCIe Gen3, 16 and 24 GiB, six ablation rows); experiments/dymoe-table3.sh prints its mean TPOT
beside the paper's, and `make docs` puts that table in sim/README.md ("DyMoE Table 3"). This
example runs the same sweep with moesim.sweep and prints the same table, line for line
(python/tests/test_examples.py checks it against the script).

    python python/examples/dymoe_table3.py

Run it from the repository root: the experiment names its trace relative to the working folder
(results/traces/...), and the library has no synthesizer, so the trace comes from the
experiment's [traces] recipe run by the CLI once (`build/moesim sweep
experiments/dymoe-ablation.ini`, or experiments/dymoe-table3.sh)."""
# %% The experiment and the paper's numbers
import os
import sys

import pandas as pd

import moesim

EXPERIMENT = "experiments/dymoe-ablation.ini"
PAPER = "experiments/paper/dymoe-ablation.csv"  # row, config, ttft_s_16gb, tpot_s_16gb, ...
BUDGETS_GB = (16, 24)  # the experiment's memory.budget_gb axis: Table 3's two columns


# %% Twelve configurations (six rows x two budgets) in-process: the results CSV as a DataFrame
def run_sweep():
    runs = moesim.sweep(EXPERIMENT, jobs=os.cpu_count() or 1)
    failed = runs[runs["status"] != "ok"]
    if len(failed):
        raise moesim.MoesimError(f"{failed['ablation'].iloc[0]}: {failed['status'].iloc[0]}")
    runs["row"] = runs["ablation"].str.split(" ").str[0].astype(int)  # "3 cache+prefetch" -> 3
    return runs.pivot(index="row", columns="memory.budget_gb", values="tpot_ms.mean")


# %% The table: each row's mean TPOT in the paper and simulated, and whether the row is faster
# than the one before it (the ordering the paper reports)
def table_lines(sim_tpot_ms, paper):
    paper_tpot_ms = {b: paper.set_index("row")[f"tpot_s_{b}gb"] * 1000 for b in BUDGETS_GB}

    def slower_mark(tpot, r):
        return " (not faster)" if r > 1 and tpot[r] >= tpot[r - 1] else ""

    lines = ["| row | configuration | paper 16 GB | sim 16 GiB | paper 24 GB | sim 24 GiB |",
             "|---|---|---|---|---|---|"]
    differ = ""
    for r, name in zip(paper["row"], paper["config"]):
        cells = [str(r), name]
        for b in BUDGETS_GB:
            mark_paper = slower_mark(paper_tpot_ms[b], r)
            mark_sim = slower_mark(sim_tpot_ms[b], r)
            if mark_paper != mark_sim:
                differ += f" row {r} at {b};"
            cells += [f"{paper_tpot_ms[b][r]:.1f} ms{mark_paper}",
                      f"{sim_tpot_ms[b][r]:.1f} ms{mark_sim}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Rows whose step from the row before differs from the paper:" + differ if differ
                 else "Every row is faster than the one before it in the paper and in the "
                 "simulation.")
    return lines


# %% Run
def main():
    try:
        sim_tpot_ms = run_sweep()
    except moesim.MoesimError as e:
        print(f"dymoe_table3: {e} (run from the repository root, after `build/moesim sweep "
              f"{EXPERIMENT}` made the trace)", file=sys.stderr)
        sys.exit(2)
    print("\n".join(table_lines(sim_tpot_ms, pd.read_csv(PAPER, comment="#"))))


if __name__ == "__main__":
    main()
