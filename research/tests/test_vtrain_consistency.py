"""The sibling-consistency check of vTrain runs (research.vtrain_consistency) and its
benchmark's command line."""

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.efficiency import Efficiency
from research.vtrain import VTrainRow
from research.vtrain_consistency import (
    Limits,
    RowShape,
    bounds,
    consistent_floor,
    flagged,
    layer_gemm_flops,
    model_as_data,
    needed_slack,
    per_step_fit,
    row_shape,
    with_step_cost,
)

_ROOT = Path(__file__).resolve().parents[2]


def _stage(f: float, r: float, b: float, c: float = 0.0) -> StageCost:
    return StageCost(forward_s=f, backward_s=b, backward_input_s=b / 2,
                     backward_weight_s=b / 2, recompute_s=r, send_activation_s=0.0,
                     grad_allreduce_s=c, optimizer_s=0.0, activation_bytes=0.0,
                     checkpoint_bytes=0.0, input_bytes=0.0, weight_bytes=0.0,
                     grad_bytes=0.0, optimizer_bytes=0.0, p2p_bytes=0.0, flops=0.0,
                     layers=1)


def test_row_shape_reads_bottleneck_balance_and_fixed_cost():
    table = CostTable(stages=(_stage(1.0, 1.0, 2.0, 0.5), _stage(1.0, 1.0, 2.0),
                              _stage(2.0, 2.0, 3.0, 0.25)),
                      memory_capacity_bytes=1.0, peak_flops=1.0)
    sh = row_shape(table, (1.0, 1.0, 0.5))
    assert sh.tau == pytest.approx(6.0)          # last stage: 2 + 0.5 * 2 + 3
    assert sh.lam == pytest.approx(8.0 / 6.0)    # the two stages before it
    assert sh.f_max == 2.0 and sh.b_max == pytest.approx(4.0)  # 3 + 0.5 * 2 vs 2 + 1 * 1
    assert sh.rho == pytest.approx(1.0)
    assert sh.c_model_s == 0.5


def _row(mbs: int, t_ms: float, *, tp=4, dp=8, pp=8, gb=1536, gpus=256) -> VTrainRow:
    return VTrainRow(gpus=gpus, global_batch=gb, micro_batch=mbs, hidden=8192, heads=64,
                     layers=48, seq_len=2048, tp=tp, dp=dp, pp=pp, time_ms=t_ms)


def _uniform(row: VTrainRow, per_sample_s: float, c_s: float = 0.0):
    """The row's time and shape under T = (m + p - 1) t + C with uniform stages and a
    per-micro-batch time proportional to the micro-batch (a consistent family)."""
    t = per_sample_s * row.micro_batch
    m = row.global_batch / row.dp / row.micro_batch
    shape = RowShape(f_max=t / 3, b_max=2 * t / 3, tau=t, lam=row.pp - 1.0, c_model_s=c_s)
    return replace(row, time_ms=1e3 * ((m + row.pp - 1) * t + c_s)), shape


def test_a_consistent_family_passes_and_a_slow_row_is_flagged():
    pairs = [_uniform(_row(b, 0.0), 0.05, 0.2) for b in (1, 2, 4, 8)]
    rows, shapes = [p[0] for p in pairs], [p[1] for p in pairs]
    lim = Limits(slack=1.0, tol=0.0)
    bd = bounds(rows, shapes, lim)
    assert len(bd) == 2 * 6  # a bubble and a gain bound per pair of micro-batch sizes
    assert max(b.excess for b in bd) <= 1e-9
    # The bubble bound of uniform stages is the bubble ratio (S + (p-1) b_j) / (S + (p-1) b_i).
    b48 = next(b for b in bd if b.kind == "bubble" and b.row == 3 and b.other == 2)
    assert b48.factor == pytest.approx((192 + 7 * 8) / (192 + 7 * 4))
    # mbs 8 taking 10 % longer than its bubble allows is flagged, by a bubble bound.
    slow = rows[:3] + [replace(rows[3], time_ms=rows[3].time_ms * 1.10)]
    bad = flagged(bounds(slow, shapes, lim), 0.01)
    assert set(bad) == {3} and bad[3].kind == "bubble"
    assert bad[3].excess > 0.05
    # mbs 1 taking 10 % longer than its siblings allow is flagged, by a gain bound
    # (the smallest micro-batch has no bubble bound).
    slow2 = [replace(rows[0], time_ms=rows[0].time_ms * 1.10), *rows[1:]]
    bad2 = flagged(bounds(slow2, shapes, lim), 0.01)
    assert set(bad2) == {0} and bad2[0].kind == "gain"


def test_consistent_floor_lowers_only_the_contradicted_rows_to_their_caps():
    pairs = [_uniform(_row(b, 0.0), 0.05, 0.2) for b in (1, 2, 4, 8)]
    rows, shapes = [p[0] for p in pairs], [p[1] for p in pairs]
    lim = Limits(slack=1.0, tol=0.0)
    # A consistent family is its own floor, reached in one pass.
    t, passes = consistent_floor(rows, bounds(rows, shapes, lim), 0.0)
    assert passes == 1 and t == pytest.approx([r.time_ms / 1e3 for r in rows])
    # mbs 8 taking 10 % longer than its bubble allows comes down to its tightest cap
    # (plus the tolerance; its siblings are untouched), and the floor then meets every
    # bound.
    slow = rows[:3] + [replace(rows[3], time_ms=rows[3].time_ms * 1.10)]
    bd = bounds(slow, shapes, lim)
    t, passes = consistent_floor(slow, bd, 0.01)
    assert t[:3] == [r.time_ms / 1e3 for r in slow[:3]]
    cap = min(1.01 * b.limit_s for b in bd if b.row == 3)
    assert t[3] == pytest.approx(cap) and t[3] < slow[3].time_ms / 1e3
    assert passes >= 2
    floored = [replace(r, time_ms=1e3 * x) for r, x in zip(slow, t, strict=True)]
    assert max(b.excess for b in bounds(floored, shapes, lim)) <= 0.01 + 1e-12


def test_efficiency_slack_loosens_the_gain_bound():
    r1, s1 = _uniform(_row(2, 0.0), 0.05)
    r2, s2 = _uniform(_row(4, 0.0), 0.05)
    # The model says mbs 4 is 2 % cheaper per sample; the measured pair shows 8 %.
    s2 = replace(s2, tau=s2.tau * 0.98, f_max=s2.f_max * 0.98, b_max=s2.b_max * 0.98)
    r2 = replace(r2, time_ms=r2.time_ms * 0.92)
    rows, shapes = [r1, r2], [s1, s2]
    assert 0 in flagged(bounds(rows, shapes, Limits(slack=1.0)), 0.01)
    assert not flagged(bounds(rows, shapes, Limits(slack=5.0)), 0.01)
    s = needed_slack(rows, shapes, Limits(tol=0.01))
    assert s is not None and 1.0 < s < 5.0
    assert not flagged(bounds(rows, shapes, Limits(slack=s)), 0.01)
    assert flagged(bounds(rows, shapes, Limits(slack=s - 0.05)), 0.01)


def test_pp1_larger_micro_batch_cannot_be_slower():
    a, sa = _uniform(_row(32, 0.0, tp=8, dp=8, pp=1, gb=512), 0.01)
    b, sb = _uniform(_row(64, 0.0, tp=8, dp=8, pp=1, gb=512), 0.01)
    b = replace(b, time_ms=2 * b.time_ms)
    bad = flagged(bounds([a, b], [sa, sb]), 0.01)
    assert set(bad) == {1} and bad[1].factor == pytest.approx(1.0)
    assert bad[1].excess == pytest.approx(1.0)


def test_split_bound_caps_the_less_split_row():
    # tp2 dp16 against tp4 dp8 (same pp, micro-batch, GPUs): equal work per GPU.
    b, sb = _uniform(_row(2, 0.0, tp=4, dp=8, pp=16, gpus=512), 0.05)
    a = _row(2, 0.0, tp=2, dp=16, pp=16, gpus=512)
    sa = replace(sb, tau=2 * sb.tau, f_max=2 * sb.f_max, b_max=2 * sb.b_max)
    m_b = 1536 / 8 / 2
    factor = (m_b + 2 * 15) / (m_b + 15)
    ok = replace(a, time_ms=b.time_ms * factor)
    bd = [x for x in bounds([ok, b], [sa, sb]) if x.kind == "split"]
    assert len(bd) == 1 and bd[0].row == 0 and bd[0].factor == pytest.approx(factor)
    assert bd[0].excess < 0
    slow = replace(a, time_ms=b.time_ms * factor * 1.3 + 200)
    bad = flagged(bounds([slow, b], [sa, sb]), 0.01)
    assert set(bad) == {0} and bad[0].kind == "split"


def test_the_project_model_taken_as_data_meets_every_bound():
    # Any model of the kind the criterion assumes must pass with no slack: the
    # project's own predictions of the held-out rows, priced by the benchmark.
    from research.vtrain import load_vtrain

    bench = _bench()
    rows = [r for r in load_vtrain(_ROOT / "data" / "vtrain" / "ground_truth_multi.csv")
            if r.params_b in (3.6, 39.1)]
    shapes, errs, _ = bench.priced(rows, bench.fitted_efficiency())
    assert len(rows) > 50 and len(shapes) == len(errs) == len(rows)
    assert model_as_data(rows, shapes, errs) <= 1e-9
    # ... while the measured times break some (the rows the benchmark flags).
    assert flagged(bounds(rows, shapes), 0.01)


def test_per_step_fit_recovers_a_planted_step_cost():
    # Measured = predicted + 2 ms per pipeline step + 5 ms, so the relative error of
    # each prediction is -(2 ms * steps + 5 ms) / measured.
    rows, errs = [], []
    for b in (1, 2, 4, 8):
        r = _row(b, 1000.0 + 7.0 * b, tp=1, dp=32, pp=4, gb=1024)
        steps = 1024 // 32 // b + 3
        rows.append(r)
        errs.append(-(2.0 * steps + 5.0) / r.time_ms)
    fit = per_step_fit(rows, errs)[(1, 4)]
    assert fit.rows == 4 and fit.r2 == pytest.approx(1.0)
    assert fit.per_step_s == pytest.approx(2e-3) and fit.intercept_s == pytest.approx(5e-3)
    # Adding the planted cost per step leaves only the intercept.
    fixed = with_step_cost(rows, errs, 2e-3)
    assert all(e * r.time_ms == pytest.approx(-5.0) for r, e in zip(rows, fixed, strict=True))
    # pp = 1 rows get nothing unless asked.
    one = [_row(2, 100.0, pp=1)]
    assert with_step_cost(one, [0.0], 1e-3) == [0.0]
    assert with_step_cost(one, [0.0], 1e-3, pipelined_only=False)[0] > 0


def test_layer_gemm_flops_grows_with_shape_below_the_ceiling():
    eff = Efficiency()
    peak = 312e12
    small = layer_gemm_flops(eff, hidden=1024, seq=1024, micro_batch=1, tp=8, peak_flops=peak)
    big = layer_gemm_flops(eff, hidden=8192, seq=2048, micro_batch=2, tp=2, peak_flops=peak)
    assert 0 < small < big < eff.gemm_max * peak


def test_limits_reject_nonsense():
    with pytest.raises(ValueError):
        Limits(slack=0.5)
    with pytest.raises(ValueError):
        Limits(tol=-0.1)
    with pytest.raises(ValueError):
        bounds([_row(2, 1.0)], [])


def _bench():
    spec = importlib.util.spec_from_file_location(
        "vtrain_consistency_bench", _ROOT / "research" / "studies" / "vtrain_consistency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, says", [
    (["--tol", "x"], "--tol: 'x' is not a finite number >= 0"),
    (["--tol", "abc"], "--tol: 'abc' is not a finite number >= 0"),
    (["--slack", "0.5"], "--slack: '0.5' is not a finite number >= 1"),
    (["--slack", "-1"], "--slack: '-1' is not a finite number >= 1"),
    (["--slack", "inf"], "--slack: 'inf' is not a finite number >= 1"),
    (["--c-slack", "nan"], "--c-slack: 'nan' is not a finite number >= 0"),
    (["--tol", "-1"], "--tol: '-1' is not a finite number >= 0"),
    (["--bogus"], "unrecognized arguments: --bogus")])
def test_bad_cli_input_is_one_line_exit_2(argv, says, capsys):
    assert _bench().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vtrain_consistency: error:")
    assert says in err[0]


def test_out_naming_a_file_is_one_line_exit_2(tmp_path, capsys):
    """--out is the folder the report goes into: a path ending in .md is refused before
    any work, and nothing is created."""
    out = tmp_path / "x.md"
    assert _bench().main(["--no-single", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "looks like a file" in err[0]
    assert not out.exists()


def test_missing_data_is_one_line_exit_2(tmp_path, capsys):
    assert _bench().main(["--data-dir", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0]


def test_unwritable_out_is_one_line_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _bench().main(["--no-single", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0]


def test_help_exits_0(capsys):
    assert _bench().main(["--help"]) == 0
    assert "--slack" in capsys.readouterr().out


def test_benchmark_flags_the_contradicting_held_out_rows(tmp_path, capsys):
    assert _bench().main(["--no-single", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "vtrain_consistency.md").read_text()
    # The examples that motivated the check: mbs 64 slower than mbs 32 at pp = 1, and
    # 39.1B tp2 dp16 pp16 against tp4 dp8 pp16.
    rows = {line.split(" | ")[0][2:] for line in text.splitlines()
            if line.startswith("| ") and "B tp" in line.split(" | ")[0]}
    assert {"3.6B tp8 dp8 pp1 mbs64 gb512", "39.1B tp2 dp16 pp16 mbs2 gb1536"} <= rows
    # ... and not their siblings, which bound them.
    assert not rows & {"3.6B tp8 dp8 pp1 mbs32 gb512", "39.1B tp4 dp8 pp16 mbs2 gb1536"}
