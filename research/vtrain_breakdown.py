"""Where a vTrain row's predicted iteration time goes: compute, bubble, and the
communication of each parallel dimension.

Each communication term is its marginal cost on the critical path: the exact
evaluator's makespan minus the makespan with that term removed from the cost table
(tensor-parallel: the exposed TP collectives inside forward, recompute and backward;
pipeline: the activation / gradient transfers between stages, with DeepSpeed's
exchange waits and all-gathers inside forward and backward
(:mod:`merak_sim.costs.deepspeed_pipe`); data-parallel: the gradient all-reduce,
with the tied-embedding all-reduce between the first and last stage).
``compute_s`` is the busiest pipeline rank's compute (forward, recompute and backward
of every micro-batch, communication excluded), ``bubble_s`` the idle time the pipeline
adds to it when no communication is charged, ``optimizer_s`` the slowest rank's
optimizer step. The terms overlap a little where one communication hides behind
another's wait, so they need not sum exactly to the prediction (``other_s``).

:func:`comm_scale_needed` answers the question a residual raises: by how much would
all modelled communication have to grow to explain a group's mean error? A factor far
above what any link measurement allows says the error is not in the communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.deepspeed_pipe import without_exchange
from merak_sim.costs.efficiency import Efficiency
from merak_sim.sim.evaluator import evaluate
from merak_sim.sim.from_config import stage_rank
from merak_sim.sim.program import compile_program
from research.vtrain import PreparedRow

__all__ = ["RowBreakdown", "row_breakdown", "comm_scale_needed"]


@dataclass(frozen=True, slots=True)
class RowBreakdown:
    """Predicted seconds of one row by term (module docstring)."""

    predicted_s: float
    measured_s: float
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float

    @property
    def comm_s(self) -> float:
        """Communication on the critical path, all dimensions."""
        return self.tp_comm_s + self.pp_comm_s + self.dp_comm_s

    @property
    def other_s(self) -> float:
        """What the named terms leave of the prediction (overlap between them)."""
        return self.predicted_s - (self.compute_s + self.bubble_s + self.comm_s
                                   + self.optimizer_s)

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted_s / self.measured_s - 1.0


def _no_tp(s: StageCost) -> StageCost:
    return replace(s, forward_s=s.forward_s - s.tp_exposed_fwd_s,
                   backward_s=s.backward_s - s.tp_exposed_bwd_s,
                   backward_input_s=s.backward_input_s - s.tp_exposed_bwd_s,
                   recompute_s=s.recompute_s - s.tp_exposed_recompute_s,
                   tp_comm_fwd_s=0.0, tp_exposed_fwd_s=0.0, tp_comm_bwd_s=0.0,
                   tp_exposed_bwd_s=0.0, tp_comm_recompute_s=0.0,
                   tp_exposed_recompute_s=0.0)


def _no_pp(s: StageCost) -> StageCost:
    return replace(s, send_activation_s=0.0)


def _no_dp(s: StageCost) -> StageCost:
    return replace(s, grad_allreduce_s=0.0)


def _no_opt(s: StageCost) -> StageCost:
    return replace(s, optimizer_s=0.0)


def row_breakdown(prepared: PreparedRow, efficiency: Efficiency | None = None
                  ) -> RowBreakdown:
    """The breakdown of ``prepared``'s prediction with ``efficiency`` (module
    docstring); ``predicted_s`` equals :meth:`PreparedRow.predict`."""
    table, exchange = prepared.cost_table_and_exchange(efficiency)
    # The table without pipeline communication: DeepSpeed's exchange waits taken out
    # of forward and backward, the separate transfers set to zero.
    no_pp = without_exchange(table, exchange)
    no_pp = replace(no_pp, stages=tuple(_no_pp(s) for s in no_pp.stages))

    def span(*drop, base: CostTable = table) -> float:
        st = base.stages
        for f in drop:
            st = tuple(f(s) for s in st)
        t: CostTable = replace(base, stages=st)
        return evaluate(compile_program(prepared.schedule, t, prepared.recompute)).makespan

    total = span()
    bare = span(_no_tp, _no_dp, _no_opt, base=no_pp)
    m = prepared.config.num_microbatches
    c = prepared.recompute
    per_rank: dict[int, float] = {}
    for g, s in enumerate(no_pp.stages):
        r = stage_rank(prepared.config, g)
        s0 = _no_tp(s)
        per_rank[r] = per_rank.get(r, 0.0) + m * (s0.forward_s + s0.backward_s
                                                  + c[r] * s0.recompute_s)
    compute = max(per_rank.values())
    return RowBreakdown(
        predicted_s=total, measured_s=prepared.row.time_ms / 1e3, compute_s=compute,
        bubble_s=bare - compute, tp_comm_s=total - span(_no_tp),
        pp_comm_s=total - span(base=no_pp), dp_comm_s=total - span(_no_dp),
        optimizer_s=max(s.optimizer_s for s in table.stages))


def comm_scale_needed(rows: Sequence[RowBreakdown]) -> float:
    """Factor on all modelled communication of ``rows`` that would make their summed
    prediction equal their summed measurement (1: the communication needs no change;
    inf: no communication to scale)."""
    comm = sum(b.comm_s for b in rows)
    gap = sum(b.measured_s - b.predicted_s for b in rows)
    return 1.0 + gap / comm if comm > 0 else float("inf")
