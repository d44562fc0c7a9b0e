"""Expert parallel folding in the one rank layout (merak_sim.layout) and the expert
degrees of ParallelConfig: groups partition each pipeline stage, Megatron's placement,
one-line refusals."""

import itertools

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout


@pytest.mark.parametrize("dp,tp,cp,pp,ep,etp,order", [
    (4, 2, 1, 2, 4, 1, "tp-cp-dp-pp"), (4, 2, 1, 2, 2, 2, "tp-cp-dp-pp"),
    (2, 2, 2, 1, 8, 1, "tp-cp-dp-pp"), (4, 2, 1, 2, 4, 2, "dp-tp-cp-pp"),
    (2, 1, 1, 4, 2, 1, "pp-dp-tp-cp"), (8, 1, 1, 1, 8, 1, "tp-cp-dp-pp"),
])
def test_expert_groups_fold_over_each_stage(dp, tp, cp, pp, ep, etp, order):
    lay = RankLayout(dp, tp, pp, cp, order, ep, etp)
    assert lay.edp * ep * etp == dp * tp * cp
    for kind, n in (("etp", etp), ("ep", ep), ("edp", lay.edp)):
        seen = set()
        for r in range(lay.world_size):
            g = lay.expert_group(kind, r)
            assert len(g) == n and r in g
            assert {lay.coords(x).pp for x in g} == {lay.coords(r).pp}
            assert all(lay.expert_group(kind, x) == g for x in g)
            seen.add(g)
        assert sorted(itertools.chain(*seen)) == list(range(lay.world_size))
    # One (etp, ep, edp) coordinate per rank of a stage: etp x ep x edp covers it.
    r = 0
    cube = {(a, b, c) for a in lay.expert_group("etp", r) for b in lay.expert_group("ep", r)
            for c in lay.expert_group("edp", r)}
    assert len(cube) == ep * etp * lay.edp


def test_megatron_order_puts_ep_peers_side_by_side():
    lay = RankLayout(dp=8, tp=2, pp=2, ep=4, etp=1)
    # Inner index = tp_idx + 2 dp_idx; ep groups are consecutive ranks of the stage.
    assert lay.expert_group("ep", 0) == (0, 1, 2, 3)
    assert lay.expert_group("ep", 21) == (20, 21, 22, 23)
    assert lay.expert_group("edp", 1) == (1, 5, 9, 13)
    lay2 = RankLayout(dp=4, tp=2, pp=1, ep=2, etp=2)
    assert lay2.expert_group("etp", 0) == (0, 1)
    assert lay2.expert_group("ep", 0) == (0, 2)
    assert lay2.expert_group("edp", 0) == (0, 4)


@pytest.mark.parametrize("kw,msg", [
    (dict(dp=2, tp=2, ep=8), "etp x ep = 1 x 8 does not divide the tp x cp x dp = 4"),
    (dict(dp=4, ep=2, etp=3), "etp x ep = 3 x 2 does not divide"),
    (dict(dp=2, ep=0), "ep must be an integer >= 1"),
    (dict(dp=2, moe_a2a_overlap=1), "moe_a2a_overlap must be true or false"),
])
def test_bad_expert_degrees_are_one_line(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        ParallelConfig(global_batch_size=8, **kw)
    assert "\n" not in str(e.value)


def test_config_round_trip_keeps_expert_degrees():
    c = ParallelConfig(dp=8, tp=2, ep=8, etp=2, moe_a2a_overlap=True, global_batch_size=16)
    assert ParallelConfig.from_dict(c.to_dict()) == c
    assert RankLayout.of(c).edp == 1
