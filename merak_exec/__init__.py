"""merak_exec: the real torch.distributed backend.

It executes the same :class:`merak_sim.schedule.ir.Schedule` objects the simulator
evaluates (gloo on CPU, NCCL on CUDA) and records measured timelines in the
simulator's events schema. Few-line use::

    import merak_exec
    merak_exec.init(dp=2, tp=2, pp=2)
    merak_exec.Trainer(model=model, args=merak_exec.TrainingArguments(...),
                       train_dataset=ds).train()

or ``merak_exec.parallelize(model, ParallelConfig(...), seq_len=...)`` for one's own
loop (``.train_step(ids, labels)``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names and the module that defines each: imported on first use, so that
# ``merak-exec`` can say in one line that torch is missing instead of failing here.
_EXPORTS = {
    "ExecError": "merak_exec.mesh", "build_mesh": "merak_exec.mesh",
    "init_distributed": "merak_exec.mesh", "ParallelModel": "merak_exec.parallel",
    "parallelize": "merak_exec.parallel", "RunResult": "merak_exec.result",
    "Trainer": "merak_exec.trainer", "TrainingArguments": "merak_exec.trainer",
    "init": "merak_exec.trainer", "ParallelConfig": "merak_sim.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'merak_exec' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
