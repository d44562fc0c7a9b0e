"""The planner's bulk passes are exact: blocks expand to the candidates, the relaxed
sweep gives every candidate the bound and memory screen of the per-candidate
functions, the columnar rows give the same table as dict rows, the identity memo of
collective_time returns the priced value, and the best-first search finds the
exhaustive best on random small spaces."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from merak_sim.costs.calibrated import calibrated_cost_model
from merak_sim.costs.comm import COLLECTIVES, clear_caches, collective_time
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.planner import SearchSpace, search
from merak_sim.planner.bounds import lower_bound
from merak_sim.planner.relaxed import RelaxedPricer
from merak_sim.planner.report import new_counts
from merak_sim.planner.rows import RowBook, ranked_table
from merak_sim.planner.screen import quick_memory
from merak_sim.planner.space import Block, candidate_blocks
from merak_sim.planner.sweep import relaxed_sweep
from merak_sim.progress import Progress
from merak_sim.schedule import SCHEDULES

FULL = SearchSpace(cp=(1, 2), zero=(0, 1, 2, 3), attention=("flash", "unfused"),
                   overlap_param_gather=(False, True), micro_batch_sizes=(1, 2),
                   virtual_stages=(2,))


def _sweep(model, cluster, gbs, space, margin=0.0):
    rp = RelaxedPricer(model, cluster, calibrated_cost_model(), space.dtype)
    rows, counts, handed = RowBook(), new_counts(), []
    items = list(candidate_blocks(model, cluster.world_size, cluster.gpus_per_node, gbs,
                                  space))
    level0 = relaxed_sweep(items, rp, margin, rows, counts, Progress("off", ""),
                           handed.append)
    return rp, rows, counts, handed, items, level0


def test_block_candidates_are_the_enumeration():
    model = get_model("llama2-7b")
    for item in candidate_blocks(model, 16, 8, 32, FULL):
        if isinstance(item, Block):
            cands = list(item.candidates())
            assert len(cands) == len(item.variants)
            assert [item.candidate(i) for i in range(len(cands))] == cands
            assert len(set(cands)) == len(cands)


@pytest.mark.parametrize("margin", [0.0, 0.3])
def test_sweep_equals_the_per_candidate_screens(margin):
    model, cluster = get_model("llama2-7b"), get_cluster("dgx-h100", nodes=2)
    rp, rows, counts, handed, items, level0 = _sweep(model, cluster, 32, FULL, margin)
    cap = rp.capacity_bytes * (1 - margin)
    n_block = sum(len(x.variants) for x in items if isinstance(x, Block))
    # The calibrated model covers every candidate: only rule-pruned singles are handed.
    assert counts["considered"] == n_block
    assert len(handed) == sum(not isinstance(x, Block) for x in items)
    live = {}
    for j in range(len(level0)):
        c = rows.block(int(level0.block_ids[j])).candidate(int(level0.positions[j]))
        live[c] = float(level0.bounds[j])
    pruned = {}
    for r in rows.dicts():
        pruned[tuple(r[k] for k in ("dp", "tp", "pp", "virtual_stages", "micro_batch_size",
                                    "schedule", "recompute", "sequence_parallel",
                                    "tp_overlap", "zero", "cp", "attention",
                                    "overlap_param_gather"))] = r
    memory = 0
    for item in items:
        if not isinstance(item, Block):
            continue
        for c in item.candidates():
            if c.pruned:
                assert c not in live
                continue
            arr = rp.arrays(c)
            excess, _r = quick_memory(c, {**arr, "state_bytes": arr["state_by_zero"][c.zero]},
                                      cap)
            if excess > 0:
                key = (c.dp, c.tp, c.pp, c.virtual_stages, c.micro_batch_size, c.schedule,
                       c.recompute, c.sequence_parallel, c.tp_overlap, c.zero, c.cp,
                       c.attention, c.overlap_param_gather)
                assert pruned[key]["shortfall_gib"] == excess / 2**30
                assert pruned[key]["reason"].startswith("memory: ")
                memory += 1
                continue
            # The same float as one candidate at a time, not just close.
            assert live[c] == lower_bound(c, arr)
    assert memory == counts["pruned_memory"] > 0
    assert list(level0.bounds) == sorted(level0.bounds)


def test_columnar_rows_give_the_dict_rows_table():
    model, cluster = get_model("gpt-2.5b"), get_cluster("paper-3090", nodes=2)
    _rp, rows, _c, _h, _items, level0 = _sweep(model, cluster, 16, FULL)
    n = len(level0) // 2
    rows.extend(level0.block_ids[n:], level0.positions[n:], "bounded",
                np.array(["bounded: test"] * (len(level0) - n), dtype=object),
                bounds=level0.bounds[n:])
    as_dicts = list(rows.dicts())
    assert len(as_dicts) == len(rows)
    pd.testing.assert_frame_equal(ranked_table(rows), ranked_table(as_dicts))


def test_collective_memo_returns_the_priced_value():
    rng = random.Random(7)
    cluster = get_cluster("dgx-h100", nodes=64)
    slower = replace(cluster, inter=replace(cluster.inter,
                                            bandwidth_Bps=cluster.inter.bandwidth_Bps / 3))
    for _ in range(200):
        kind = rng.choice([k for k in COLLECTIVES if k != "p2p"])
        p = rng.choice([2, 4, 8, 16, 32, 64])
        stride = rng.choice([1, 2, 8])
        ranks = tuple(range(0, p * stride, stride))
        nbytes = rng.choice([0.0, 1.0, 4096.0, rng.uniform(1e3, 1e10)])
        clear_caches()
        cold = collective_time(kind, nbytes, ranks, cluster)
        clear_caches()
        cold_slow = collective_time(kind, nbytes, ranks, slower)
        # Warm: the same objects, equal copies, and the other cluster interleaved.
        assert collective_time(kind, nbytes, ranks, cluster) == cold
        assert collective_time(kind, nbytes, tuple(list(ranks)), cluster) == cold
        assert collective_time(kind, nbytes, ranks, slower) == cold_slow
        assert collective_time(kind, nbytes, ranks, cluster) == cold


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_best_first_finds_the_exhaustive_best_on_random_spaces(seed):
    rng = random.Random(seed)
    names = list(SCHEDULES)
    space = FULL.with_(
        schedules=tuple(rng.sample(names, 4)),
        zero=tuple(sorted(rng.sample([0, 1, 2, 3], 2))),
        recompute=tuple(rng.sample(["none", "selective", "full", "stage-aware"], 2)),
        cp=tuple(rng.sample([1, 2], rng.choice([1, 2]))),
        attention=(rng.choice(["flash", "unfused"]),))
    model, cluster, gbs = "gpt-2.5b", "paper-3090", 16
    try:
        full = search(model, cluster, gbs, nodes=2, space=space, top_k=3, confirm=False,
                      exhaustive=True)
    except ValueError:
        with pytest.raises(ValueError):
            search(model, cluster, gbs, nodes=2, space=space, top_k=3, confirm=False)
        return
    fast = search(model, cluster, gbs, nodes=2, space=space, top_k=3, confirm=False)
    assert fast.best_config == full.best_config
    ran = ["best", "confirmed", "evaluated"]

    def top(res):
        return res.table[res.table.status.isin(ran)].time_s.nsmallest(3).tolist()

    assert top(fast) == pytest.approx(top(full), rel=1e-12)
    assert fast.counts["considered"] == full.counts["considered"] == len(fast.table)


def test_group_ranks_memo_equals_the_layout():
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.comm import group_ranks
    from merak_sim.layout import RankLayout

    rng = random.Random(11)
    for _ in range(300):
        dp, tp, pp, cp = (rng.choice([1, 2, 4]), rng.choice([1, 2, 8]), rng.choice([1, 2, 4]),
                          rng.choice([1, 2]))
        cfg = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch_size=1,
                             global_batch_size=dp * 4)
        kind = rng.choice(["tp", "dp", "pp", "cp", "tied"])
        at = (rng.randrange(pp), rng.randrange(dp), rng.randrange(tp))
        lay = RankLayout(dp, tp, pp, cp)
        want = lay.group(kind, lay.rank(*at))
        assert group_ranks(kind, cfg, *at) == want
        assert group_ranks(kind, cfg, *at) == want  # warm


def test_sync_groups_memo_equals_the_layout():
    from merak_sim.config import ParallelConfig
    from merak_sim.costs.sharded_dp import sync_groups
    from merak_sim.layout import RankLayout

    rng = random.Random(5)
    for _ in range(200):
        dp, tp, pp, cp = (rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 2, 4]),
                          rng.choice([1, 2]))
        zero = rng.choice([0, 1, 3])
        group = rng.choice([g for g in (0, 2) if g == 0 or (g < dp * cp and dp * cp % g == 0)])
        cfg = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch_size=1,
                             global_batch_size=dp * 4, zero=zero if dp * cp > 1 else 0,
                             zero_group=group if zero and dp * cp > 1 else 0)
        pp_rank, tp_rank = rng.randrange(pp), rng.randrange(tp)
        lay = RankLayout(dp, tp, pp, cp)
        ranks = tuple(sorted(lay.rank(pp_rank, d, tp_rank, c)
                             for d in range(dp) for c in range(cp)))
        g = (cfg.shard_group if cfg.zero else 0) or len(ranks)
        want = (ranks, ranks[:g], ranks[::g])
        assert sync_groups(cfg, pp_rank, tp_rank) == want
        assert sync_groups(cfg, pp_rank, tp_rank) == want  # warm


class _NoRanges:
    """The calibrated model with tables that do not name their layer ranges, so the
    relaxation cannot rebuild them and every candidate is priced exactly."""

    def __init__(self) -> None:
        self.inner = calibrated_cost_model()

    def cost_table(self, model, cluster, config, partition=None):
        tab = self.inner.cost_table(model, cluster, config, partition)
        return replace(tab, meta={k: v for k, v in tab.meta.items() if k != "ranges"})

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_candidates_without_relaxed_arrays_are_priced_exactly_in_order():
    space = FULL.with_(schedules=("1f1b", "zb-h1"), cp=(1,), zero=(0, 1),
                       attention=("flash",), overlap_param_gather=(False,))
    args = ("gpt-2.5b", "paper-3090", 16)
    fast = search(*args, nodes=2, space=space, top_k=3, confirm=False,
                  cost_model=_NoRanges())
    full = search(*args, nodes=2, space=space, top_k=3, confirm=False,
                  cost_model=_NoRanges(), exhaustive=True)
    assert fast.best_config == full.best_config
    assert fast.counts["considered"] == full.counts["considered"] == len(fast.table)
    ran = ["best", "confirmed", "evaluated"]
    assert (fast.table[fast.table.status.isin(ran)].time_s.nsmallest(3).tolist()
            == pytest.approx(full.table[full.table.status.isin(ran)].time_s.nsmallest(3)
                             .tolist(), rel=1e-12))
    # Every candidate went the exact way, and the exact bounds still cut some.
    assert fast.counts["bounded"] > 0
