"""moesim from Python: simulate Mixture-of-Experts offloading policies on router traces.

    import moesim
    r = moesim.sim("t.h5", hw="rtx3090-pcie3", policy="lru", memory__budget_gb=16)
    r["tokens_per_s"], r["hit_rate"]          # the dict `moesim sim --json` prints
    moesim.stats("t.h5")["gini"]              # `moesim trace stats --json`
    df = moesim.sweep("experiments/x.ini")    # the results CSV as a pandas.DataFrame
    t = moesim.Trace("t.h5"); t.expert_ids    # NumPy arrays of the trace (traces/FORMAT.md)

Settings are --set's "section.key=value": pass them as keyword arguments with "__" for the dot
(memory__budget_gb=16, lru__scope="global") or as a dict (settings={"memory.budget_gb": 16}).
Errors raise MoesimError with moesim's one-line message. Everything runs in-process over
libmoesim (include/moesim.h); see python/README.md."""
import ctypes
import json
import os
import tempfile

from ._lib import MoesimError, call, enc, lib
from .trace import Trace

__all__ = ["sim", "stats", "sweep", "trace_info", "config_path", "Trace", "MoesimError",
           "version", "record_hf"]


def version():
    """moesim's version string (of the loaded libmoesim)."""
    return lib().moesim_version().decode()


def _setting_text(key, value):
    if hasattr(value, "tolist"):  # a NumPy scalar or array: its Python value
        value = value.tolist()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_setting_text(key, v) for v in value)
    if not isinstance(value, (str, int, float)):
        raise TypeError(f"setting '{key}': expected a str, number, bool or list, got "
                        f"{type(value).__name__}")
    text = str(value)
    if "\0" in text:
        raise ValueError(f"setting '{key}': embedded null byte in {text!r}")
    return text


def _settings(settings, kwargs):
    merged = dict(settings or {})
    for key, value in kwargs.items():
        merged[key.replace("__", ".")] = value
    out = []
    for key, value in merged.items():
        if not isinstance(key, str):
            raise TypeError(f"settings: key {key!r}: expected a str (section.key)")
        if "." not in key:
            raise MoesimError(f"setting '{key}': expected section.key (or section__key)")
        out.append(f"{key}={_setting_text(key, value)}")
    return out


def sim(trace, hw, policy=None, model=None, policy_lib=None, settings=None, **kwargs):
    """One simulator run; returns the dict `moesim sim --json` prints for the same inputs.

    trace: path of a trace (HDF5); hw: hardware profile name or path; policy: policy name
    (may be None with policy_lib: the plug-in's); model: model geometry name or path (None: the
    trace's); policy_lib: a policy plug-in FILE.so (policies/WRITING.md); settings and keyword
    arguments: --set settings and policy knobs (section__key=value)."""
    items = _settings(settings, kwargs)
    arr = (ctypes.c_char_p * max(len(items), 1))(*[s.encode() for s in items])
    text = call(lib().moesim_sim, enc(trace, "trace"), enc(hw, "hw"), enc(policy, "policy"),
                enc(model, "model"), enc(policy_lib, "policy_lib"), arr, len(items))
    return json.loads(text)


def stats(trace):
    """The trace's statistics: the dict `moesim trace stats TRACE --json` prints."""
    return json.loads(call(lib().moesim_trace_stats, enc(trace, "trace")))


def trace_info(trace):
    """Reads and validates the trace; returns what it holds (model, tokens, requests, layers,
    experts, top_k, lookahead_depth, ...). Raises MoesimError for an invalid trace."""
    return json.loads(call(lib().moesim_trace_open, enc(trace, "trace")))


def config_path(kind, name=None):
    """Loads and checks a model ("models"), hardware profile ("hw") or quant table ("quant")
    by name or path; returns the file it resolved to."""
    return call(lib().moesim_config_load, enc(kind, "kind"), enc(name, "name"))


def sweep(experiment, csv=None, jobs=1):
    """Runs an experiment file (experiments/README.md) and returns its results CSV as a
    pandas.DataFrame (the CSV's columns). csv: the results file to create or resume (None: a
    temporary file). Its traces must exist ([traces] recipes are made by `moesim sweep`)."""
    import pandas as pd

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"sweep: jobs: expected an integer >= 1, got {jobs!r}")
    jobs = min(jobs, 2**32 - 1)  # an unsigned int: larger is refused as too many, not wrapped
    if csv is not None:
        call(lib().moesim_sweep, enc(experiment, "experiment"), enc(csv, "csv"), jobs)
        return pd.read_csv(csv)
    with tempfile.TemporaryDirectory(prefix="moesim-sweep-") as d:
        path = os.path.join(d, "results.csv")
        call(lib().moesim_sweep, enc(experiment, "experiment"), enc(path), jobs)
        return pd.read_csv(path)


def __getattr__(name):
    # moesim.record_hf, the Hugging Face recorder: a callable module (record_hf.py), imported on
    # first use so that `python -m moesim.record_hf` runs it unimported and torch loads only
    # when it is called
    if name == "record_hf":
        import importlib
        return importlib.import_module(".record_hf", __name__)
    raise AttributeError(f"module 'moesim' has no attribute '{name}'")
