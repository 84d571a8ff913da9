"""Python call overhead: wall time per moesim.sim (in-process over libmoesim) against
`moesim sim --json` as a subprocess (what a notebook did before), on the same small trace, and
moesim.stats against `moesim trace stats --json`. Prints median and min over N calls each.

    MOESIM_LIB=build/libmoesim.so PYTHONPATH=python build/python-venv/bin/python \
        bench/python_call_overhead.py build/moesim [N]"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import moesim


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main(cli, n=30):
    n = int(n)
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "t.h5")
        subprocess.run([cli, "trace", "synth", "--model", "olmoe-1b-7b", "--requests", "2",
                        "--prompt-len", "8", "--gen-len", "24", "--seed", "1", "-o", trace],
                       check=True, capture_output=True)
        sets = {"memory.budget_gb": 2.5, "expert.precision": "int4"}
        args = [cli, "sim", "--trace", trace, "--hw", "rtx3090-pcie3", "--policy", "lru",
                "--json"] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        py = lambda: moesim.sim(trace, hw="rtx3090-pcie3", policy="lru", settings=sets)
        sp = lambda: json.loads(subprocess.run(args, check=True, capture_output=True).stdout)
        assert py() == sp()
        st_py = lambda: moesim.stats(trace)
        st_sp = lambda: json.loads(subprocess.run([cli, "trace", "stats", trace, "--json"],
                                                  check=True, capture_output=True).stdout)
        print(f"trace: {moesim.trace_info(trace)['tokens']} tokens, olmoe-1b-7b, lru; "
              f"{n} calls each (median / min ms)")
        for name, fn in (("moesim.sim (in-process)", py), ("moesim sim --json (subprocess)", sp),
                         ("moesim.stats (in-process)", st_py),
                         ("moesim trace stats --json (subprocess)", st_sp)):
            med, lo = timed(fn, n)
            print(f"  {name:<40} {med:8.2f} {lo:8.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
