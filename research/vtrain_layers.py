"""The fit rows' per-layer and per-run parts: vTrain's single-node runs as lines in the
layer count.

vTrain's 1,440 single-node rows come in groups that are equal but for the number of
layers (12, 16, 20 and 24 layers of one configuration). Within a group an iteration
is ``A + B * L``: ``B`` the per-layer part (forward, recompute and backward of one layer
for every micro-batch, its share of the gradient all-reduce and optimizer step, its
share of the pipeline bubble) and ``A`` the per-run part (embedding, LM head and loss,
per-micro-batch and per-iteration host work). A least-squares line through a group's
measured times gives the data's own ``A`` and ``B``; the same line through the cost
model's predictions gives the model's, so a fit that matches the rows' totals by
trading one part against the other shows (:class:`LayerSplit`).

What the lines say (``python -m research.studies.vtrain_consistency`` prints the figures):

- The measured times lie on their lines far more closely than independent runs
  would: in many groups the successive differences ``T(L + 4) - T(L)`` agree within a
  microsecond (:attr:`LayerLine.equal_steps`), so the rows behave as composed from a
  per-layer and a per-run part. 1,440 rows pin about two numbers per group, not one
  per row.
- The model's per-layer part is above the data's and its per-run part below: the fit
  matches the totals by making the layers slower than the rows show. Extrapolating
  to the held-out multi-node rows rests on the per-layer part (30-96 layers against the
  fit rows' 12-24), so :func:`predict_scaled` asks what the fit rows' own slope would
  do there: it scales each held-out row's per-GPU compute by the fit rows' measured /
  predicted slope of its tensor-parallel size and re-evaluates the row exactly.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.deepspeed_pipe import with_exchange, without_exchange
from merak_sim.costs.efficiency import Efficiency
from merak_sim.sim.evaluator import evaluate
from merak_sim.sim.program import compile_program
from research.lines import least_squares_line
from research.vtrain import PreparedRow, VTrainRow

__all__ = ["LayerLine", "LayerSplit", "GroupKey", "group_key", "layer_lines",
           "layer_splits", "predict_scaled", "scale_compute", "slope_ratio_by_tp"]

#: A group of rows equal but for the layer count: (hidden, heads, seq_len, tp, dp, pp,
#: micro_batch, global_batch).
GroupKey = tuple[int, int, int, int, int, int, int, int]


def group_key(r: VTrainRow) -> GroupKey:
    """The row's group (everything but the layer count)."""
    return (r.hidden, r.heads, r.seq_len, r.tp, r.dp, r.pp, r.micro_batch, r.global_batch)


@dataclass(frozen=True, slots=True)
class LayerLine:
    """Least-squares line ``intercept_s + slope_s * layers`` through one group's times.

    Attributes:
        key: the group (:data:`GroupKey`).
        layers: the group's layer counts, ascending.
        intercept_s / slope_s: the line (seconds; seconds per layer).
        max_residual: largest ``|time - line| / time`` over the group.
        equal_steps: whether the group's layer counts are evenly spaced and successive
            time differences agree within the tolerance given to :func:`layer_lines`.
    """

    key: GroupKey
    layers: tuple[int, ...]
    intercept_s: float
    slope_s: float
    max_residual: float
    equal_steps: bool


def layer_lines(rows: Sequence[VTrainRow], times_s: Sequence[float],
                step_tol_s: float = 1e-6) -> dict[GroupKey, LayerLine]:
    """The line of every group of ``rows`` with at least three distinct layer counts
    (``times_s``: each row's time in seconds, measured or predicted, in the rows'
    order; ``step_tol_s``: how closely successive differences must agree for
    :attr:`LayerLine.equal_steps`). A group with a repeated layer count is skipped: its
    rows are not one run per layer count."""
    if len(rows) != len(times_s):
        raise ValueError(f"one time per row: {len(rows)} rows, {len(times_s)} times")
    groups: dict[GroupKey, dict[int, float]] = {}
    repeated: set[GroupKey] = set()
    for r, t in zip(rows, times_s, strict=True):
        key = group_key(r)
        g = groups.setdefault(key, {})
        if r.layers in g:
            repeated.add(key)
        g[r.layers] = t
    out = {}
    for key, pts in groups.items():
        if key in repeated or len(pts) < 3:
            continue
        ls = sorted(pts)
        ts = [pts[n] for n in ls]
        a, b, _r2 = least_squares_line(ls, ts)
        resid = max(abs(t - (a + b * n)) / t for n, t in zip(ls, ts, strict=True))
        gaps = {ls[i + 1] - ls[i] for i in range(len(ls) - 1)}
        diffs = [ts[i + 1] - ts[i] for i in range(len(ts) - 1)]
        even = len(gaps) == 1 and max(diffs) - min(diffs) <= step_tol_s
        out[key] = LayerLine(key, tuple(ls), a, b, resid, even)
    return out


@dataclass(frozen=True, slots=True)
class LayerSplit:
    """A group's measured line against the model's."""

    measured: LayerLine
    predicted: LayerLine

    @property
    def slope_ratio(self) -> float:
        """Predicted over measured per-layer part (above 1: the model's layers are slower
        than the data's)."""
        return self.predicted.slope_s / self.measured.slope_s

    @property
    def intercept_ratio(self) -> float:
        """Predicted over measured per-run part (inf where the measured one is not
        positive)."""
        m = self.measured.intercept_s
        return self.predicted.intercept_s / m if m > 0 else float("inf")


def layer_splits(rows: Sequence[VTrainRow], measured_s: Sequence[float],
                 predicted_s: Sequence[float]) -> list[LayerSplit]:
    """Measured against predicted line of every group :func:`layer_lines` keeps, in
    group order."""
    meas = layer_lines(rows, measured_s)
    pred = layer_lines(rows, predicted_s)
    return [LayerSplit(meas[k], pred[k]) for k in sorted(meas)]


def slope_ratio_by_tp(splits: Sequence[LayerSplit], hidden: int | None = None
                      ) -> Mapping[int, float]:
    """Median :attr:`LayerSplit.slope_ratio` per tensor-parallel size (only groups of
    hidden size ``hidden`` when given)."""
    by: dict[int, list[float]] = {}
    for s in splits:
        h, _heads, _seq, tp = s.measured.key[:4]
        if hidden is None or h == hidden:
            by.setdefault(tp, []).append(s.slope_ratio)
    return {tp: statistics.median(v) for tp, v in sorted(by.items())}


def _scaled(s: StageCost, k: float) -> StageCost:
    # The exposed TP collectives are part of the pass times; they keep their length.
    def sc(total: float, exposed: float) -> float:
        return exposed + k * (total - exposed)

    return replace(s, forward_s=sc(s.forward_s, s.tp_exposed_fwd_s),
                   backward_s=sc(s.backward_s, s.tp_exposed_bwd_s),
                   backward_input_s=sc(s.backward_input_s, s.tp_exposed_bwd_s),
                   backward_weight_s=k * s.backward_weight_s,
                   recompute_s=sc(s.recompute_s, s.tp_exposed_recompute_s))


def scale_compute(table: CostTable, factor: float) -> CostTable:
    """``table`` with every stage's compute (forward, recompute, backward, the exposed
    tensor-parallel collectives excepted) multiplied by ``factor``; communication,
    optimizer and memory unchanged. The embedding and LM head scale with the layers,
    a small error for the large held-out models it is used on."""
    if not factor > 0:
        raise ValueError(f"compute factor must be > 0, got {factor}")
    return replace(table, stages=tuple(_scaled(s, factor) for s in table.stages))


def predict_scaled(prepared: PreparedRow, efficiency: Efficiency, factor: float) -> float:
    """Predicted iteration time (seconds) of ``prepared`` with its compute scaled by
    ``factor`` (:func:`scale_compute`), DeepSpeed's pipeline exchange waits taken out
    before the scaling and put back after it, so only compute changes; ``factor`` 1
    gives :meth:`PreparedRow.predict`."""
    table, ex = prepared.cost_table_and_exchange(efficiency)
    table = with_exchange(scale_compute(without_exchange(table, ex), factor), ex)
    return evaluate(compile_program(prepared.schedule, table, prepared.recompute)).makespan
