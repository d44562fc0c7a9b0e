"""The default cost model: the analytic model with efficiency parameters fitted to
measured runs, and measured collectives where the cluster has them.

:data:`CALIBRATED` holds the shipped A100 profile
(:data:`merak_sim.costs.profiles.SHIPPED`, ``a100.json``): ``merak-sim calibrate``
fitted to vTrain's A100 Megatron GPT runs (Bang et al., MICRO 2024); the file names the
command that rebuilds it (docs/calibrate.md), so a rebuild shows as a diff of that file.
On clusters with a measured NCCL table
(:data:`merak_sim.costs.nccl.NCCL_TABLES`: the A100 presets) the intra-node collectives
come from that table (and off-node transfers from its measured inter-node bus bandwidth
where it has one: ``vtrain-a100``) and pipeline sends are Megatron-LM's scatter-gather
(the fit priced the vTrain runs' pipeline as their engine ran it, DeepSpeed's
PipelineEngine under Megatron-DeepSpeed: :mod:`merak_sim.costs.deepspeed_pipe`;
the efficiency curve it yields describes the GPU, not the engine).
:class:`CalibratedCostModel` serves them to
:func:`merak_sim.sim.simulate` and the planner for A100 clusters and the published
defaults elsewhere (other GPUs keep the alpha-beta links and full pipeline sends).
A user's own profile (``--profile FILE``, :class:`~merak_sim.costs.profiles.CostProfile`)
replaces the shipped values on the GPU family it was fitted on.
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
from merak_sim.costs.profiles import CostProfile, shipped_profile
from merak_sim.hardware import Cluster

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.model import ModelSpec
    from merak_sim.partition import PartitionLike

__all__ = ["CALIBRATED", "CalibratedCostModel", "calibrated_cost_model"]

#: Fitted efficiency parameters per GPU family: the shipped profiles' values. A100: the
#: vTrain single-node rows (1,440), 14 rounds from the declared start under the stated
#: stopping rule (:mod:`merak_sim.calibrate.fit`; the single-node rows priced as
#: Megatron-DeepSpeed ran them, the multi-node rows held out); the file records the fit
#: and held-out errors (6.35 % and 7.40 % MAPE). gemm_max, attn_factor, mem_bw_eff and
#: kernel_overhead_s sit at their physical bounds, where the single-node rows push them;
#: the single-node runs are host bound at small micro-batches (about 68 us of host time
#: per modelled kernel, :meth:`merak_sim.costs.efficiency.Efficiency.host_bound`). The
#: parameters are efficiencies per kernel class, so the default model, which prices the
#: kernels a tuned stack runs, uses them as they are.
CALIBRATED: dict[str, dict[str, float]] = {
    "A100": dict(shipped_profile("a100").parameters),
}


class CalibratedCostModel:
    """The analytic cost model with :data:`CALIBRATED` efficiency for the GPU types that
    have a fit, and the published defaults elsewhere.

    Args:
        pipeline_send: "full" or "scatter-gather" for every cluster
            (:func:`~merak_sim.costs.comm.pipeline_send_time`); None: the module
            docstring's defaults (scatter-gather where the cluster has a measured NCCL
            table, full elsewhere).
        profile: a user's cost profile (``merak-sim calibrate``): its values replace
            the shipped ones; a cluster of another GPU family is a one-line error.
    """

    def __init__(self, pipeline_send: str | None = None,
                 profile: CostProfile | None = None) -> None:
        if pipeline_send is not None:
            check_pipeline_send(pipeline_send)
        self.pipeline_send = pipeline_send
        self.profile = profile
        self._by_gpu: dict[tuple[str, str], AnalyticCostModel] = {}

    def _efficiency(self, name: str):
        """(efficiency, kernel efficiency) of GPU ``name``: the user's profile, else
        the shipped fits (A100, Hopper), else None (the published defaults)."""
        if self.profile is not None:
            return self.profile.efficiency_for(name)
        key = "A100" if name.startswith("A100") else name
        eff = (Efficiency(**{**default_efficiency(name).to_dict(), **CALIBRATED[key]})
               if key in CALIBRATED else None)
        return hopper_calibration(name, eff)

    def _model(self, cluster: Cluster) -> AnalyticCostModel:
        name = cluster.gpu.name
        m = self._by_gpu.get((name, cluster.name))
        if m is None:
            eff, kernels = self._efficiency(name)
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
        if self.profile is not None:
            t = replace(t, notes=t.notes + (
                f"{self.profile.gpu} efficiency from the given cost profile",))
        elif cluster.gpu.name.startswith("A100") and "A100" in CALIBRATED:
            t = replace(t, notes=t.notes + (
                "A100 efficiency calibrated on vTrain single-node runs",))
        return t

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Delegates to the analytic model."""
        return self._model(cluster).comm_time(collective, nbytes, ranks, cluster)


def calibrated_cost_model(pipeline_send: str | None = None,
                          profile: CostProfile | None = None) -> CalibratedCostModel:
    """The default cost model of :func:`merak_sim.sim.simulate` and the planner
    (``pipeline_send``, ``profile``: as :class:`CalibratedCostModel`)."""
    return CalibratedCostModel(pipeline_send, profile)
