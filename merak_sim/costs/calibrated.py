"""The default cost model: the analytic model with efficiency parameters fitted to
measured runs, and measured collectives where the cluster has them.

:data:`CALIBRATED` holds the efficiency parameters the vTrain fit produced
(:mod:`merak_sim.experiments.vtrain`: A100 Megatron GPT runs of vTrain, Bang et al.,
MICRO 2024), copied here from benchmarks/results/vtrain_calibration.json by hand so a
reviewer sees them change. On clusters with a measured NCCL table
(:data:`merak_sim.costs.nccl.NCCL_TABLES`: the A100 presets) the intra-node collectives
come from that table (and off-node transfers from its measured inter-node bus bandwidth
where it has one: ``vtrain-a100``) and pipeline sends are Megatron-LM's scatter-gather
(the fit priced the vTrain runs' pipeline as their engine ran it, DeepSpeed's
PipelineEngine under Megatron-DeepSpeed: :mod:`merak_sim.experiments.vtrain_engine`;
the efficiency curve it yields describes the GPU, not the engine).
:class:`CalibratedCostModel` serves them to
:func:`merak_sim.sim.simulate` and the planner for A100 clusters and the published
defaults elsewhere (other GPUs keep the alpha-beta links and full pipeline sends).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.base import CostTable
from merak_sim.costs.calibrated_hopper import hopper_calibration
from merak_sim.costs.comm import check_pipeline_send, measured_collectives
from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.nccl import nccl_table_for
from merak_sim.hardware import Cluster

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.model import ModelSpec
    from merak_sim.partition import PartitionLike

__all__ = ["CALIBRATED", "CalibratedCostModel", "calibrated_cost_model"]

#: Fitted efficiency parameters per GPU family, from ``benchmarks/vtrain_validation.py``
#: (a fixed point: 14 rounds from the declared start
#: :data:`merak_sim.experiments.vtrain.START` under the stopping rule
#: :data:`merak_sim.experiments.vtrain.SEARCH`, so a rerun gives these digits;
#: 2026-12-02, with the vTrain rows priced as Megatron-DeepSpeed ran them: padded GPT-2
#: vocabulary, DeepSpeed's pipeline exchange, Megatron's softmax availability rule and
#: fp32 cross entropy (:data:`merak_sim.experiments.vtrain.VTRAIN_KERNELS`); single-node
#: MAPE 6.35 %, multi-node 7.40 % without refitting, mean signed error -6.27 %; the
#: network between nodes at NCCL's measured bus bandwidth,
#: :data:`merak_sim.costs.nccl.HDR4_A100_NODES`).
#: The loss is flat along gemm_dim_half / gemm_flops_half. The single-node runs are
#: host bound at small micro-batches (about 68 us of host time per modelled kernel,
#: :meth:`merak_sim.costs.efficiency.Efficiency.host_bound`); gemm_max, attn_factor,
#: mem_bw_eff and kernel_overhead_s sit at their physical bounds
#: (:data:`merak_sim.experiments.vtrain.BOUNDS`: GEMM ceiling 0.80, 10 us per kernel),
#: where the single-node rows push them. The parameters are efficiencies per kernel
#: class, so the default model, which prices the kernels a tuned stack runs (the fused
#: softmax, the default cross-entropy charges), uses them as they are.
CALIBRATED: dict[str, dict[str, float]] = {
    "A100": {
        "gemm_max": 0.8,
        "gemm_dim_half": 27.79734136437931,
        "gemm_flops_half": 8915093940.767141,
        "attn_factor": 1.0,
        "mem_bw_eff": 0.92,
        "kernel_overhead_s": 1e-05,
        "host_op_s": 6.822682342825518e-05,
    },
}


class CalibratedCostModel:
    """The analytic cost model with :data:`CALIBRATED` efficiency for the GPU types that
    have a fit, and the published defaults elsewhere.

    Args:
        pipeline_send: "full" or "scatter-gather" for every cluster
            (:func:`~merak_sim.costs.comm.pipeline_send_time`); None: the module
            docstring's defaults (scatter-gather where the cluster has a measured NCCL
            table, full elsewhere).
    """

    def __init__(self, pipeline_send: str | None = None) -> None:
        if pipeline_send is not None:
            check_pipeline_send(pipeline_send)
        self.pipeline_send = pipeline_send
        self._by_gpu: dict[tuple[str, str], AnalyticCostModel] = {}

    def _model(self, cluster: Cluster) -> AnalyticCostModel:
        name = cluster.gpu.name
        m = self._by_gpu.get((name, cluster.name))
        if m is None:
            key = "A100" if name.startswith("A100") else name
            eff = (Efficiency(**{**default_efficiency(name).to_dict(), **CALIBRATED[key]})
                   if key in CALIBRATED else None)
            eff, kernels = hopper_calibration(name, eff)
            table = nccl_table_for(cluster.name)
            send = self.pipeline_send or ("full" if table is None else "scatter-gather")
            m = AnalyticCostModel(
                efficiency=eff, kernels=kernels, pipeline_send=send,
                collectives=None if table is None else measured_collectives(table))
            self._by_gpu[(name, cluster.name)] = m
        return m

    def cost_table(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   partition: PartitionLike | None = None) -> CostTable:
        """Cost table from the analytic model with the calibrated efficiency (and the
        measured collectives where the cluster has them)."""
        t = self._model(cluster).cost_table(model, cluster, config, partition)
        if cluster.gpu.name.startswith("A100") and "A100" in CALIBRATED:
            t = replace(t, notes=t.notes + (
                "A100 efficiency calibrated on vTrain single-node runs",))
        return t

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Delegates to the analytic model."""
        return self._model(cluster).comm_time(collective, nbytes, ranks, cluster)


def calibrated_cost_model(pipeline_send: str | None = None) -> CalibratedCostModel:
    """The default cost model of :func:`merak_sim.sim.simulate` and the planner
    (``pipeline_send``: as :class:`CalibratedCostModel`)."""
    return CalibratedCostModel(pipeline_send)
