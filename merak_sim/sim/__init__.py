"""The discrete-event simulator: SimPy engine, exact fast evaluator, results.

Names are imported lazily so ``import merak_sim.sim`` stays cheap (SimPy and pandas
load only when a simulation or a table needs them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "simulate": "api",
    "SimulationError": "api",
    "evaluator_trace": "api",
    "SimResult": "result",
    "RankBreakdown": "result",
    "OutOfMemory": "result",
    "Compiled": "program",
    "compile_program": "program",
    "DependencyGraph": "evaluator",
    "Evaluation": "evaluator",
    "plan": "evaluator",
    "evaluate": "evaluator",
    "EngineOptions": "gpu",
    "EventLog": "engine",
    "run_engine": "engine",
    "Topology": "entities",
    "HBM": "entities",
    "Fabric": "entities",
    "topology_from_cluster": "entities",
    "uniform_table": "toy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'merak_sim.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
