"""The vTrain studies' view of the rows: each row with its schedule built once
(:class:`PreparedRow`), priced with any of the pipeline modes the studies compared, and
the row-level fit the studies rerun with other starts and parameter sets.

The product's calibration (``merak-sim calibrate``, :mod:`merak_sim.calibrate`) fits
the shipped A100 profile; this module prices the same rows the same way
(:func:`vtrain_cost_model` with ``"deepspeed"`` is the ``megatron-deepspeed`` stack) and
adds what only the studies need: Megatron-LM's own sends for comparison
(``"scatter-gather"``, ``"full"``), the exchange waits inside a table, a fit with a
chosen start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from merak_sim.calibrate.fit import BOUNDS, FIT_PARAMS, SEARCH, start_values
from merak_sim.calibrate.search import SearchResult, coordinate_search
from merak_sim.calibrate.vtrain import (
    GPT2_VOCAB,
    VOCAB_MULTIPLE,
    VTrainRow,
    load_vtrain,
    padded_vocab,
    row_setup,
)
from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.base import CostTable
from merak_sim.costs.comm import PIPELINE_SENDS, CostModelError, measured_collectives
from merak_sim.costs.deepspeed_pipe import DeepSpeedPipelineModel, StageExchange
from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.framework import MEGATRON
from merak_sim.costs.nccl import VTRAIN_A100
from merak_sim.costs.protocol import CostModel
from merak_sim.hardware import Cluster
from merak_sim.model import ModelSpec
from merak_sim.schedule.ir import Schedule
from merak_sim.sim.api import schedule_of, simulate
from merak_sim.sim.evaluator import evaluate
from merak_sim.sim.from_config import recompute_fractions
from merak_sim.sim.program import compile_program

__all__ = ["BOUNDS", "FIT_PARAMS", "GPT2_VOCAB", "PIPELINE_MODES", "SEARCH", "START",
           "PreparedRow", "VOCAB_MULTIPLE", "VTRAIN_KERNELS", "VTRAIN_PIPELINE", "VTrainRow",
           "fit", "fit_loss", "load_vtrain", "padded_vocab", "predict_row", "row_setup",
           "start_efficiency", "vtrain_cost_model"]

#: How the runs' engine (DeepSpeed's PipelineEngine under Megatron-DeepSpeed) moves
#: activations between stages (:mod:`merak_sim.costs.deepspeed_pipe`).
VTRAIN_PIPELINE = "deepspeed"
#: The runs' framework kernels (Megatron-DeepSpeed, :mod:`merak_sim.costs.framework`).
VTRAIN_KERNELS = MEGATRON
#: The choices of ``pipeline_send``: the runs' engine, or Megatron-LM's own sends.
PIPELINE_MODES = (VTRAIN_PIPELINE, *PIPELINE_SENDS)
#: Where the fit starts: the product's rule (:func:`merak_sim.calibrate.fit.start_values`)
#: on the A100.
START: dict[str, float] = start_values("A100-80GB", FIT_PARAMS, BOUNDS)


def _engine_model(efficiency: Efficiency | None) -> DeepSpeedPipelineModel:
    # The rows' own pricing: DeepSpeed's pipeline engine (VTRAIN_PIPELINE).
    comm = measured_collectives(VTRAIN_A100)
    return DeepSpeedPipelineModel(AnalyticCostModel(
        efficiency=efficiency, collectives=comm, framework=VTRAIN_KERNELS), comm)


def vtrain_cost_model(efficiency: Efficiency | None = None,
                      pipeline_send: str = VTRAIN_PIPELINE) -> CostModel:
    """The analytic model as the vTrain rows are priced (module docstring: Megatron's
    kernels, :data:`VTRAIN_KERNELS`); ``pipeline_send`` one of :data:`PIPELINE_MODES`."""
    if pipeline_send == VTRAIN_PIPELINE:
        return _engine_model(efficiency)
    comm = measured_collectives(VTRAIN_A100)
    if pipeline_send not in PIPELINE_SENDS:
        raise CostModelError(f"unknown pipeline send {pipeline_send!r}; choose one of: "
                             f"{', '.join(PIPELINE_MODES)}")
    return AnalyticCostModel(efficiency=efficiency, collectives=comm,
                             pipeline_send=pipeline_send, framework=VTRAIN_KERNELS)


def predict_row(row: VTrainRow, efficiency: Efficiency | None = None, *,
                engine: str = "evaluator", contention: bool | None = None,
                pipeline_send: str = VTRAIN_PIPELINE) -> float:
    """Predicted iteration time (seconds) of a vTrain row with the given efficiency."""
    model, cluster, cfg = row_setup(row)
    res = simulate(model, cluster, cfg, cost_model=vtrain_cost_model(efficiency, pipeline_send),
                   engine=engine, contention=contention if engine == "simpy" else None,
                   sub_cluster=True, keep_trace=False)
    return res.iteration_time_s


@dataclass(frozen=True)
class PreparedRow:
    """A row with its configuration and schedule built once, for repeated pricing
    (the fit): :meth:`predict` equals :func:`predict_row` with the evaluator."""

    row: VTrainRow
    model: ModelSpec
    cluster: Cluster
    config: ParallelConfig
    schedule: Schedule
    recompute: tuple[float, ...]

    @classmethod
    def of(cls, row: VTrainRow) -> PreparedRow:
        """Prepare ``row``."""
        model, cluster, cfg = row_setup(row)
        sched = schedule_of(cfg)
        return cls(row, model, cluster, cfg, sched, recompute_fractions(cfg, sched))

    def cost_table(self, efficiency: Efficiency | None = None,
                   pipeline_send: str = VTRAIN_PIPELINE) -> CostTable:
        """The row's cost table under ``efficiency`` (the calibrated A100 model)."""
        return vtrain_cost_model(efficiency, pipeline_send).cost_table(
            self.model, self.cluster, self.config)

    def cost_table_and_exchange(self, efficiency: Efficiency | None = None
                                ) -> tuple[CostTable, tuple[StageExchange, ...]]:
        """The row's cost table as :meth:`cost_table` prices it (DeepSpeed's pipeline
        engine, :data:`VTRAIN_PIPELINE`) and the exchange waits inside it:
        :func:`~merak_sim.costs.deepspeed_pipe.without_exchange` of the two is the
        table with no pipeline communication."""
        cm = _engine_model(efficiency)
        table = cm.cost_table(self.model, self.cluster, self.config)
        return table, cm.exchange(table, self.cluster, self.config)

    def predict(self, efficiency: Efficiency | None = None,
                pipeline_send: str = VTRAIN_PIPELINE) -> float:
        """Predicted iteration time (seconds), as :func:`predict_row`."""
        table = self.cost_table(efficiency, pipeline_send)
        return evaluate(compile_program(self.schedule, table, self.recompute)).makespan


def _loss(pred: Sequence[float], meas: Sequence[float]) -> float:
    return sum(abs(math.log(p / m)) for p, m in zip(pred, meas, strict=True)) / len(meas)


def fit_loss(rows: Sequence[VTrainRow], base: Efficiency
             ) -> Callable[[dict[str, float]], float]:
    """The fit's loss on ``rows``: parameter changes to ``base`` -> mean absolute log
    error of the predicted iteration times (each row prepared once; a combination
    :class:`Efficiency` rejects scores infinity, so the search never picks it)."""
    prepared = [PreparedRow.of(r) for r in rows]
    meas = [r.time_ms / 1e3 for r in rows]

    def loss_of(x: dict[str, float]) -> float:
        try:
            e = base.with_(**x)
        except ValueError:
            return math.inf
        return _loss([p.predict(e) for p in prepared], meas)
    return loss_of


def start_efficiency() -> Efficiency:
    """The fit's declared starting point (:data:`START` over the published defaults)."""
    return Efficiency(**{**Efficiency().to_dict(), **START})


def fit(rows: Sequence[VTrainRow], start: Efficiency | None = None, *,
        rounds: int = int(SEARCH["rounds"]), step: float = SEARCH["step"],
        tol: float = SEARCH["tol"], min_step: float = SEARCH["min_step"],
        pattern: bool = bool(SEARCH["pattern"]), params: Sequence[str] = FIT_PARAMS,
        log: Callable[[str], None] | None = None) -> SearchResult:
    """Fit efficiency parameters to ``rows`` within :data:`BOUNDS` from ``start``
    (default :func:`start_efficiency`) under the stopping rule of :data:`SEARCH`
    (module docstring); returns the search's result with the fitted Efficiency as its
    ``params`` and the mean absolute log error as its ``loss`` (it unpacks as that
    pair), and whether the rule or the round cap ended it."""
    eff = start or start_efficiency()
    res = coordinate_search(fit_loss(rows, eff), {k: getattr(eff, k) for k in params},
                            {k: BOUNDS[k] for k in params}, rounds=rounds, step=step,
                            tol=tol, min_step=min_step, pattern=pattern, log=log)
    return replace(res, params=eff.with_(**res.params))
