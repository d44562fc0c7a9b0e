"""The Hopper fits' study code (research/hopper_fit.py, research/fit_cv.py): the rule
that picks how many parameters a fit moves, the variants, the committed profiles
inside the fit's bounds and priced as the fit prices them."""

from pathlib import Path

import pytest

from merak_sim.costs.calibrated_hopper import (
    A100_PROFILES,
    HOPPER_PROFILES,
    a100_cost_model,
    hopper_cost_model,
)
from merak_sim.sim.api import simulate
from merak_sim.validation.public_runs import load_rows, row_setup
from research.fit_cv import Variant, choose, cross_validate
from research.hopper_fit import (
    A100_BOUNDS,
    BOUNDS,
    CHOSEN,
    VARIANTS,
    HopperParams,
    family_of,
    published_values,
)

ROOT = Path(__file__).resolve().parents[2]


def test_cross_validation_prefers_the_variant_that_extrapolates():
    # Rows are (family, x, y) with y = 2x; "wiggly" fits each row of its training
    # families exactly but guesses 0 elsewhere, "line" fits one slope.
    rows = [("a", 1.0, 2.0), ("a", 2.0, 4.0), ("b", 3.0, 6.0), ("c", 4.0, 8.0)]
    line, wiggly = Variant("line", ("slope",)), Variant("wiggly", ("s1", "s2", "s3"))

    def fit(train, v):
        if v is line:
            return ("line", sum(y for _f, _x, y in train) / sum(x for _f, x, _y in train))
        return ("table", {x: y for _f, x, y in train})

    def loss(test, params):
        kind, p = params
        pred = [p * x if kind == "line" else p.get(x, 0.0) for _f, x, _y in test]
        return sum(abs(q - y) for q, (_f, _x, y) in zip(pred, test, strict=True)) / len(test)

    res = cross_validate(rows, lambda r: r[0], (wiggly, line), fit, loss)
    assert [r.variant for r in res] == [wiggly, line]
    assert set(res[0].fold_losses) == {"a", "b", "c"}
    assert choose(res).variant is line and res[1].score == 0.0
    # A tie goes to fewer free parameters.
    tied = cross_validate(rows, lambda r: r[0], (wiggly, line), fit, lambda t, p: 1.0)
    assert choose(tied).variant is line
    with pytest.raises(ValueError, match="two or more"):
        cross_validate(rows[:2], lambda r: r[0], (line,), fit, loss)


def test_megatron_variants_start_from_published_defaults_by_family():
    names = [v.name for v in VARIANTS["megatron-te"]]
    assert names[0] == "published" and VARIANTS["megatron-te"][0].free == ()
    assert published_values("megatron-te", ("gemm_max", "fp8_factor")) == {
        "gemm_max": 0.78, "fp8_factor": 0.87}
    assert [family_of({"model": m}) for m in ("GPT3-175B", "LLAMA2-7B", "Nemotron-8B")] \
        == ["GPT3", "LLAMA2", "Nemotron"]
    # The committed profile moves exactly the chosen variant's parameters.
    for profile, name in CHOSEN.items():
        win = next(v for v in VARIANTS[profile] if v.name == name)
        assert set(HOPPER_PROFILES[profile]) == set(win.free)


def test_committed_profiles_lie_inside_the_fit_bounds_and_price_as_the_fit():
    for k, v in A100_PROFILES["a100-pytorch"].items():
        lo, hi = A100_BOUNDS[k]
        assert lo <= v <= hi, k
    for profile, values in HOPPER_PROFILES.items():
        for k, v in values.items():
            assert BOUNDS[k][0] <= v <= BOUNDS[k][1], (profile, k)
    row = load_rows(ROOT / "data" / "public-runs" / "llmfoundry.csv")[0]
    model, cluster, cfg = row_setup(row)

    def run(cm):
        return simulate(model, cluster, cfg, cost_model=cm, engine="evaluator",
                        sub_cluster=True, keep_trace=False).iteration_time_s

    for profile in HOPPER_PROFILES:
        assert run(HopperParams.committed(profile).cost_model()) == pytest.approx(
            run(hopper_cost_model(profile)), rel=1e-12)
    assert run(HopperParams.committed("a100-pytorch").cost_model()) == pytest.approx(
        run(a100_cost_model()), rel=1e-12)
