"""What the planner shares or builds in bulk gives the floats of the one-at-a-time
path exactly: relaxed arrays built together per block, the memory walk's affine
terms reused across policies, eval-template groups found with numpy, memoised ring
passes, and the ranked table's order (status, then time or bound, then decision
order)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.calibrated import calibrated_cost_model
from merak_sim.costs.comm import clear_caches, collective_time
from merak_sim.costs.ring import ring_pass
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.planner.relaxed import RelaxedPricer
from merak_sim.planner.rows import RowBook, ranked_table, row
from merak_sim.planner.space import Candidate
from merak_sim.planner.templates import eval_template, memory_template
from merak_sim.schedule import SCHEDULES, Kind, iter_actions


def _candidate(**kw) -> Candidate:
    base = dict(dp=1, tp=2, pp=4, virtual_stages=1, micro_batch_size=1, microbatches=8,
                schedule="1f1b", recompute="none", sequence_parallel=False,
                tp_overlap="none", zero=0)
    return Candidate(**{**base, **kw})


def test_relaxed_arrays_built_together_equal_each_alone():
    model, cluster = get_model("llama2-7b"), get_cluster("dgx-h100", nodes=2)
    together = RelaxedPricer(model, cluster, calibrated_cost_model(), "bf16")
    cands = [_candidate(tp=tp, sequence_parallel=sp, recompute=rc, pp=pp, virtual_stages=v)
             for tp in (1, 2) for sp in (False, True)[:tp] for rc in ("none", "selective")
             for pp, v in ((1, 1), (4, 1), (4, 2))]
    for pp, v in ((1, 1), (4, 1), (4, 2)):
        group = [c for c in cands if (c.pp, c.virtual_stages) == (pp, v)]
        keys = [(c.tp, c.cp, c.micro_batch_size, c.sequence_parallel, c.tp_overlap,
                 c.recompute == "selective", c.attention) for c in group]
        got = together.arrays_of(keys, pp, v)
        for c, arr in zip(group, got, strict=True):
            alone = RelaxedPricer(model, cluster, calibrated_cost_model(), "bf16").arrays(c)
            assert list(arr) == list(alone)
            for f in arr:
                assert arr[f].dtype == alone[f].dtype and np.array_equal(arr[f], alone[f])
                assert not arr[f].flags.writeable


def _walk_peak(mt, arrays, rank, cs):
    # The per-rank formula of the memory screen, written out once more.
    from merak_sim.planner.grid import rank_grid

    g = rank_grid(mt.placement, mt.pp, mt.virtual_stages)[:, rank]
    act, ck, inp = (arrays[f][g] for f in ("activation_bytes", "checkpoint_bytes",
                                           "input_bytes"))
    st = mt.states[rank]
    cs = np.asarray(cs, dtype=float)
    if len(st):
        base = st @ np.stack([act, inp, np.maximum(act, inp)], axis=1).reshape(-1)
        slope = st @ np.stack([ck - act, 0 * inp, 0 * act], axis=1).reshape(-1)
        peak = np.maximum((base[:, None] + slope[:, None] * cs[None, :]).max(axis=0), 0.0)
    else:
        peak = np.zeros_like(cs)
    return float(arrays["state_bytes"][g].sum()) + peak


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_affine_memory_terms_give_the_walk_peak_exactly(name):
    rng = np.random.default_rng(len(name))
    v = 2 if SCHEDULES[name].interleaved else 1
    mt = memory_template(name, 4, 8, v)  # every schedule accepts pp=4, M=8
    n = 4 * v
    act = rng.uniform(1e6, 1e10, n)
    arrays = {"activation_bytes": act, "checkpoint_bytes": act * rng.uniform(0.01, 0.5, n),
              "input_bytes": rng.uniform(1e5, 1e9, n), "state_bytes": rng.uniform(1e8, 1e11, n)}
    cs = np.arange(7) / 6
    aff = mt.affine(arrays)
    for r in range(4):
        assert np.array_equal(mt.peak_at(aff[r], cs), _walk_peak(mt, arrays, r, cs))
        assert mt.peak_at(aff[r], 0.5) == float(_walk_peak(mt, arrays, r, [0.5])[0])
        assert np.array_equal(mt.peak_bytes(arrays, r, cs), mt.peak_at(aff[r], cs))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_eval_template_groups_are_the_actions_of_each_kind(name):
    v = 2 if SCHEDULES[name].interleaved else 1
    t = eval_template(name, 4, 8, v)  # every schedule accepts pp=4, M=8
    sched, prog = t.schedule, t.prog
    explicit = {(a.stage, a.chunk, a.microbatch) for p in sched.programs
                for a in iter_actions(p) if a.kind is Kind.RECOMPUTE}
    want: dict[str, list] = {k: [] for k in ("f", "b", "i", "w", "ar", "opt")}
    for aid, a in enumerate(prog.actions):
        r, k = prog.rank_of_action[aid], a.kind
        if k in (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE):
            want["f"].append((aid, sched.model_stage(a)))
        elif k in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
            want["b" if k is Kind.BACKWARD else "i"].append(
                (aid, sched.model_stage(a), r, (r, a.chunk, a.microbatch) in explicit))
        elif k is Kind.BACKWARD_WEIGHT:
            want["w"].append((aid, sched.model_stage(a)))
        elif k is Kind.ALL_REDUCE:
            want["ar"].append((aid, r))
        elif k is Kind.OPTIMIZER:
            want["opt"].append((aid, r))
    got = {"f": (t.fwd_idx, t.fwd_g), "b": (t.b_idx, t.b_g, t.b_rank, t.b_explicit),
           "i": (t.i_idx, t.i_g, t.i_rank, t.i_explicit), "w": (t.w_idx, t.w_g),
           "ar": (t.ar_idx, t.ar_rank), "opt": (t.opt_idx, t.opt_rank)}
    for k, cols in got.items():
        assert list(zip(*(c.tolist() for c in cols))) == want[k], k
    assert t.xfer_boundary.tolist() == [
        x.key[1] if x.key[0] == "A" else x.key[1] - 1 for x in prog.transfers]
    if SCHEDULES[name].explicit_recompute:
        assert t.b_explicit.any() or t.i_explicit.any()


def test_ring_pass_memo_returns_the_priced_value():
    rng = random.Random(5)
    cluster = get_cluster("dgx-h100", nodes=8)
    slower = replace(cluster, inter=replace(cluster.inter,
                                            bandwidth_Bps=cluster.inter.bandwidth_Bps / 4))

    def doubled(kind, nbytes, ranks, cl):
        return 2 * collective_time(kind, nbytes, ranks, cl)

    for _ in range(100):
        cp = rng.choice([2, 4])
        tp = rng.choice([1, 2, 8])
        cfg = ParallelConfig(dp=64 // (tp * cp * 2), tp=tp, pp=2, cp=cp,
                             global_batch_size=64)
        args = (rng.randrange(2), rng.uniform(1e5, 1e9), rng.uniform(1e-4, 1e-1),
                rng.uniform(1e-4, 1e-1))
        clear_caches()
        cold = {(id(cm), id(cl)): ring_pass(cm, cl, cfg, *args)
                for cm in (collective_time, doubled) for cl in (cluster, slower)}
        for cm in (doubled, collective_time):
            for cl in (slower, cluster):
                assert ring_pass(cm, cl, cfg, *args) == cold[id(cm), id(cl)]
        assert cold[id(doubled), id(cluster)].fwd_total_s == pytest.approx(
            2 * cold[id(collective_time), id(cluster)].fwd_total_s)


def test_ranked_table_orders_by_status_then_time_then_decision():
    c = _candidate()
    book = RowBook()
    rows = [row(c, "pruned", "a"), row(c, "evaluated", "", time_s=2.0),
            row(c, "bounded", "b", bound_s=1.5), row(c, "evaluated", "", time_s=1.0),
            row(c, "best", "", time_s=1.2), row(c, "bounded", "c", bound_s=1.5),
            row(c, "confirmed", "", time_s=0.9), row(c, "pruned", "d", bound_s=0.1)]
    for i, r in enumerate(rows):
        r["dp"] = i  # the decision order, to read the ranking back
        book.append(r)
    table = ranked_table(book)
    assert table["dp"].tolist() == [4, 6, 3, 1, 2, 5, 7, 0]
    assert table["dp"].dtype == np.int64 and table["time_s"].dtype == float
    assert len(ranked_table(RowBook())) == 0
