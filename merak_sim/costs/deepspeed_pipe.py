"""How the vTrain runs' training engine moves activations between pipeline stages.

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

Checked against the multi-node bias and rejected (with the constants fitted before the
framework kernels below; 109 multi-node rows, -5.39 % mean signed then):

- The blocking pairing of DeepSpeed's lock-step ``TrainSchedule``
  (:mod:`merak_sim.experiments.vtrain_lockstep`): with two transfers per meeting it
  equals the evaluator on all 1,549 rows; counting the tensors that move makes rows
  0-1.3 % faster (multi-node mean signed -5.60 %), never slower.
- GPU memory near capacity: the modelled per-GPU peak (:func:`merak_sim.memory.
  peak_memory`, 16 bytes per parameter without ZeRO) runs 4.5-67 GB (so 80 GB A100s;
  3.6B at tp=1 dp=64 needs about 64 GB) and its correlation with the signed error is
  0.01; the 175B rows at 56-67 GB are within -1.8..+4.5 %, the 39.1B tp=2 pp=16 rows at
  27-34 GB 24-38 % too fast.
- Cross-node pipeline sends: they are 1.5-4 % of the predicted time; the tp=2 rows'
  16 % gap would need them 7x slower than vTrain's measured 91 GB/s per node (+-5 %)
  allows, and rows with more of it are less too fast (correlation +0.12).
- The data-parallel all-reduce: at pp = 1 (3.6B, 64 GPUs) every tp puts the same bytes
  through each node's adapters (139-155 ms modelled), yet the gap is 350 ms at tp=1
  (7.1 GB per GPU), 256-331 ms at tp=1 pp=2 (3.6 GB), 440-470 ms at tp=2 (3.6 GB),
  460-630 ms at tp=4 (1.8 GB) and -100..+60 ms at tp=8: it follows neither the bytes
  per GPU nor per node. At pp = 1 every row does the same work per GPU (global batch /
  dp samples, 1/tp of every layer), so a gap constant over the micro-batch count does
  not tell a per-iteration cost from a per-sample one.
- Per-GPU GEMM size: 175B at tp=2 (6,144 columns per GPU) is +1.8..+2.9 %, 39.1B at
  tp=2 (4,096) -16..-38 %; correlation of error with hidden / tp -0.14. Bubble share
  (pp - 1) / m: correlation 0.03.

With the framework kernels below (and the constants refitted) the multi-node mean
signed error is -6.27 %.

Framework kernels of the same stack (:data:`merak_sim.experiments.vtrain.VTRAIN_KERNELS`,
:mod:`merak_sim.costs.framework`, read from Megatron's source): the fused causal
softmax runs only where ``FusedScaleMaskSoftmax.is_kernel_available``
(``megatron/model/fused_softmax.py``) allows it, else the eager fp32
``forward_torch_softmax`` (37 bytes per score element in forward, 41 in backward, five
kernels each, against the 4 and 8 charged for the fused kernel): the 32 single-node
tp=8 micro-batch-1 rows (2 heads per GPU) and one multi-node tp=16 row (micro-batch 2
x 3 heads); and the loss is
the fp32 ``_VocabParallelCrossEntropy`` (``megatron/core/tensor_parallel/
cross_entropy.py``) on ``output.float()``: 38 bytes per logit in forward, 14 in
backward (six and two kernels), where 12 and 24 were charged. Both are adopted because
the framework's code does this, not for their effect on the held-out rows. Refitted on
the single-node rows: single-node MAPE 6.99 -> 6.35 % (tp=8 11.59 -> 5.33 %),
multi-node 7.12 -> 7.40 %, mean signed -5.39 -> -6.27 % (79 of 109 rows too fast
against 69), multi-node tp=2 16.78 -> 17.53 % (signed -16.10 -> -17.11 %).
Each alone, refitted likewise: the softmax rule single-node 6.63 % (tp=8 5.03 %),
multi-node 7.04 %, signed -5.30 %, with the fitted constants unchanged; the cross
entropy single-node 6.71 %, multi-node 7.48 %, signed -6.35 %, tp=2 17.53 %; it moves
gemm_dim_half from 50 to 28 and kernel_overhead_s to its 10 us bound (the constants
of both together).

Two further mechanisms, checked on the fit rows with the constants above and not
adopted (no refit; errors are evaluator predictions against the 1,440 single-node
rows, 6.35 % MAPE as fitted; ``python benchmarks/vtrain_consistency.py`` prints the
figures below):

- Per-instruction host work of the ``PipelineEngine``. The residual (measured minus
  predicted) of the tp=1 rows grows with the pipeline steps m + p - 1 by 1.3 ms per
  step at pp=2 (R^2 0.07) and 2.7 ms at pp=4 (R^2 0.51), but by -1.6 ms at pp=1, and
  by 0.8 / 1.2 ms (tp=2, pp=2 / 4) and -2.5 ms (tp=4, pp=2). The engine's
  once-only work is not per step: tensor metadata is sent while ``first_output_send``
  holds (reset only by ``reset_activation_shape``), the receive buffers are allocated
  while ``pipe_recv_buf`` is None, and ``_aggregate_total_loss`` runs once per
  iteration. The one per-step cost its code has is the device synchronisation of
  ``ThroughputTimer.start()`` (``timers.throughput.synchronized``), which
  ``_exec_forward_pass`` calls first: after it the GPU waits for the host to issue the
  pass's first kernel, at most two framework operations (the timer and the input
  clone), 0.14 ms at twice the fitted host seconds per kernel. That bound is 10-25x
  short of 1.6-3.5 ms, and the same instructions run at every tp (at tp > 1 they do
  more: the partitioned sends), so a per-instruction cost cannot fit rows that want it
  at tp=1 and not at tp=2-4: adding x ms per step to every pipelined row gives
  single-node MAPE 6.26 / 6.22 / 6.34 / 6.63 % at x = 0.25 / 0.5 / 1 / 1.5 (tp=1
  5.09 -> 4.25 % at 1 ms, tp=2 6.36 -> 7.19 %, tp=4 10.05 -> 10.56 %), and the
  synchronisation at its bound (0.14 ms per forward on the critical path, every row)
  6.32 %.
- GEMM efficiency beyond the fit rows' sizes. The curve is monotone in every
  dimension and near its ceiling at both: a layer's four GEMMs run at 232 TFLOP/s
  (h 2,048, tp=1, micro-batch 8: the largest fit shape) and at 201-245 TFLOP/s for
  the 18.4B-175B shapes at micro-batch 2 (18.4B tp=16 201, tp=8 222; 39.1B tp=2 243,
  tp=4 239, tp=8 232; 175B tp=8 240), below
  the 250-270 TFLOP/s NVIDIA's "Matrix Multiplication Background" guide gives for
  4k-8k GEMMs. The fit rows with the largest GEMMs are predicted too slow, not too
  fast (h 2,048 tp=1 micro-batch 4 / 8: +3.7 / +4.4 % mean signed), so they bound the
  large shapes' efficiency from below, and a 39.1B tp=2 GEMM is larger than its tp=4
  sibling's: the curve cannot make tp=2 slower per FLOP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.comm import group_ranks
from merak_sim.costs.efficiency import Efficiency

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
    tp_ranks = [group_ranks("tp", config, config.rank_of_stage(g)) for g in range(n)]

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
