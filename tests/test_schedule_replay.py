"""Unit-cost makespans of Merak's schedule analysis (Lai et al., TPDS 2023) and classic bubble fractions."""

import pytest

from merak_sim.schedule import generate, replay, stage_aware_fractions

TOY = {
    (4, 8): {"1f1b": 44, "pre-recompute": 41, "last-no-recompute": 39,
             "shifted-critical-path": 38},
    (8, 16): {"1f1b": 92, "pre-recompute": 85, "last-no-recompute": 83,
              "shifted-critical-path": 82},
}


@pytest.mark.parametrize("S, M", list(TOY))
@pytest.mark.parametrize("name", list(TOY[(4, 8)]))
def test_toy_makespans(S, M, name):
    assert replay(generate(name, S, M), f=1, b=2, r=1, recompute=1.0).makespan == TOY[(S, M)][name]


@pytest.mark.parametrize("S, M, expected, none", [(4, 8, 36.8, 33), (8, 16, 78.1, 69)])
def test_toy_stage_aware_and_no_recompute(S, M, expected, none):
    c = list(stage_aware_fractions(S, 0.75))
    c[S - 2] = c[S - 3]
    got = replay(generate("shifted-critical-path", S, M), recompute=c).makespan
    assert got == pytest.approx(expected, abs=0.05)
    assert replay(generate("1f1b", S, M), recompute=0.0).makespan == none


def test_stage_aware_fractions_examples():
    assert stage_aware_fractions(4, 0.75) == pytest.approx((0.75, 0.625, 0.25, 0.0))
    assert stage_aware_fractions(8, 0.75) == pytest.approx(
        (0.75, 0.7083, 0.65, 0.5625, 0.4167, 0.125, 0.0, 0.0), abs=1e-3)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (4, 8), (8, 32), (5, 7), (16, 64)])
def test_classic_bubble_fraction(name, p, m):
    res = replay(generate(name, p, m), f=1, b=2)
    assert res.makespan == (m + p - 1) * 3
    for idle in res.idle:
        assert idle / res.makespan == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("v", [1, 2, 4])
def test_interleaved_bubble_divided_by_v(p, m, v):
    res = replay(generate("interleaved-1f1b", p, m, v), f=1, b=2)
    assert res.makespan == pytest.approx(m * 3 + (p - 1) * 3 / v)


def test_split_backward_beats_1f1b_with_same_memory():
    from merak_sim.schedule import validate

    zb, base = generate("1f1b-split", 4, 8), generate("1f1b", 4, 8)
    assert replay(zb, b=2, w=1).makespan == 3 * 8 + 2 * 3 < replay(base, b=2).makespan
    assert validate(zb).peak_in_flight == validate(base).peak_in_flight


def test_communication_latency_lengthens_makespan():
    s = generate("1f1b", 4, 8)
    assert replay(s, comm=0.5).makespan > replay(s).makespan
