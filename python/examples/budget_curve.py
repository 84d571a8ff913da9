"""Notebook-style example: the hit rate and throughput of two policies as the HBM budget grows,
on one trace, from Python (in-process over libmoesim), with the trace's own statistics beside.

    python python/examples/budget_curve.py TRACE.h5 [HW]

A trace to try: moesim trace synth --model olmoe-1b-7b --requests 4 -o olmoe.h5"""
import sys

import moesim


def main(trace, hw="rtx3090-pcie3"):
    t = moesim.Trace(trace)
    s = moesim.stats(trace)
    print(f"{t!r}: prefill {int(t.prefill.sum())} tokens; gini {s['gini']:.3f}, "
          f"top-1 reuse {100 * s['reuse_top1']:.1f}%")
    print(f"{'policy':<8} {'budget GB':>9} {'hit rate':>9} {'tokens/s':>9}")
    for policy in ("lru", "oracle"):
        for budget in (2.5, 3, 4, 6):
            try:
                r = moesim.sim(trace, hw=hw, policy=policy, memory__budget_gb=budget,
                               expert__precision="int4")
            except moesim.MoesimError as e:  # e.g. a budget below the non-expert weights
                print(f"{policy:<8} {budget:>9} {'-':>9} {'-':>9}  ({e})")
                continue
            print(f"{policy:<8} {budget:>9} {100 * r['hit_rate']:>8.1f}% "
                  f"{r['tokens_per_s']:>9.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
