"""merak_sim: a torch-free simulator, planner and schedule toolkit for 3D-parallel
transformer training (reproducing and extending Merak, Lai et al., TPDS 2023).

Importing this package never imports torch.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """Lazy top-level exports: ``merak_sim.simulate`` loads the simulator (and SimPy)
    only when first used, so ``import merak_sim`` stays cheap."""
    if name in ("simulate", "SimResult"):
        from merak_sim import sim

        return getattr(sim, name)
    raise AttributeError(f"module 'merak_sim' has no attribute {name!r}")
