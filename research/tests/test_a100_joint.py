"""The joint A100 fit (research.a100_joint): the shared / per-stack split and its
memo, the loss weighting, the bounds intersection, a planted-parameter recovery on two
synthetic sets, the reduction to the vTrain fit, and the benchmark's bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from merak_sim.validation.public_runs import load_rows
from research import a100_joint as aj
from research import hopper_fit, vtrain
from research.studies import a100_joint_fit

DATA = Path(__file__).resolve().parents[2] / "data"


def _counting(name, own, bounds, start, fn):
    """A stack whose loss counts its calls (``calls`` list of inputs)."""
    calls = []

    def loss(x):
        calls.append(dict(x))
        return fn(x)
    return aj.Stack(name, own, bounds, start, loss), calls


def _two_stacks():
    a, a_calls = _counting("a", ("p",), {"p": (0.1, 10.0)}, {"p": 1.0},
                           lambda x: abs(math.log(x["s"] * x["p"])))
    b, b_calls = _counting("b", ("p", "q"), {"p": (0.1, 10.0), "q": (0.1, 10.0)},
                           {"p": 1.0, "q": 1.0},
                           lambda x: abs(math.log(x["s"] / x["p"])) + abs(math.log(x["q"])))
    return a, a_calls, b, b_calls


def test_own_parameters_are_kept_apart_and_the_memo_is_never_stale():
    a, a_calls, b, b_calls = _two_stacks()
    obj = aj.JointObjective([a, b], ("s",))
    x = {"s": 2.0, "a.p": 1.0, "b.p": 1.0, "b.q": 1.0}
    la, lb = obj.stack_loss(a, x), obj.stack_loss(b, x)
    assert a_calls == [{"s": 2.0, "p": 1.0}] and b_calls == [{"s": 2.0, "p": 1.0, "q": 1.0}]
    # Stack b's p is its own: changing it leaves a's loss and a's calls alone.
    x2 = {**x, "b.p": 8.0}
    assert obj.stack_loss(a, x2) == la and len(a_calls) == 1
    assert obj.stack_loss(b, x2) == pytest.approx(math.log(4.0)) != lb
    assert len(b_calls) == 2
    # And the other way round.
    x3 = {**x, "a.p": 0.5}
    assert obj.stack_loss(b, x3) == lb and len(b_calls) == 2
    assert obj.stack_loss(a, x3) == 0.0 and len(a_calls) == 2
    # A shared change reprices both; a revisited point is served its own value.
    x4 = {**x, "s": 3.0}
    assert obj(x4) == pytest.approx((math.log(3.0) + math.log(3.0)) / 2)
    assert (len(a_calls), len(b_calls)) == (3, 3)
    assert obj(x) == (la + lb) / 2 and (len(a_calls), len(b_calls)) == (3, 3)
    assert obj.evaluations == {"a": 3, "b": 3}


def test_real_stacks_see_only_their_inputs():
    """On a few real rows: a PyTorch-only parameter does not reach the vTrain rows' loss,
    a Megatron-only one does not reach llm-foundry's, while each moves its own."""
    vt = aj.vtrain_stack(vtrain.load_vtrain(DATA / "vtrain" / "ground_truth_single.csv")[:4])
    data = {"public-runs/llmfoundry": load_rows(DATA / "public-runs" / "llmfoundry.csv")}
    pt_rows = hopper_fit.fit_rows(data, aj.PYTORCH_PROFILE)[:2]
    pt = aj.pytorch_stack(pt_rows)
    obj = aj.JointObjective([vt, pt], aj.SHARED)
    x = {**aj.declared_start(), **{vt.key(p): v for p, v in vt.start.items()},
         **{pt.key(p): v for p, v in pt.start.items()}}
    lv, lp = obj.stack_loss(vt, x), obj.stack_loss(pt, x)
    xp = {**x, "pytorch.mem_bw_eff": 0.3}
    assert obj.stack_loss(vt, xp) == lv and obj.stack_loss(pt, xp) != lp
    xv = {**x, "vtrain.mem_bw_eff": 0.3}
    assert obj.stack_loss(pt, xv) == lp and obj.stack_loss(vt, xv) != lv
    assert obj.evaluations == {"vtrain": 2, "pytorch": 2}
    # The PyTorch loss is hopper_fit's own measure of those rows.
    assert len(pt_rows) == 2 and lp == pytest.approx(hopper_fit.mean_log_error(
        pt_rows, hopper_fit.HopperParams(pt.inputs(x, aj.SHARED), aj.PYTORCH_PROFILE)))


def test_each_set_weighs_the_same_whatever_its_rows():
    assert aj.joint_loss([0.1, 0.3]) == pytest.approx(0.2)
    big = aj.Stack("big", (), {}, {}, lambda x: sum([0.1] * 1000) / 1000)
    small = aj.Stack("small", (), {}, {}, lambda x: sum([0.5] * 10) / 10)
    obj = aj.JointObjective([big, small], ("s",))
    # Equal weights give 0.3; weighting by rows would give about 0.104.
    assert obj({"s": 1.0}) == pytest.approx(0.3)


def test_shared_bounds_are_the_intersection():
    assert aj.shared_bounds({"a": (0.0, 2.0)}, {"a": (1.0, 3.0)}, names=("a",)) == {
        "a": (1.0, 2.0)}
    with pytest.raises(ValueError, match="do not overlap"):
        aj.shared_bounds({"a": (0.0, 1.0)}, {"a": (2.0, 3.0)}, names=("a",))
    default = aj.shared_bounds()
    assert set(default) == set(aj.SHARED)
    for n, (lo, hi) in default.items():
        assert lo == max(vtrain.BOUNDS[n][0], hopper_fit.A100_BOUNDS[n][0])
        assert hi == min(vtrain.BOUNDS[n][1], hopper_fit.A100_BOUNDS[n][1])


def test_split_and_starts_are_the_declared_ones():
    assert set(aj.SHARED) | set(aj.VTRAIN_OWN) == set(vtrain.FIT_PARAMS)
    assert not set(aj.SHARED) & set(aj.PYTORCH_OWN)
    assert aj.declared_start() == {n: vtrain.START[n] for n in aj.SHARED}
    start = aj.pytorch_start()
    assert start["host_op_s"] == hopper_fit.A100_BOUNDS["host_op_s"][0]  # default 0, clipped
    assert (start["flash_max_fwd"], start["flash_max_bwd"]) == (0.73, 0.63)


def _mean_abs_log(pairs, f):
    return sum(abs(math.log(f(u) / t)) for u, t in pairs) / len(pairs)


def test_a_tiny_joint_fit_recovers_planted_shared_parameters():
    """Two synthetic sets share a planted ceiling s1 and half-point s2, each with its
    own parameter c. Set b alone pins only c / s1 (a ridge); set a pins s1 and its own
    c; together they pin all four, each within 1 %."""
    s1, s2, ca, cb = 0.7, 40.0, 3.0, 2.5
    rows_a = [(x, x / s1 + ca) for x in (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)]
    rows_b = [(y, cb * (y + s2) / s1) for y in (5.0, 10.0, 30.0, 100.0, 300.0)]
    own = {"c": (0.1, 100.0)}
    calls = []

    def loss_a(p):
        calls.append(p)
        return _mean_abs_log(rows_a, lambda x: x / p["s1"] + p["c"])
    a = aj.Stack("a", ("c",), own, {"c": 1.0}, loss_a)
    b = aj.Stack("b", ("c",), own, {"c": 1.0},
                 lambda p: _mean_abs_log(rows_b, lambda y: p["c"] * (y + p["s2"]) / p["s1"]))
    res = aj.joint_search([a, b], {"s1": 0.5, "s2": 10.0},
                          {"s1": (0.1, 1.0), "s2": (1.0, 1000.0)},
                          step=2.0, tol=1e-6, min_step=1.001, rounds=200, pattern=True)
    assert res.search.stopped_by_rule and res.search.loss < 1e-3
    assert res.shared == {"s1": pytest.approx(s1, rel=0.01), "s2": pytest.approx(s2, rel=0.01)}
    assert res.own == {"a": {"c": pytest.approx(ca, rel=0.01)},
                       "b": {"c": pytest.approx(cb, rel=0.01)}}
    assert res.losses["b"] == b.loss(res.values("b"))
    # Each distinct input of a set was priced once (the memo), and the two sets were
    # priced at different times (a step on b's own parameter leaves a alone).
    assert len(calls) == res.evaluations["a"] == len({tuple(c.values()) for c in calls})
    assert res.evaluations["a"] != res.evaluations["b"]


def test_one_stack_alone_is_the_vtrain_fit():
    """The joint machinery on the vTrain stack alone reproduces vtrain.fit exactly (the
    same start, order, bounds and stopping rule)."""
    rows = vtrain.load_vtrain(DATA / "vtrain" / "ground_truth_single.csv")[::360]
    ref = vtrain.fit(rows, rounds=2)
    search = {k: vtrain.SEARCH[k] for k in ("step", "tol", "min_step", "pattern")}
    res = aj.joint_search([aj.vtrain_stack(rows)], aj.declared_start(), aj.shared_bounds(),
                          rounds=2, **search)
    assert aj.vtrain_efficiency(res) == ref.params
    assert res.search.loss == pytest.approx(ref.loss, rel=1e-12)


def test_adoption_rule():
    assert aj.adoption_holds({"v": 6.35, "p": 3.17}, {"v": 6.85, "p": 3.5})
    assert not aj.adoption_holds({"v": 6.35, "p": 3.17}, {"v": 6.86, "p": 3.0})
    assert not aj.adoption_holds({"v": 6.35, "p": 3.17}, {"v": 6.0, "p": 3.7})
    with pytest.raises(ValueError):
        aj.adoption_holds({"v": 1.0}, {"p": 1.0})
    assert aj.error_stats([1.1, 0.9], [1.0, 1.0]) == pytest.approx((10.0, 0.0))


@pytest.mark.parametrize("argv, says", [
    (["--rounds", "0"], "--rounds: '0' is not a whole number >= 1"),
    (["--rounds", "x"], "--rounds: 'x' is not a whole number >= 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--fix", "bogus=1"], "--fix: 'bogus=1': name one of gemm_max"),
    (["--fix", "gemm_dim_half=1000"], "the value must be a number in [1, 256]"),
    (["--fix", "gemm_max"], "'gemm_max': the value must be a number in [0.3, 0.8]"),
    (["--data", "/nonexistent-merak-data"], "not found; pass --data")])
def test_bad_cli_input_is_one_line_exit_2(argv, says, capsys):
    assert a100_joint_fit.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("a100_joint_fit: error:")
    assert says in err[0]


def test_out_naming_a_folder_is_one_line_exit_2(tmp_path, capsys):
    assert a100_joint_fit.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a folder" in err[0]
