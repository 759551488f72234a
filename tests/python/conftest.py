# The Python package's tests compare it with the `planner` program of the same build: the program's
# path is $SHARDPLAN_PLANNER, else build/release/planner/planner.
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def planner_path() -> Path:
    return Path(os.environ.get("SHARDPLAN_PLANNER", ROOT / "build/release/planner/planner"))


def cli_text(*args: str) -> str:
    """stdout of the planner program; its failure fails the test."""
    done = subprocess.run([str(planner_path()), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def cli_json(*args: str):
    return json.loads(cli_text(*args))


def flags(**options) -> list:
    """The command line's flags for keyword options, as the package spells them."""
    out = []
    for name, value in options.items():
        if value is False:  # a switch left off
            continue
        out.append("--" + name.replace("_", "-"))
        if value is not True:  # a switch takes no value
            out.append(str(value))
    return out


def without_timing(recommendation: dict) -> dict:
    """A recommendation without the search's wall time (the one field two runs differ in)."""
    r = json.loads(json.dumps(recommendation))
    del r["search"]["seconds"]
    return r


def pytest_configure(config):
    if not planner_path().exists():
        raise pytest.UsageError(
            f"no planner program at {planner_path()} (build the release preset, or set SHARDPLAN_PLANNER)")
