"""Fixtures of the Python package's tests: the moesim CLI the results are compared with
($MOESIM_BIN), small synthesized traces and a helper that runs the CLI."""
import json
import os
import subprocess

import pytest

HW = "rtx3090-pcie3"
SETS = {"memory.budget_gb": 2.5, "expert.precision": "int4"}


def cli(*args, check=True):
    """Runs `moesim ARGS`; returns the CompletedProcess (text)."""
    p = subprocess.run([os.environ["MOESIM_BIN"], *map(str, args)], capture_output=True,
                       text=True)
    if check and p.returncode:
        raise AssertionError(f"moesim {' '.join(map(str, args))}: {p.stderr}")
    return p


def cli_json(*args):
    return json.loads(cli(*args, "--json").stdout)


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("moesim")


@pytest.fixture(scope="session")
def trace(work):
    """An OLMoE trace of 3 requests with look-ahead predictions (D = 2)."""
    path = work / "olmoe.h5"
    cli("trace", "synth", "--model", "olmoe-1b-7b", "--requests", 3, "--prompt-len", "4:12",
        "--gen-len", 20, "--lookahead", 2, "--seed", 7, "-o", path)
    return path
