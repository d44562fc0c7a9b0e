"""merak_sim: a torch-free simulator, planner and schedule toolkit for 3D-parallel
transformer training (reproducing and extending Merak, Lai et al., TPDS 2023).

Importing this package never imports torch. The names below are loaded on first use
(``merak_sim.simulate`` imports the simulator and SimPy only then), so
``import merak_sim`` stays cheap::

    import merak_sim
    res = merak_sim.simulate("gpt-1.5b", "paper-3090", dp=16, tp=1, pp=4,
                             micro_batch_size=1, global_batch_size=128,
                             schedule="1f1b", recompute="full")
    plan = merak_sim.search("gpt-1.5b", "paper-3090", 128)
"""

from __future__ import annotations

from merak_sim.lazy import lazy_exports

__version__ = "0.1.0"

# Public names and the module that defines each.
_EXPORTS = {
    "simulate": "merak_sim.sim", "SimResult": "merak_sim.sim",
    "search": "merak_sim.planner", "PlanResult": "merak_sim.planner",
    "SearchSpace": "merak_sim.planner", "Plan": "merak_sim.plan",
    "ParallelConfig": "merak_sim.config", "ModelSpec": "merak_sim.model",
    "get_model": "merak_sim.model", "list_models": "merak_sim.model",
    "Cluster": "merak_sim.hardware", "get_cluster": "merak_sim.hardware",
    "list_clusters": "merak_sim.hardware", "generate": "merak_sim.schedule",
    "replay": "merak_sim.schedule", "validate": "merak_sim.schedule",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
