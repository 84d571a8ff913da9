"""moesim's Python API against the CLI on the same inputs: sim, stats and sweep give what
`moesim sim --json`, `moesim trace stats --json` and `moesim sweep` give (equal after parsing),
Trace's arrays equal `moesim trace export`'s CSV, and errors carry the CLI's message."""
import csv
import os

import numpy as np
import pandas as pd
import pytest

import moesim
from conftest import HW, SETS, cli, cli_json


def sets_args(sets):
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


@pytest.mark.parametrize("policy,extra", [
    ("lru", {}),
    ("lru", {"lru.scope": "global", "batch.size": 2}),
    ("dymoe", {"dymoe.hi": "int4"}),
    ("oracle", {}),
])
def test_sim_equals_the_cli_json(trace, policy, extra):
    sets = {**SETS, **extra}
    got = moesim.sim(trace, hw=HW, policy=policy, settings=sets)
    want = cli_json("sim", "--trace", trace, "--hw", HW, "--policy", policy, *sets_args(sets))
    assert got == want


def test_sim_takes_settings_as_keyword_arguments(trace):
    a = moesim.sim(trace, hw=HW, policy="lru", memory__budget_gb=2.5, expert__precision="int4",
                   lru__scope="global")
    b = moesim.sim(trace, hw=HW, policy="lru", settings={**SETS, "lru.scope": "global"})
    assert a == b


def test_sim_runs_a_policy_plug_in_like_the_cli(trace):
    lib = os.environ["MOESIM_POLICY_PLUGIN"]
    got = moesim.sim(trace, hw=HW, policy_lib=lib, settings=SETS, fifo__second_chance=True)
    want = cli_json("sim", "--trace", trace, "--hw", HW, "--policy-lib", lib,
                    *sets_args({**SETS, "fifo.second_chance": "true"}))
    assert got == want and got["policy"] == "fifo"


def test_stats_equal_the_cli_json(trace):
    assert moesim.stats(trace) == cli_json("trace", "stats", trace)


def test_trace_arrays_equal_the_cli_export(trace, work):
    t = moesim.Trace(trace)
    info = cli_json("trace", "info", trace)
    n, layers, k = t.shape
    assert (n, layers, k) == (info["tokens"], info["layers"], info["top_k"])
    assert int(t.prefill.sum()) == info["prefill_tokens"]
    assert t.lookahead_ids.shape == (n, layers, info["lookahead_depth"], info["lookahead_k"])
    assert t.lookahead_scores.dtype == np.float32
    out = work / "export.csv"
    cli("trace", "export", trace, "--format", "csv", "-o", out)
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == n * layers
    ids = np.array([[int(r[f"expert_{j}"]) for j in range(k)] for r in rows]).reshape(n, layers, k)
    gates = np.array([[float(r[f"gate_{j}"]) for j in range(k)] for r in rows],
                     dtype=np.float32).reshape(n, layers, k)
    assert np.array_equal(t.expert_ids, ids)
    assert np.array_equal(t.gates, gates)  # %.9g in the CSV: float32 round-trips exactly
    first = rows[::layers]
    assert np.array_equal(t.request_id, [int(r["request_id"]) for r in first])
    assert np.array_equal(t.position, [int(r["position"]) for r in first])
    assert np.array_equal(t.phase, [r["phase"] == "decode" for r in first])


def test_sweep_equals_the_cli_csv(trace, work):
    exp = work / "exp.ini"
    exp.write_text(f"""[experiment]
name = py-sweep
seed = 1
[fixed]
model = olmoe-1b-7b
hw = {HW}
trace = {trace}
expert.precision = int4
[axes]
policy = lru, lfu
memory.budget_gb = 2.5, 4
""")
    got = moesim.sweep(exp, csv=work / "py.csv")
    cli("sweep", exp, "-o", work / "cli.csv")
    want = pd.read_csv(work / "cli.csv")
    assert list(got.columns) == list(want.columns)
    assert len(got) == 4 and (got["status"] == "ok").all()
    key = "config_hash"
    pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  want.sort_values(key).reset_index(drop=True))


def test_errors_carry_the_cli_message(trace, work):
    bad = work / "absent.h5"
    p = cli("sim", "--trace", bad, "--hw", HW, "--policy", "lru", check=False)
    assert p.returncode == 2
    with pytest.raises(moesim.MoesimError) as e:
        moesim.sim(bad, hw=HW, policy="lru")
    assert p.stderr.strip() == f"moesim: {e.value}"
    with pytest.raises(moesim.MoesimError, match="nope"):
        moesim.sim(trace, hw=HW, policy="lru", memory__nope=1)
    with pytest.raises(moesim.MoesimError, match="unknown policy"):
        moesim.sim(trace, hw=HW, policy="no-such-policy")
    with pytest.raises(moesim.MoesimError):
        moesim.stats(bad)


def test_config_path_resolves_names_as_the_cli_does(work):
    path = moesim.config_path("models", "olmoe-1b-7b")
    assert path.endswith("models/olmoe-1b-7b.ini") and os.path.exists(path)
    assert moesim.config_path("hw", path.replace("models/olmoe-1b-7b", "hw/" + HW)).endswith(
        f"hw/{HW}.ini")
    with pytest.raises(moesim.MoesimError, match="nope") as e:
        moesim.config_path("models", "nope")
    assert e.value.status == 1


def test_a_corrupt_trace_is_refused_with_the_cli_message(work):
    bad = work / "corrupt.h5"
    bad.write_bytes(b"not an HDF5 file")
    p = cli("trace", "info", bad, check=False)
    assert p.returncode == 2
    with pytest.raises(moesim.MoesimError) as e:
        moesim.Trace(bad)
    assert p.stderr.strip() == f"moesim: {e.value}"


def test_arguments_c_cannot_take_are_refused_naming_them(trace, work):
    with pytest.raises(moesim.MoesimError, match="trace, hw and policy are required"):
        moesim.sim(trace, hw=HW)  # no policy and no plug-in: an error, not a crash
    with pytest.raises(ValueError, match="trace: embedded null byte"):
        moesim.sim(str(trace) + "\0x", hw=HW, policy="lru")
    with pytest.raises(TypeError, match="trace: expected a str or a path, got int"):
        moesim.sim(5, hw=HW, policy="lru")
    with pytest.raises(TypeError, match="setting 'memory.budget_gb': .* got NoneType"):
        moesim.sim(trace, hw=HW, policy="lru", memory__budget_gb=None)
    with pytest.raises(ValueError, match="setting 'lru.scope': embedded null byte"):
        moesim.sim(trace, hw=HW, policy="lru", lru__scope="global\0junk")
    # NumPy values are their Python values
    assert moesim.sim(trace, hw=HW, policy="lru", settings=SETS,
                      sim__part_overlap=np.bool_(False)) \
        == moesim.sim(trace, hw=HW, policy="lru", settings=SETS, sim__part_overlap=False)
    for jobs in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="sweep: jobs: expected an integer >= 1"):
            moesim.sweep(work / "none.ini", jobs=jobs)
    with pytest.raises(moesim.MoesimError, match="sweep: jobs: expected 0..1024"):
        moesim.sweep(work / "none.ini", jobs=2000)


def test_write_trace_checks_shapes_and_values_before_the_writer_reads_them(trace, work):
    from moesim.record_hf import write_trace

    t = moesim.Trace(trace)
    model_ini = open(moesim.config_path("models", t.attrs["model"])).read()
    good = dict(request_id=t.request_id, position=t.position, phase=t.phase,
                expert_ids=t.expert_ids, gate_weights=t.gates)
    out = work / "written.h5"
    write_trace(out, model_ini, "test", good)
    assert np.array_equal(moesim.Trace(out).expert_ids, t.expert_ids)
    n = len(t.request_id)
    bad = [({"expert_ids": t.expert_ids[:1]}, ValueError, r"expert_ids: shape \[1, "),
           ({"request_id": np.zeros(n + 5, np.uint32)}, ValueError, r"position: shape"),
           ({"expert_ids": t.expert_ids.astype(np.int64) + 65536}, ValueError,
            "expert_ids: value .* outside 0..65535"),
           ({"expert_ids": t.expert_ids + 0.5}, TypeError, "expert_ids: expected integers"),
           ({"request_id": np.uint32(0)}, ValueError, r"request_id: expected 1 dimensions"),
           ({"gates": t.gates}, ValueError, "unknown array 'gates'")]
    for change, error, says in bad:
        with pytest.raises(error, match=says):
            write_trace(work / "bad.h5", model_ini, "test", {**good, **change})
        assert not (work / "bad.h5").exists()
