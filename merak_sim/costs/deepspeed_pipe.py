"""How DeepSpeed's ``PipelineEngine`` (the engine of Megatron-DeepSpeed, which measured
the vTrain runs) moves activations between pipeline stages: a cost model of that engine.

Evidence (what the runs did, not a fit):

- vTrain's measured data "are collected using Megatron-DeepSpeed" (the README of the
  data folder of VIA-Research/vTrain). Megatron-DeepSpeed's ``pretrain_gpt.py`` builds
  ``GPTModelPipe`` (a DeepSpeed ``PipelineModule``) whenever DeepSpeed runs without
  ``--no-pipeline-parallel``, so DeepSpeed's ``PipelineEngine`` runs the 1F1B schedule
  (its ``TrainSchedule``), not Megatron-LM's own point-to-point code. The causal
  attention mask is precomputed once and never sent between stages.
- The engine's sends are synchronous: DeepSpeed's ``deepspeed.runtime.pipe.p2p`` refuses
  ``async_op`` and calls ``torch.distributed.send`` / ``recv``, so each rank's compute
  stream waits for the transfer (vTrain's own simulator likewise charges every
  pipeline transfer to the sender's compute stream).
- Every step of a stage opens with its exchange with one neighbour: a forward step
  sends the previous micro-batch's input gradient back and receives this one's input
  (SendGrad, RecvActivation); a backward step receives the output gradient and sends
  the last forward's output (RecvGrad, SendActivation). In the 1F1B steady state the
  two neighbours meet at each exchange, so one gradient and one activation transfer,
  one after the other, stand on both ranks' critical path.
- With tensor parallelism (model-parallel size > 1) the engine partitions activations
  and gradients (``is_pipe_partitioned`` / ``is_grad_partitioned``): each GPU of the
  TP group sends 1/tp of the tensor, and ``PartitionedTensor.full()`` rebuilds the
  whole tensor with an all-gather over the TP group: once for the received input
  before the forward, twice before the backward (the stage's own output, freed after
  it was sent, and the received gradient). Each ``full()`` also fills a zeroed buffer
  and returns a clone of it: three bytes moved in memory per byte of the tensor.

Pricing (:func:`exchange_seconds`), per micro-batch and stage g of a table: the
forward waits for the exchange with stage g-1 plus one ``full()`` (g > 0), the
backward for the exchange with stage g+1 plus two ``full()`` (g below the last); an
exchange is two transfers of 1/tp of the stage output (the whole output at tp = 1)
between the two stages' TP groups. Transfers, all-gathers and copies are priced by the
same measured NCCL figures and memory model as everything else; nothing here is
fitted, and every term is bounded by those measurements. :func:`with_exchange` adds
the waits to the stages' forward and backward times and sets the separate transfer
time to zero (the transfer is already inside both ranks' compute).

What this pricing was checked against (the lock-step schedule, memory, cross-node sends,
the data-parallel all-reduce) is recorded with the studies that did it (research/ in the
repository, not installed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.comm import group_ranks
from merak_sim.costs.efficiency import Efficiency
from merak_sim.sim.from_config import stage_rank

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.analytic import AnalyticCostModel
    from merak_sim.hardware import Cluster
    from merak_sim.model import ModelSpec
    from merak_sim.partition import PartitionLike

__all__ = ["FULL_COPY_BYTES", "DeepSpeedPipelineModel", "StageExchange", "exchange_seconds",
           "with_exchange", "without_exchange"]

#: Bytes moved in memory per byte of tensor by one ``PartitionedTensor.full()``: a
#: zero-filled buffer written, then read and written again by its clone.
FULL_COPY_BYTES = 3.0


@dataclass(frozen=True, slots=True)
class StageExchange:
    """Seconds one micro-batch's forward and backward on a stage wait for DeepSpeed's
    pipeline exchange (module docstring)."""

    forward_s: float
    backward_s: float


def exchange_seconds(table: CostTable, cluster: Cluster, config: ParallelConfig,
                     comm: Callable[..., float], efficiency: Efficiency
                     ) -> tuple[StageExchange, ...]:
    """Per model stage of ``table``, the forward and backward waits of DeepSpeed's
    synchronous, TP-partitioned pipeline exchange (module docstring); ``comm`` prices
    collectives as the table's cost model does."""
    st = table.stages
    n = len(st)
    tp = config.tp
    tp_ranks = [group_ranks("tp", config, stage_rank(config, g)) for g in range(n)]

    def exchange(g: int) -> float:  # boundary between stages g and g + 1
        a, b = tp_ranks[g][0], tp_ranks[g + 1][0]
        if a == b:
            return 0.0
        return 2.0 * comm("p2p", st[g].p2p_bytes / tp, (a, b), cluster)

    def full(nbytes: float, g: int) -> float:  # one PartitionedTensor.full() on stage g
        ranks = tp_ranks[g]
        if len(ranks) == 1:
            return 0.0
        return (comm("all-gather", nbytes, ranks, cluster)
                + efficiency.mem_time(FULL_COPY_BYTES * nbytes, cluster.gpu.mem_bandwidth_Bps,
                                      2))

    out = []
    for g in range(n):
        # Forward: the exchange with g - 1, then full() of the received input.
        fwd = 0.0 if g == 0 else exchange(g - 1) + full(st[g - 1].p2p_bytes, g)
        # Backward: the exchange with g + 1, then full() of the own output and of the
        # received gradient (both the size of the output).
        bwd = 0.0 if g == n - 1 else exchange(g) + 2.0 * full(st[g].p2p_bytes, g)
        out.append(StageExchange(fwd, bwd))
    return tuple(out)


def _shift(s: StageCost, ex: StageExchange, sign: float) -> StageCost:
    return replace(s, forward_s=s.forward_s + sign * ex.forward_s,
                   backward_s=s.backward_s + sign * ex.backward_s,
                   backward_input_s=s.backward_input_s + sign * ex.backward_s)


def _shifted(table: CostTable, exchange: tuple[StageExchange, ...], sign: float
             ) -> CostTable:
    # A table shares one StageCost among the stages that cost the same; shift each
    # distinct (stage, exchange) pair once.
    done: dict[tuple[int, StageExchange], StageCost] = {}
    out = []
    for s, ex in zip(table.stages, exchange, strict=True):
        key = (id(s), ex)
        if key not in done:
            done[key] = replace(_shift(s, ex, sign), send_activation_s=0.0)
        out.append(done[key])
    return replace(table, stages=tuple(out))


def with_exchange(table: CostTable, exchange: tuple[StageExchange, ...]) -> CostTable:
    """``table`` with each stage's forward and backward (and backward-input) times
    including its exchange waits and no separate transfer time (module docstring)."""
    return _shifted(table, exchange, 1.0)


def without_exchange(table: CostTable, exchange: tuple[StageExchange, ...]) -> CostTable:
    """The inverse of :func:`with_exchange` on the times (transfers stay at zero):
    the table with no pipeline communication at all."""
    return _shifted(table, exchange, -1.0)


class DeepSpeedPipelineModel:
    """A cost model pricing pipeline communication as DeepSpeed's ``PipelineEngine``
    does it (module docstring): ``base``'s tables with :func:`with_exchange` applied,
    collectives priced by ``comm`` (the ``collectives`` ``base`` was built with)."""

    def __init__(self, base: AnalyticCostModel, comm: Callable[..., float]) -> None:
        self.base = base
        self.comm = comm

    def exchange(self, table: CostTable, cluster: Cluster, config: ParallelConfig
                 ) -> tuple[StageExchange, ...]:
        """The exchange waits of ``base``'s ``table`` (:func:`exchange_seconds`)."""
        return exchange_seconds(table, cluster, config, self.comm,
                                self.base.efficiency_for(cluster))

    def cost_table(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   partition: PartitionLike | None = None) -> CostTable:
        """``base``'s table with the exchange inside the stages' compute times."""
        t = self.base.cost_table(model, cluster, config, partition)
        return with_exchange(t, self.exchange(t, cluster, config))

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Seconds of one collective, as the exchange prices it."""
        return self.comm(collective, nbytes, ranks, cluster)
