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

from merak_sim.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
