"""The rank layout: rank <-> coordinates, groups, node of a rank, errors."""

from __future__ import annotations

import itertools

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.hardware import get_cluster
from merak_sim.layout import AXES, GROUP_KINDS, Coords, RankLayout, node_of

DEGREES = (1, 2, 3, 4)
GRID = [RankLayout(dp, tp, pp, cp) for dp, tp, pp, cp in
        itertools.product(DEGREES, DEGREES, DEGREES, (1, 2))]


@pytest.mark.parametrize("lay", GRID, ids=repr)
def test_round_trip(lay):
    seen = []
    for p, d, t, c in itertools.product(range(lay.pp), range(lay.dp), range(lay.tp),
                                        range(lay.cp)):
        r = lay.rank(p, d, t, c)
        assert lay.coords(r) == Coords(p, d, t, c)
        seen.append(r)
    assert sorted(seen) == list(range(lay.world_size))
    assert lay.world_size == lay.dp * lay.tp * lay.pp * lay.cp


def test_megatron_formula_without_cp():
    # rank = (pp * dp + dp_idx) * tp + tp_idx: tp fastest, then dp, then pp.
    lay = RankLayout(dp=3, tp=4, pp=2)
    for p, d, t in itertools.product(range(2), range(3), range(4)):
        assert lay.rank(p, d, t) == (p * 3 + d) * 4 + t
    assert lay.coords(17) == Coords(pp=1, dp=1, tp=1, cp=0)
    assert lay.rank(1) == 12  # missing coordinates are 0


def test_cp_sits_between_tp_and_dp():
    lay = RankLayout(dp=2, tp=2, pp=2, cp=2)
    assert [lay.rank(0, 0, t, c) for c in range(2) for t in range(2)] == [0, 1, 2, 3]
    assert lay.rank(0, 1) == 4
    assert lay.rank(1) == 8


def test_groups_match_hand_written_examples():
    # dp=2, tp=4, pp=2 (16 GPUs), Megatron's order.
    lay = RankLayout(dp=2, tp=4, pp=2)
    assert lay.groups("tp") == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert lay.groups("dp") == ((0, 4), (1, 5), (2, 6), (3, 7),
                                (8, 12), (9, 13), (10, 14), (11, 15))
    assert lay.groups("pp") == ((0, 8), (1, 9), (2, 10), (3, 11),
                                (4, 12), (5, 13), (6, 14), (7, 15))
    assert lay.group("tp", 13) == (12, 13, 14, 15)
    assert lay.group("dp", 3) == (3, 7)
    assert lay.group("cp", 6) == (6,)
    # pp=3: the tied embedding pairs the first and the last pipeline rank.
    lay = RankLayout(dp=1, tp=2, pp=3)
    assert lay.groups("pp") == ((0, 2, 4), (1, 3, 5))
    assert lay.groups("tied") == ((0, 4), (1, 5))
    assert lay.group("tied", 5) == (1, 5)
    assert lay.group("tied", 2) == (0, 4)  # a middle rank's slice
    assert RankLayout(2, 1, 1).groups("tied") == ((0,), (1,))


def test_old_mesh_creation_order():
    # Process groups were created by these loops; torch needs the same order on every
    # rank, and keeping it keeps runs identical.
    dp, tp, pp = 2, 2, 3

    def g(p, d, q):
        return (p * dp + d) * tp + q

    old = {
        "tp": [[g(p, d, q) for q in range(tp)] for p in range(pp) for d in range(dp)],
        "dp": [[g(p, d, q) for d in range(dp)] for p in range(pp) for q in range(tp)],
        "pp": [[g(p, d, q) for p in range(pp)] for d in range(dp) for q in range(tp)],
        "tied": [[g(0, d, q), g(pp - 1, d, q)] for d in range(dp) for q in range(tp)],
    }
    lay = RankLayout(dp, tp, pp)
    for kind, groups in old.items():
        assert [list(x) for x in lay.groups(kind)] == groups, kind


@pytest.mark.parametrize("lay", [RankLayout(2, 3, 2, 2), RankLayout(3, 2, 4),
                                 RankLayout(2, 2, 2, 2, order="pp-tp-dp-cp")], ids=repr)
def test_groups_partition_the_world(lay):
    for kind in AXES:
        groups = lay.groups(kind)
        flat = [r for grp in groups for r in grp]
        assert sorted(flat) == list(range(lay.world_size)), kind
        assert all(len(grp) == lay.degree(kind) for grp in groups)
        for grp in groups:
            for r in grp:
                assert lay.group(kind, r) == grp
                # members differ only in the group's own coordinate
                others = {tuple(v for f, v in lay.coords(x)._asdict().items() if f != kind)
                          for x in grp}
                assert len(others) == 1
    tied = lay.groups("tied")
    assert len(tied) == lay.world_size // lay.pp
    assert all(lay.coords(a).pp == 0 and lay.coords(b).pp == lay.pp - 1 for a, b in tied)


def test_other_orders():
    lay = RankLayout(dp=2, tp=2, pp=2, order="pp-tp-dp-cp")
    assert lay.rank(1, 0, 0) == 1
    assert lay.rank(0, 0, 1) == 2
    assert lay.rank(0, 1, 0) == 4
    assert lay.group("pp", 0) == (0, 1)


def test_of_config_and_nodes():
    cfg = ParallelConfig(dp=2, tp=4, pp=2, global_batch_size=4)
    lay = RankLayout.of(cfg)
    assert lay == RankLayout(2, 4, 2) and lay.world_size == cfg.world_size
    assert hash(lay) == hash(RankLayout(2, 4, 2))
    assert [node_of(r, 8) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    c = get_cluster("dgx-a100-80g", nodes=2)
    # A tp=4 group never straddles a node of 8 GPUs.
    for grp in lay.groups("tp"):
        assert len({c.node_of(r) for r in grp}) == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(dp=0, tp=1, pp=1), "dp must be an integer >= 1, got 0"),
    (dict(dp=1, tp=-2, pp=1), "tp must be an integer >= 1, got -2"),
    (dict(dp=1, tp=1, pp=2.0), "pp must be an integer >= 1, got 2.0"),
    (dict(dp=1, tp=1, pp=1, cp=0), "cp must be an integer >= 1, got 0"),
    (dict(dp=1, tp=1, pp=1, order="tp-dp-pp"), "order must list tp, cp, dp and pp"),
    (dict(dp=1, tp=1, pp=1, order="tp-tp-dp-pp"), "got 'tp-tp-dp-pp'"),
    (dict(dp=1, tp=1, pp=1, order=5), "order must be a string such as 'tp-cp-dp-pp'"),
])
def test_bad_layouts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RankLayout(**kwargs)


def test_bad_queries():
    lay = RankLayout(dp=2, tp=2, pp=2)
    with pytest.raises(ValueError, match="rank 8 outside 0..7"):
        lay.coords(8)
    with pytest.raises(ValueError, match="rank -1 outside 0..7"):
        lay.group("tp", -1)
    with pytest.raises(ValueError, match="pp index 2 outside 0..1"):
        lay.rank(2)
    with pytest.raises(ValueError, match="tp index 3 outside 0..1"):
        lay.rank(0, 0, 3)
    with pytest.raises(ValueError, match="unknown group kind 'ep'"):
        lay.groups("ep")
    assert set(GROUP_KINDS) == {"tp", "cp", "dp", "pp", "tied"}


def test_layout_key_is_plain_values_or_none():
    from types import SimpleNamespace

    from merak_sim.layout import layout_key

    assert layout_key(SimpleNamespace(dp=2, tp=4, pp=1)) == (2, 4, 1, 1, "tp-cp-dp-pp")
    assert layout_key(SimpleNamespace(dp=2, tp=4, pp=1, cp=2, order="dp-tp-cp-pp")) == \
        (2, 4, 1, 2, "dp-tp-cp-pp")
    # 2.0 == 2 would share a memo entry with 2: such values never make a key.
    assert layout_key(SimpleNamespace(dp=2.0, tp=4, pp=1)) is None
    assert layout_key(SimpleNamespace(dp=2, tp=4, pp=1, order=None)) is None
