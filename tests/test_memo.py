"""Memoisation on object identity (merak_sim.memo) and the cost models' memos built on
it (merak_sim.costs.comm, merak_sim.costs.ring): an entry keeps its objects alive, so
an id is never reused while the entry could answer for it, and the clearing functions
release them."""

from __future__ import annotations

import gc
import weakref
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from merak_sim.costs.comm import clear_caches, collective_time
from merak_sim.costs.ring import clear_ring_cache, ring_pass
from merak_sim.hardware import Cluster, get_cluster
from merak_sim.memo import IdentityMemo


class _Box:
    """A weak-referenceable stand-in for an immutable input."""


class _WeakCluster(Cluster):
    """A cluster that can be weakly referenced (Cluster itself has slots)."""


def _weak(cluster: Cluster) -> _WeakCluster:
    return _WeakCluster(**{f.name: getattr(cluster, f.name) for f in fields(cluster)})


def test_make_runs_once_per_identity_and_extra():
    memo, calls = IdentityMemo(), []
    a, b = tuple([1, 2]), tuple([1, 2])  # equal values, distinct objects

    def make(tag):
        calls.append(tag)
        return len(calls)

    assert memo.get((a,), ("x",), make, "a") == 1
    assert memo.get((a,), ("x",), make, "again") == 1
    assert memo.get((b,), ("x",), make, "b") == 2      # same value, other object
    assert memo.get((a,), ("y",), make, "a-y") == 3    # other extra
    assert memo.get((a,), ("x",), lambda: 99) == 1     # a closure works too
    assert calls == ["a", "b", "a-y"] and len(memo) == 3


def test_entries_keep_their_objects_alive_until_cleared():
    memo = IdentityMemo()
    box = _Box()
    ref = weakref.ref(box)
    memo.get((box,), (), lambda: "v")
    del box
    gc.collect()
    assert ref() is not None  # so its id cannot go to a new object meanwhile
    memo.clear()
    gc.collect()
    assert ref() is None and len(memo) == 0


def test_ids_of_dropped_objects_never_answer_for_new_ones():
    memo = IdentityMemo()
    for i in range(200):
        box = _Box()
        box.value = i
        assert memo.get((box,), (), lambda b=box: b.value) == i
        del box


def test_max_entries_empties_the_memo_before_storing():
    memo = IdentityMemo(max_entries=2)
    keep = [_Box() for _ in range(3)]
    for i, o in enumerate(keep):
        memo.get((o,), (), lambda i=i: i)
    assert len(memo) == 1  # emptied at the third store
    assert memo.get((keep[2],), (), lambda: "new") == 2
    assert memo.get((keep[0],), (), lambda: "new") == "new"
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        IdentityMemo(max_entries=0)


def test_a_failing_make_stores_nothing():
    memo = IdentityMemo()
    box = _Box()

    def boom():
        raise RuntimeError("no value")

    with pytest.raises(RuntimeError):
        memo.get((box,), (), boom)
    assert len(memo) == 0 and memo.get((box,), (), lambda: 7) == 7


def _clusters(n: int):
    """``n`` fresh two-node clusters with different network bandwidths, one at a time
    (each dropped before the next is made, so a memo that kept only ids would see them
    reused)."""
    base = get_cluster("dgx-a100-80g", nodes=2)
    for i in range(n):
        inter = replace(base.inter, bandwidth_Bps=base.inter.bandwidth_Bps * (1 + i / 7))
        yield replace(base, inter=inter)


def test_p2p_times_are_right_for_every_new_cluster():
    # p2p alone: the other collectives' value caches hold their clusters too.
    n = 3e8
    for cl in _clusters(60):
        share = cl.inter.bandwidth_Bps / cl.gpus_per_node
        assert collective_time("p2p", n, (0, 8), cl) == cl.inter.latency_s + n / share
        del cl


def test_collectives_are_right_for_every_new_cluster():
    n = 3e8
    for cl in _clusters(60):
        want = 2 * cl.inter.latency_s + n / (cl.inter.bandwidth_Bps / cl.gpus_per_node)
        got = collective_time("all-reduce", n, (0, 8), cl)  # one GPU per node: a ring
        assert got == pytest.approx(want, rel=1e-12)
        del cl


def test_ring_passes_are_right_for_every_new_cluster():
    cfg = SimpleNamespace(dp=1, tp=8, pp=1, cp=2)  # the cp ring joins rank 0 and 8
    kv = 2e8
    for cl in _clusters(60):
        t = cl.inter.latency_s + kv / (cl.inter.bandwidth_Bps / cl.gpus_per_node)
        assert ring_pass(collective_time, cl, cfg, 0, kv, 0.0, 0.0).fwd_total_s == t
        del cl


def _held_until(clear, ref) -> None:
    """The object behind ``ref`` stays alive (held by a memo) until ``clear()``."""
    gc.collect()
    assert ref() is not None
    clear()
    gc.collect()
    assert ref() is None


def test_clear_caches_releases_the_memoised_objects():
    cl = _weak(get_cluster("dgx-a100-80g", nodes=2))
    ref = weakref.ref(cl)
    collective_time("p2p", 1e6, (0, 8), cl)
    collective_time("all-reduce", 1e6, (0, 8, 1, 9), cl)
    ring_pass(collective_time, cl, SimpleNamespace(dp=1, tp=8, pp=1, cp=2), 0, 1e6, 0.0,
              0.0)
    del cl
    _held_until(clear_caches, ref)


def test_clear_ring_cache_releases_the_comm_function():
    cl = get_cluster("dgx-a100-80g", nodes=2)

    class Comm:
        def __call__(self, kind, nbytes, ranks, cluster):
            return collective_time(kind, nbytes, ranks, cluster)

    comm = Comm()
    ref = weakref.ref(comm)
    ring_pass(comm, cl, SimpleNamespace(dp=1, tp=8, pp=1, cp=2), 0, 1e6, 0.0, 0.0)
    del comm
    _held_until(clear_ring_cache, ref)


def test_ring_pass_rejects_non_integer_degrees_warm_or_cold():
    cl = get_cluster("dgx-h100", 1)
    ok = SimpleNamespace(dp=1, tp=1, pp=1, cp=4)
    bad = SimpleNamespace(dp=1.0, tp=1, pp=1, cp=4)  # equal to 1, hashes like 1
    ring_pass(collective_time, cl, ok, 0, 1e6, 1e-3, 2e-3)  # warm entry for dp=1
    with pytest.raises(ValueError, match="dp must be an integer"):
        ring_pass(collective_time, cl, bad, 0, 1e6, 1e-3, 2e-3)
    clear_ring_cache()
    with pytest.raises(ValueError, match="dp must be an integer"):
        ring_pass(collective_time, cl, bad, 0, 1e6, 1e-3, 2e-3)
