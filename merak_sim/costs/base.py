"""The contract between cost models and their consumers (simulator, planner).

A cost model turns (model, cluster, ParallelConfig, partition) into a
:class:`CostTable`: per *model stage* (pp * virtual_stages of them, in pipeline
order) the time of each action for one micro-batch and the bytes it holds. The
simulator only reads this table (and the cluster, for link contention in full mode),
so analytic and trace-driven models are interchangeable (the
:class:`~merak_sim.costs.protocol.CostModel` protocol).

Conventions: every time is in seconds on one GPU of the stage, every size in bytes
per GPU, every FLOP count per micro-batch per GPU unless the name says otherwise.
Action times (``forward_s``, ``backward_s``, ``backward_input_s``, ``recompute_s``)
are totals that *include* the exposed part of the stage's tensor-parallel (TP)
collectives under the configured TP overlap; the ``tp_*`` fields say how much of each
is TP communication, so consumers that only need durations (the fast evaluator, the
planner) read the totals and stay exact, while the SimPy engine can draw the
collectives and put them on links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["StageCost", "CostTable"]


@dataclass(frozen=True, slots=True)
class StageCost:
    """Costs of one model stage for one micro-batch.

    Times:
        forward_s: forward with grad, keeping every activation (F).
        backward_s: full backward (input and weight gradients), no recompute (B).
        backward_input_s / backward_weight_s: the zero-bubble halves (I, W); they sum
            to about ``backward_s``.
        recompute_s: re-forward of every checkpointable layer of the stage; a
            backward of a micro-batch checkpointed at fraction c pays
            ``c * recompute_s`` extra unless an explicit R ran. An explicit R (after
            F*) costs ``forward_s``; an F* also costs ``forward_s``.
        send_activation_s: point-to-point time of this stage's output activation to
            the next model stage (0 for the last); the gradient back is the same size.
        grad_allreduce_s: data-parallel gradient all-reduce of this stage's
            parameters (reduce-scatter + all-gather under ZeRO-1); 0 when dp = 1.
        optimizer_s: optimizer step for this stage's (shard of the) parameters.
    Bytes (per GPU):
        activation_bytes: activations one micro-batch keeps when nothing is
            checkpointed (Korthikanti et al. 2022, plus embeddings/logits on the
            first/last stage).
        checkpoint_bytes: what one micro-batch keeps when every layer is
            checkpointed (each layer's input); a fraction c keeps
            ``c * checkpoint_bytes + (1 - c) * activation_bytes``.
        input_bytes: what an F* micro-batch keeps (the stage input only).
        weight_bytes, grad_bytes, optimizer_bytes: model state on one GPU after
            tensor-parallel and ZeRO sharding.
        p2p_bytes: size of the activation sent to the next stage.
    Work:
        flops: model FLOPs of forward + backward of one micro-batch on one GPU
            (no recompute), for MFU.
        layers: number of transformer layers in the stage.
    Tensor-parallel collectives (all 0 when tp = 1 or when a trace measured them
    inside the compute times):
        tp_comm_fwd_s: seconds of every TP collective of one forward of the stage
            (Megatron: 2 all-reduces per layer, or an all-gather + reduce-scatter
            pair each with sequence parallelism, plus the embedding's on the first
            stage), each priced alone and run synchronously. Also applies to an F*
            and to an explicit R (both cost ``forward_s``).
        tp_exposed_fwd_s: the part of ``tp_comm_fwd_s`` that stays on the critical
            path under the configured overlap, *included in* ``forward_s``. No
            overlap: equal to ``tp_comm_fwd_s``. Sub-pipelined (Merak T3, Lai et al.
            TPDS 2023): the last all-reduce of each layer pass plus
            whatever the others cannot hide behind the pass's compute; the rest,
            ``tp_comm_fwd_s - tp_exposed_fwd_s``, runs concurrently with compute.
        tp_comm_bwd_s / tp_exposed_bwd_s: the same for one backward (the LM head's
            all-reduce included on the last stage). Backward TP collectives belong to
            the input-gradient half: their exposed part is included in
            ``backward_input_s`` and ``backward_s``; ``backward_weight_s`` has none.
        tp_comm_recompute_s / tp_exposed_recompute_s: the same for ``recompute_s``
            (the layers' re-forward; exposed part included in ``recompute_s``).
        tp_bytes_fwd / tp_bytes_bwd / tp_bytes_recompute: bytes one GPU sends over
            its links for those collectives (ring: 2 (t-1)/t of each all-reduce's
            payload), for link occupancy in the simulator.
    ZeRO-3 (FSDP) collectives of one micro-batch (all 0 below ZeRO 3), reported on
    their own lines (:mod:`merak_sim.zero_comm`):
        fsdp_comm_fwd_s / fsdp_exposed_fwd_s: every unit's all-gather before its
            forward priced alone, and the part prefetching cannot hide, *included in*
            ``forward_s`` (so also in an F* and an explicit R).
        fsdp_comm_bwd_s / fsdp_exposed_bwd_s: the backward's all-gathers and
            reduce-scatters, and their exposed part, included in ``backward_s`` and
            ``backward_input_s``.
        fsdp_bytes_fwd / fsdp_bytes_bwd: bytes one GPU sends for them (ring:
            (g-1)/g of each unit's gathered or reduced bytes).
    """

    forward_s: float
    backward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    send_activation_s: float
    grad_allreduce_s: float
    optimizer_s: float
    activation_bytes: float
    checkpoint_bytes: float
    input_bytes: float
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    p2p_bytes: float
    flops: float
    layers: int
    tp_comm_fwd_s: float = 0.0
    tp_exposed_fwd_s: float = 0.0
    tp_comm_bwd_s: float = 0.0
    tp_exposed_bwd_s: float = 0.0
    tp_comm_recompute_s: float = 0.0
    tp_exposed_recompute_s: float = 0.0
    tp_bytes_fwd: float = 0.0
    tp_bytes_bwd: float = 0.0
    tp_bytes_recompute: float = 0.0
    fsdp_comm_fwd_s: float = 0.0
    fsdp_exposed_fwd_s: float = 0.0
    fsdp_comm_bwd_s: float = 0.0
    fsdp_exposed_bwd_s: float = 0.0
    fsdp_bytes_fwd: float = 0.0
    fsdp_bytes_bwd: float = 0.0

    @property
    def state_bytes(self) -> float:
        """Weights + gradients + optimizer state on one GPU."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    def kept_bytes(self, fraction: float) -> float:
        """Activation bytes one micro-batch keeps when ``fraction`` is checkpointed."""
        return fraction * self.checkpoint_bytes + (1.0 - fraction) * self.activation_bytes


@dataclass(frozen=True)
class CostTable:
    """Per-model-stage costs for one (model, cluster, config) plus provenance.

    Attributes:
        stages: one :class:`StageCost` per model stage, pipeline order
            (model stage g lives where the schedule's placement puts it:
            :meth:`merak_sim.schedule.ir.Schedule.rank_of`).
        memory_capacity_bytes: usable memory of one GPU.
        peak_flops: peak FLOP/s of one GPU at the training dtype (for MFU).
        notes: assumptions and fallbacks worth showing the user (for example
            "trace lacks mbs=3 for layer 'block': analytic used").
        meta: free-form details (source, trace file, efficiency parameters).
        tied_embeddings: the first and the last model stage hold copies of one tied
            weight (the word embedding and the LM head) on different pipeline ranks;
            AR sums their gradients between those two ranks, so the AR of the first
            and the last pipeline rank is a two-rank collective that both must reach
            (:mod:`merak_sim.schedule.ir`, rule 6). Its time is part of those
            stages' ``grad_allreduce_s``.
        reserved_bytes: per pipeline rank, bytes the caching allocator reserves for the
            whole step beyond the live tensors (cuBLAS workspace, FSDP2's all-gather
            pool: :func:`merak_sim.allocator_memory.reserved_bytes`); part of every
            peak the simulator and the planner compare with the capacity. Empty: none.
    """

    stages: tuple[StageCost, ...]
    memory_capacity_bytes: float
    peak_flops: float
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    tied_embeddings: bool = False
    reserved_bytes: tuple[float, ...] = ()

    def reserved(self, rank: int) -> float:
        """:attr:`reserved_bytes` of pipeline rank ``rank`` (0 when none are given)."""
        return float(self.reserved_bytes[rank]) if self.reserved_bytes else 0.0
