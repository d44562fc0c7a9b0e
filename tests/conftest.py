"""Shared test helpers."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: Session fixtures that make one multi-process launch for every test asking for them.
SHARED_LAUNCHES = {"equivalence", "two_rank_scenarios"}
#: One xdist work unit, run one module after another: every module whose tests ask for
#: one of them (checked at collection), so each launch is made once; the fault tests,
#: whose ranks must end within a deadline, and the end-to-end validation, whose
#: profile must not be timed beside four busy ranks, so never beside the launches.
SHARED_LAUNCH_MODULES = {"test_exec_fsdp", "test_exec_measure", "test_exec_parallel",
                         "test_exec_scenarios", "test_exec_sp_selective", "test_exec_v_shape",
                         "test_exec_zero", "test_runtime_hooks", "test_tp_replicas",
                         "test_exec_meta_tie",
                         "test_faults", "test_validation_e2e"}
#: Modules whose tests share nothing (each starts its own process): xdist may spread
#: them over its workers one test at a time.
INDEPENDENT = {"test_notebooks"}
#: Modules whose tests start processes (ranks, command lines, notebooks) or search at
#: length: marked ``slow``, left out by ``make test-fast`` (the edit loop's tier);
#: ``make test`` runs everything.
SLOW_MODULES = SHARED_LAUNCH_MODULES | INDEPENDENT | {
    "test_checkpoint_reshard", "test_trainer_data", "test_exec_cli_data", "test_exec_env",
    "test_exec_inputs", "test_exec_inputs_launch", "test_exec_precision", "test_exec_stages",
    "test_fault_nonfinite", "test_plan_exec", "test_dispatch_smoke", "test_dispatch_slurm",
    "test_h200_validation", "test_planner_fast", "test_trainer_hf", "test_exec_model",
    "test_output_paths", "test_reproduce", "test_plan_dispatch", "test_exec_data",
    "test_fault_lines", "test_posting", "test_torch_orders", "test_cpu_validation_suite",
    "test_speedup_repeats", "test_calibrate"}
#: The longest work units, started first so that no worker is left with one at the end.
LONGEST_FIRST = ("shared-launches", "test_notebooks", "test_planner_fast",
                 "test_h200_validation", "test_reproduce")


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs as a whole: a test module (its module-scoped fixtures
    are then built once), every shared-launch module together, or one test of an
    independent module."""
    module = nodeid.split("::", 1)[0]
    stem = Path(module).stem
    if stem in SHARED_LAUNCH_MODULES:
        return "shared-launches"
    return nodeid if stem in INDEPENDENT else module


@pytest.hookimpl(optionalhook=True)  # a plain pytest, without xdist, knows no such hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` (``make test``): xdist's scope scheduling with
    :func:`work_unit` scopes; any other mode is xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker: refuse a shared-launch user missing from
    SHARED_LAUNCH_MODULES, and put the longest units first (the scheduler hands units
    out in collection order with ``--no-loadscope-reorder``). A plain run keeps
    pytest's order untouched. Every item of a :data:`SLOW_MODULES` module is marked
    ``slow``."""
    for it in items:
        if it.path.stem in SLOW_MODULES:
            it.add_marker(pytest.mark.slow)
    if not hasattr(config, "workerinput"):
        return
    users = {it.path.stem for it in items if SHARED_LAUNCHES & set(it.fixturenames)}
    if users - SHARED_LAUNCH_MODULES:
        raise pytest.UsageError(f"add {sorted(users - SHARED_LAUNCH_MODULES)} to "
                                "conftest.SHARED_LAUNCH_MODULES")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(it) -> int:
        unit = work_unit(it.nodeid)
        return rank.get(unit if unit == "shared-launches" else it.path.stem, len(rank))
    items.sort(key=key)  # stable: pytest's order within each rank


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
