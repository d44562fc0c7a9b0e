"""The contract between cost models and their consumers (simulator, planner).

A cost model turns (model, cluster, ParallelConfig, partition) into a
:class:`CostTable`: per *model stage* (pp * virtual_stages of them, in pipeline
order) the time of each action for one micro-batch and the bytes it holds. The
simulator only reads this table (and the cluster, for link contention in full mode),
so analytic and trace-driven models are interchangeable.

Conventions: every time is in seconds on one GPU of the stage (tensor-parallel
collectives included, as exposed under the configured TP overlap), every size in
bytes per GPU, every FLOP count per micro-batch per GPU unless the name says
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["StageCost", "CostTable", "CostModel"]


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
            (model stage g lives on rank g % pp, chunk g // pp).
        memory_capacity_bytes: usable memory of one GPU.
        peak_flops: peak FLOP/s of one GPU at the training dtype (for MFU).
        notes: assumptions and fallbacks worth showing the user (for example
            "trace lacks mbs=3 for layer 'block': analytic used").
        meta: free-form details (source, trace file, efficiency parameters).
    """

    stages: tuple[StageCost, ...]
    memory_capacity_bytes: float
    peak_flops: float
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class CostModel(Protocol):
    """Anything that can price a configuration (AnalyticCostModel, TraceCostModel)."""

    def cost_table(self, model: Any, cluster: Any, config: Any,
                   partition: Any | None = None) -> CostTable:
        """Costs of every model stage for ``config`` (partition: layer ranges per
        model stage; None means the model's default partitioner)."""
        ...

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Any) -> float:
        """Seconds for ``collective`` ("all-reduce", "reduce-scatter", "all-gather",
        "p2p") of ``nbytes`` among global GPU ``ranks`` placed on ``cluster``."""
        ...
