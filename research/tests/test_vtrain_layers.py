"""The fit rows as lines in the layer count (research.vtrain_layers)."""

from dataclasses import replace
from pathlib import Path

import pytest

from merak_sim.costs.base import CostTable, StageCost
from research.vtrain import PreparedRow, VTrainRow, load_vtrain
from research.vtrain_layers import (
    layer_lines,
    layer_splits,
    predict_scaled,
    scale_compute,
    slope_ratio_by_tp,
)

_ROOT = Path(__file__).resolve().parents[2]


def _row(layers: int, *, hidden=1024, tp=1, mbs=4, time_ms=0.0) -> VTrainRow:
    return VTrainRow(gpus=2 * tp, global_batch=16, micro_batch=mbs, hidden=hidden, heads=16,
                     layers=layers, seq_len=1024, tp=tp, dp=1, pp=2, time_ms=time_ms)


def _group(a: float, b: float, **kw) -> tuple[list[VTrainRow], list[float]]:
    rows = [_row(n, **kw) for n in (12, 16, 20, 24)]
    return rows, [a + b * r.layers for r in rows]


def test_a_line_is_recovered_and_an_exact_one_has_equal_steps():
    rows, t = _group(0.05, 0.01)
    (line,) = layer_lines(rows, t).values()
    assert line.layers == (12, 16, 20, 24)
    assert line.intercept_s == pytest.approx(0.05) and line.slope_s == pytest.approx(0.01)
    assert line.max_residual < 1e-12 and line.equal_steps
    # One time 1 ms off: no longer equal steps, and the residual shows it.
    t2 = t[:2] + [t[2] + 1e-3, t[3]]
    (bent,) = layer_lines(rows, t2).values()
    assert not bent.equal_steps and bent.max_residual > 1e-3
    # Within a looser tolerance the same group counts as equal steps again.
    assert next(iter(layer_lines(rows, t2, step_tol_s=5e-3).values())).equal_steps


def test_groups_need_three_layer_counts_and_one_run_each():
    rows, t = _group(0.05, 0.01)
    assert layer_lines(rows[:2], t[:2]) == {}
    assert layer_lines(rows + rows[:1], t + t[:1]) == {}
    # Rows of another configuration form their own group.
    other, t_o = _group(0.02, 0.03, tp=2)
    assert len(layer_lines(rows + other, t + t_o)) == 2
    with pytest.raises(ValueError, match="one time per row"):
        layer_lines(rows, t[:3])


def test_splits_compare_the_model_line_with_the_data_line():
    rows, meas = _group(0.05, 0.01)
    pred = [0.025 + 0.011 * r.layers for r in rows]
    (sp,) = layer_splits(rows, meas, pred)
    assert sp.slope_ratio == pytest.approx(1.1)
    assert sp.intercept_ratio == pytest.approx(0.5)
    rows2, meas2 = _group(0.05, 0.01, hidden=2048, tp=2)
    pred2 = [0.05 + 0.013 * r.layers for r in rows2]
    rows3, meas3 = _group(0.05, 0.01, hidden=1024, tp=2)
    pred3 = [0.05 + 0.009 * r.layers for r in rows3]
    splits = layer_splits(rows + rows2 + rows3, meas + meas2 + meas3, pred + pred2 + pred3)
    by_tp = slope_ratio_by_tp(splits)
    assert by_tp[1] == pytest.approx(1.1) and by_tp[2] == pytest.approx(1.1)  # median of 1.3, 0.9
    assert slope_ratio_by_tp(splits, hidden=2048) == {2: pytest.approx(1.3)}


def _stage() -> StageCost:
    return StageCost(forward_s=3.0, backward_s=6.0, backward_input_s=4.0, backward_weight_s=2.0,
                     recompute_s=3.0, send_activation_s=0.5, grad_allreduce_s=0.7,
                     optimizer_s=0.2, activation_bytes=1.0, checkpoint_bytes=1.0,
                     input_bytes=1.0, weight_bytes=1.0, grad_bytes=1.0, optimizer_bytes=1.0,
                     p2p_bytes=1.0, flops=1.0, layers=2, tp_comm_fwd_s=1.0,
                     tp_exposed_fwd_s=1.0, tp_comm_bwd_s=2.0, tp_exposed_bwd_s=2.0,
                     tp_comm_recompute_s=1.0, tp_exposed_recompute_s=1.0)


def test_scale_compute_keeps_communication_and_the_backward_halves_consistent():
    table = CostTable(stages=(_stage(),), memory_capacity_bytes=1.0, peak_flops=1.0)
    (s,) = scale_compute(table, 0.5).stages
    assert (s.forward_s, s.recompute_s) == (2.0, 2.0)        # 1 exposed + 0.5 * 2
    assert (s.backward_s, s.backward_input_s, s.backward_weight_s) == (4.0, 3.0, 1.0)
    assert s.backward_input_s + s.backward_weight_s == s.backward_s
    assert (s.send_activation_s, s.grad_allreduce_s, s.optimizer_s) == (0.5, 0.7, 0.2)
    assert s.tp_exposed_fwd_s == 1.0 and s.flops == 1.0
    assert scale_compute(table, 1.0) == table
    with pytest.raises(ValueError, match="compute factor"):
        scale_compute(table, 0.0)


def test_predict_scaled_is_the_prediction_at_one_and_scales_compute_only():
    from merak_sim.costs.calibrated import CALIBRATED
    from merak_sim.costs.efficiency import Efficiency

    eff = Efficiency(**{**Efficiency().to_dict(), **CALIBRATED["A100"]})
    row = next(r for r in load_vtrain(_ROOT / "data" / "vtrain" / "ground_truth_multi.csv")
               if (r.tp, r.pp, r.micro_batch, r.params_b) == (4, 8, 2, 39.1))
    p = PreparedRow.of(row)
    base = p.predict(eff)
    assert predict_scaled(p, eff, 1.0) == pytest.approx(base, rel=1e-12)
    faster = predict_scaled(p, eff, 0.8)
    # Compute is most but not all of the time: less than 20 % faster, more than 10 %.
    assert 0.8 * base < faster < 0.9 * base
    # A row without pipeline stages (no exchange waits) scales as well.
    flat = PreparedRow.of(replace(row, pp=1, dp=128, params_b=None, micro_batch=2))
    assert predict_scaled(flat, eff, 0.8) < flat.predict(eff)


def test_the_committed_fit_rows_are_lines_in_the_layer_count():
    # The data property docs/validation.md states: 360 groups, most exactly linear.
    rows = load_vtrain(_ROOT / "data" / "vtrain" / "ground_truth_single.csv")
    lines = layer_lines(rows, [r.time_ms / 1e3 for r in rows])
    assert len(lines) == 360
    assert sum(ln.equal_steps for ln in lines.values()) >= 150
    assert sorted(ln.max_residual for ln in lines.values())[180] < 1e-5
