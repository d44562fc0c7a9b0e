"""The engine's fabric shortcuts (issue 34 item 5) change no result: link bundles,
and a tensor-parallel collective alone on links no other route crosses left off the
links, give byte-identical events and figures to one load per link with every flow
on the links, in representative and full mode, with degraded links and slowdowns;
without contention the engine equals the evaluator to 1e-9."""

import pytest

from merak_sim.sim import gpu as gpu_module
from merak_sim.sim.api import simulate
from merak_sim.sim.entities import Fabric

CASES = [
    dict(model="gpt3-175b", cluster="dgx-a100-80g", nodes=8,
         config=dict(dp=1, tp=8, pp=8, virtual_stages=2, micro_batch_size=1,
                     global_batch_size=16, schedule="interleaved-1f1b", recompute="full")),
    dict(model="llama2-13b", cluster="dgx-a100-80g", nodes=2,
         config=dict(dp=2, tp=2, pp=4, micro_batch_size=1, global_batch_size=16,
                     schedule="1f1b", recompute="full", zero=1), overlap_dp=True),
    dict(model="llama2-13b", cluster="dgx-a100-80g", nodes=2,
         config=dict(dp=2, tp=4, pp=2, micro_batch_size=1, global_batch_size=8,
                     schedule="zb-h1", recompute="none"), mode="full",
         slowdown={3: 1.5}, degraded_links={"gpu1.out": 0.3, "node0.nic.out": 0.5}),
]


def _per_link(env, topology, routes=None):
    """The reference fabric: every link its own bundle, nothing left off the links."""
    return Fabric(env, topology)


def _run(kw):
    r = simulate(engine="simpy", contention=True, sub_cluster=True, keep_trace=True, **kw)
    return r.to_dict(), r.events().to_csv(float_format=repr)


@pytest.mark.parametrize("kw", CASES, ids=["interleaved-tp8", "overlap-zero1", "full-whatif"])
def test_shortcuts_change_nothing(kw, monkeypatch):
    fast = _run(kw)
    monkeypatch.setattr(gpu_module, "Fabric", _per_link)
    assert _run(kw) == fast


@pytest.mark.parametrize("kw", CASES[:2], ids=["interleaved-tp8", "overlap-zero1"])
def test_without_contention_the_engine_is_the_evaluator(kw):
    common = dict(sub_cluster=True, keep_trace=False,
                  **{k: v for k, v in kw.items() if k != "overlap_dp"})
    ov = kw.get("overlap_dp", False)
    a = simulate(engine="simpy", contention=False, overlap_dp=ov, **common)
    b = simulate(engine="evaluator", overlap_dp=ov, **common)
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)
    for x, y in zip(a.ranks, b.ranks, strict=True):
        assert x.compute_s == pytest.approx(y.compute_s, rel=1e-9, abs=1e-12)
        assert x.exposed_comm_s == pytest.approx(y.exposed_comm_s, rel=1e-9, abs=1e-9)
        assert x.peak_memory_bytes == pytest.approx(y.peak_memory_bytes, rel=1e-9)
