"""How measured runs are priced while a profile is fitted to them: the software stack
that ran them.

The fit moves only the GPU's efficiency curve; everything the stack does differently
is priced as the stack does it, so that the fitted curve describes the GPU, not the
stack (a profile fitted under one stack serves every other):

- ``default``: the simulator's own pricing (the default kernel charges; pipeline sends
  as :class:`~merak_sim.costs.calibrated.CalibratedCostModel` picks them:
  scatter-gather where the cluster has a measured NCCL table, full elsewhere).
- ``megatron``: Megatron-LM (:data:`merak_sim.costs.framework.MEGATRON`: the fused
  softmax only where Megatron's ``is_kernel_available`` allows it, the fp32
  vocab-parallel cross entropy) with Megatron's scatter-gather pipeline sends.
- ``megatron-deepspeed``: Megatron's kernels with DeepSpeed's ``PipelineEngine``
  moving the activations (:mod:`merak_sim.costs.deepspeed_pipe`: synchronous,
  TP-partitioned sends; the vTrain runs' stack).

Collectives come from the cluster's measured NCCL table where it has one
(:func:`merak_sim.costs.nccl.nccl_table_for`), else from the alpha-beta links.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import collective_time, measured_collectives
from merak_sim.costs.deepspeed_pipe import DeepSpeedPipelineModel
from merak_sim.costs.framework import DEFAULT_FRAMEWORK, MEGATRON
from merak_sim.costs.nccl import nccl_table_for

if TYPE_CHECKING:
    from merak_sim.costs.efficiency import Efficiency
    from merak_sim.costs.kernels import KernelEfficiency
    from merak_sim.costs.protocol import CostModel
    from merak_sim.hardware import Cluster

__all__ = ["STACKS", "check_stack", "stack_cost_model"]

#: The stacks a run can name (module docstring).
STACKS = ("default", "megatron", "megatron-deepspeed")


def check_stack(stack: str) -> None:
    """ValueError (one line, naming the choices) unless ``stack`` is one of
    :data:`STACKS`."""
    if stack not in STACKS:
        raise ValueError(f"unknown stack {stack!r}; choose one of: {', '.join(STACKS)}")


def stack_cost_model(stack: str, cluster: Cluster, efficiency: Efficiency | None,
                     kernels: KernelEfficiency | None = None) -> CostModel:
    """The cost model that prices a run of ``stack`` on ``cluster`` with ``efficiency``
    (module docstring)."""
    check_stack(stack)
    table = nccl_table_for(cluster.name)
    measured = None if table is None else measured_collectives(table)
    if stack == "megatron-deepspeed":
        base = AnalyticCostModel(efficiency=efficiency, collectives=measured,
                                 kernels=kernels, framework=MEGATRON)
        return DeepSpeedPipelineModel(base, measured or collective_time)
    if stack == "megatron":
        return AnalyticCostModel(efficiency=efficiency, collectives=measured, kernels=kernels,
                                 pipeline_send="scatter-gather", framework=MEGATRON)
    send = "full" if table is None else "scatter-gather"
    return AnalyticCostModel(efficiency=efficiency, collectives=measured, kernels=kernels,
                             pipeline_send=send, framework=DEFAULT_FRAMEWORK)
