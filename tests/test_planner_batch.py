"""The planner's batched passes give the per-candidate floats exactly: stacked bounds
(:func:`~merak_sim.planner.bounds.bound_values`) and one-micro-batch screens
(:func:`~merak_sim.planner.screen.kept_rows`, ``worst_excess``) row by row as
``lower_bound`` / ``kept_one`` on that row alone, templates built from the shared
unlowered schedule equal the generated one, and the point-to-point memo of
collective_time returns the priced value on every cluster."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from merak_sim.costs.comm import clear_caches, collective_time, inter_bandwidth_per_gpu
from merak_sim.hardware import get_cluster
from merak_sim.planner.bounds import bound_parts, bound_values, lower_bound
from merak_sim.planner.grid import rank_grid
from merak_sim.planner.screen import kept_one, kept_rows, worst_excess
from merak_sim.planner.space import Candidate
from merak_sim.planner.templates import built_schedule, eval_template, memory_template
from merak_sim.schedule import SCHEDULES, generate

_TIME = ("forward_s", "backward_s", "backward_input_s", "recompute_s", "optimizer_s",
         "grad_allreduce_s")
_POLICIES = ("none", "selective", "full", "stage-aware")


def _arrays(rng: np.random.Generator, n_st: int, zero_tail: bool) -> dict:
    # Awkward magnitudes so a different summation order would show in the last bits.
    out = {f: rng.uniform(1e-4, 3.0, n_st) * 10.0 ** rng.integers(-3, 3, n_st)
           for f in _TIME}
    if zero_tail:
        out["optimizer_s"] = np.zeros(n_st)
        out["grad_allreduce_s"] = np.zeros(n_st)
    out["activation_bytes"] = rng.uniform(1e6, 1e10, n_st)
    out["checkpoint_bytes"] = out["activation_bytes"] * rng.uniform(0.01, 0.5, n_st)
    return out


def _candidate(sched: str, pp: int, v: int, M: int, rc: str, overlap: bool) -> Candidate:
    return Candidate(dp=2, tp=1, pp=pp, virtual_stages=v, micro_batch_size=1,
                     microbatches=M, schedule=sched, recompute=rc, sequence_parallel=False,
                     tp_overlap="none", zero=0, overlap_param_gather=overlap)


@pytest.mark.parametrize("sched", list(SCHEDULES))
@pytest.mark.parametrize("zero_tail", [False, True])
def test_stacked_bounds_equal_each_candidate_bound(sched, zero_tail):
    spec = SCHEDULES[sched]
    rng = np.random.default_rng(2 * list(SCHEDULES).index(sched) + zero_tail)
    for pp, v in ((2, 2), (4, 2), (5, 4), (16, 2), (9, 1)):
        v = v if spec.interleaved else 1
        n_st, M = pp * v, int(rng.integers(1, 40))
        rows = [_arrays(rng, n_st, zero_tail) for _ in range(7)]
        stacked = {f: np.stack([r[f] for r in rows]) for f in _TIME}
        parts = bound_parts(stacked, spec.placement, pp, v)
        # Each part of the stack is the part of each row alone.
        for j, r in enumerate(rows):
            for p, q in zip(parts, bound_parts(r, spec.placement, pp, v), strict=True):
                assert np.array_equal(p[j], q)
        cands = [_candidate(sched, pp, v, M, _POLICIES[j % 4], bool(j % 3 == 1))
                 for j in range(len(rows))]
        vals = bound_values(parts, M, np.array([c.recompute == "full" for c in cands]),
                            np.array([c.overlap_param_gather for c in cands]),
                            spec.never_recompute(pp), spec.explicit_recompute)
        want = [lower_bound(c, r) for c, r in zip(cands, rows, strict=True)]
        # The same float, not just close: the table sorts and prints these.
        assert vals.tolist() == want


def test_bound_of_full_recompute_adds_what_must_follow_the_gradient():
    rng = np.random.default_rng(3)
    arr = _arrays(rng, 8, True)
    base = [lower_bound(_candidate("1f1b", 8, 1, 16, rc, False), arr)
            for rc in ("none", "full")]
    assert base[1] > base[0]
    # An explicit re-forward may run while waiting: no more than under 1F1B.
    pre = lower_bound(_candidate("pre-recompute", 8, 1, 16, "full", False), arr)
    assert base[0] <= pre <= base[1]


@pytest.mark.parametrize("sched", ["1f1b", "shifted-critical-path", "interleaved-1f1b",
                                   "zb-v", "last-no-recompute"])
def test_stacked_screens_equal_each_candidate_screen(sched):
    spec = SCHEDULES[sched]
    rng = np.random.default_rng(len(sched))
    for pp in (2, 4, 8):
        v = 2 if spec.interleaved else 1
        grid = rank_grid(spec.placement, pp, v)
        rows = [_arrays(rng, pp * v, True) for _ in range(8)]
        rcs = [_POLICIES[j % 4] for j in range(len(rows))]
        kept = kept_rows(grid, np.stack([r["checkpoint_bytes"] for r in rows]),
                         np.stack([r["activation_bytes"] for r in rows]),
                         np.array([rc not in ("none", "selective") for rc in rcs]),
                         np.array([rc == "full" for rc in rcs]), spec.never_recompute(pp))
        for j, (r, rc) in enumerate(zip(rows, rcs, strict=True)):
            one = kept_one(_candidate(sched, pp, v, 8, rc, False), r)
            assert np.array_equal(kept[j], one)
        if spec.never_recompute(pp):
            # Full recompute keeps every activation on the never-recompute rank.
            full = rcs.index("full")
            last = grid[:, pp - 1]
            assert kept[full][pp - 1] == rows[full]["activation_bytes"][last].max()
        need = rng.uniform(0, 2e10, (3, 4, pp))
        ex, at = worst_excess(need, 1e10)
        for i in range(3):
            for z in range(4):
                e1, r1 = worst_excess(need[i, z], 1e10)
                assert (ex[i, z], at[i, z]) == (e1, r1)
                assert e1 == need[i, z].max() - 1e10


@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_templates_from_the_shared_schedule_equal_generate(sched):
    spec = SCHEDULES[sched]
    pp, v = 4, (2 if spec.interleaved else 1)
    M = 8
    built = built_schedule(sched, pp, M, v)
    assert built == spec.build(pp, M, v)
    assert eval_template(sched, pp, M, v).schedule == generate(sched, pp, M, v)
    assert memory_template(sched, pp, M, v).pp == pp


def test_p2p_memo_returns_the_priced_value_on_each_cluster():
    rng = random.Random(13)
    cluster = get_cluster("dgx-h100", nodes=4)
    slower = replace(cluster, inter=replace(cluster.inter,
                                            bandwidth_Bps=cluster.inter.bandwidth_Bps / 5))
    clear_caches()
    for _ in range(300):
        a, b = rng.randrange(32), rng.randrange(32)
        nbytes = rng.choice([0.0, 1.0, 2.0**20, rng.uniform(1e3, 1e9)])
        for cl in (cluster, slower, cluster):
            if a == b or nbytes == 0:
                want = 0.0
            elif cl.same_node(a, b):
                want = cl.intra.time(nbytes)
            else:
                want = cl.inter.latency_s + nbytes / inter_bandwidth_per_gpu(cl)
            assert collective_time("p2p", nbytes, (a, b), cl) == want
            assert collective_time("p2p", nbytes, (a, b), cl) == want  # warm
    # The slower cluster is priced apart, not answered from the other's entry.
    far = (0, 31)
    assert (collective_time("p2p", 1e8, far, slower)
            > collective_time("p2p", 1e8, far, cluster))
