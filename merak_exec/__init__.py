"""merak_exec: the real torch.distributed backend.

It executes the same :class:`merak_sim.schedule.ir.Schedule` objects the simulator
evaluates (gloo on CPU, NCCL on CUDA) and records measured timelines in the
simulator's events schema.
"""

__version__ = "0.1.0"
