"""The discrete-event simulator: SimPy engine, exact fast evaluator, results.

Names are imported lazily so ``import merak_sim.sim`` stays cheap (SimPy and pandas
load only when a simulation or a table needs them).
"""

from __future__ import annotations

from merak_sim.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(
    __name__, globals(), {k: f"{__name__}.{m}" for k, m in _EXPORTS.items()})
