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

from merak_exec.mesh import ExecError, build_mesh, init_distributed
from merak_exec.parallel import ParallelModel, parallelize
from merak_exec.result import RunResult
from merak_exec.trainer import Trainer, TrainingArguments, init
from merak_sim.config import ParallelConfig

__version__ = "0.1.0"
__all__ = ["ExecError", "ParallelConfig", "ParallelModel", "RunResult", "Trainer",
           "TrainingArguments", "build_mesh", "init", "init_distributed", "parallelize"]
