"""Shared test helpers."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("name")``: the script ``benchmarks/name.py`` imported as a module
    (the scripts are not a package; they import the installed package only)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[name] = mod
        return loaded[name]
    return load


@pytest.fixture(scope="session")
def two_rank_scenarios(tmp_path_factory):
    """The two-rank scenarios of support.workers, run in turn by one launch of 2 gloo
    ranks (a process start per rank for all of them, not per test): ``name ->
    (exit codes, per-rank results, the scenario's argument)``."""
    from support.workers import launch_scenarios

    out = tmp_path_factory.mktemp("two-rank-scenarios")
    jobs = [("scenario_bad_input", {}), ("scenario_tp_replicas", {}),
            ("scenario_tp_dropout", {}), ("scenario_events", {"trace": str(out / "t.json")}),
            ("scenario_hooks", {}),
            ("scenario_resume", {"dir": str(out / "resume"), "layout": {"pp": 2}})]
    codes, res = launch_scenarios(2, jobs, str(out))
    return {name: (codes, res[name], arg) for name, arg in jobs}


@pytest.fixture(scope="session")
def equivalence(tmp_path_factory):
    """``equivalence(world, cases)``: every rank's results of ``cases`` from the one
    launch of ``world`` ranks the session shares (support.shared_launch)."""
    from support.shared_launch import Launches

    return Launches(lambda world: tmp_path_factory.mktemp(f"equivalence-{world}")).results
