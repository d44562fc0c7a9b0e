"""Context-parallel variants (issue 36 item 4; merak_sim.costs.cp): each variant's
bytes, its overlap and its working memory against the formulas in the module docstring
(Megatron's --cp-comm-type; Llama 3 sec. 3.3.2; Ulysses arXiv:2309.14509; USP
arXiv:2405.07719)."""

from __future__ import annotations

import dataclasses

import pytest

from merak_sim.config import CP_COMMS, ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import CostModelError
from merak_sim.costs.cp import check_cp_comm, cp_pass, cp_volumes, inner_a2a_size
from merak_sim.costs.ring import ring_pass
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model

H100x4 = get_cluster("dgx-h100", 4)
LLAMA = dataclasses.replace(get_model("llama3-8b"), seq_len=32768)  # 32 q, 8 kv heads


def _cfg(**kw) -> ParallelConfig:
    return ParallelConfig(**{"global_batch_size": 1, **kw})


def _fake_comm(log: list):
    """Collective prices proportional to bytes (1 ms per MB), recording each call."""
    def comm(kind, nbytes, ranks, cluster):
        log.append((kind, nbytes, len(ranks)))
        return nbytes / 1e9
    return comm


def test_config_validates_the_variant_and_ring_is_the_default():
    assert ParallelConfig().cp_comm == "ring" and CP_COMMS[0] == "ring"
    with pytest.raises(ValueError, match="unknown cp comm 'p2p'"):
        ParallelConfig(cp_comm="p2p")
    assert ParallelConfig.from_dict(_cfg(cp=2, cp_comm="a2a").to_dict()).cp_comm == "a2a"


def test_ring_variant_is_ring_pass_unchanged():
    c = _cfg(cp=4, tp=2)
    r = ring_pass(_fake_comm([]), H100x4, c, 0, 1e6, 4e-3, 40e-3)
    p = cp_pass(_fake_comm([]), H100x4, c, 0, LLAMA, 1e6, 4e-3, 40e-3)
    assert (p.fwd_total_s, p.fwd_exposed_s, p.bwd_total_s, p.bwd_exposed_s,
            p.fwd_bytes, p.bwd_bytes) == (r.fwd_total_s, r.fwd_exposed_s, r.bwd_total_s,
                                          r.bwd_exposed_s, r.fwd_bytes, r.bwd_bytes)
    assert p.working_bytes == 0.0


def test_all_gather_volume_is_exposed_and_holds_the_gathered_kv():
    cp, kv = 4, 1e6
    log: list = []
    p = cp_pass(_fake_comm(log), H100x4, _cfg(cp=cp, cp_comm="all-gather"), 0, LLAMA,
                kv, 1.0, 1.0)  # plenty of attention: still exposed (it waits for K/V)
    assert [k for k, _, _ in log] == ["all-gather", "reduce-scatter"]
    assert all(n == cp * kv and g == cp for _, n, g in log)
    assert p.fwd_exposed_s == p.fwd_total_s == pytest.approx(cp * kv / 1e9)
    assert p.bwd_exposed_s == pytest.approx(2 * cp * kv / 1e9)
    assert (p.fwd_bytes, p.bwd_bytes) == ((cp - 1) * kv, 2 * (cp - 1) * kv)
    assert p.working_bytes == 2 * cp * kv


def test_a2a_volume_counts_queries_keys_values_and_output():
    cp, kv = 4, 1e6
    q = kv / 2 * LLAMA.q_dim / LLAMA.kv_dim_per_rank(1)  # 4 x kv/2: 32 vs 8 heads
    vf, vb = cp_volumes("a2a", cp, q, kv)
    assert vf == vb == pytest.approx((cp - 1) / cp * (2 * q + kv))
    p = cp_pass(_fake_comm([]), H100x4, _cfg(cp=cp, cp_comm="a2a"), 0, LLAMA, kv, 1.0, 1.0)
    assert p.fwd_bytes == pytest.approx(vf) and p.working_bytes == pytest.approx(2 * q + kv)
    assert p.fwd_exposed_s == p.fwd_total_s > 0  # on the critical path, however long attn
    # Ulysses splits heads: cp must divide a TP rank's query and K/V heads.
    check_cp_comm(LLAMA, _cfg(cp=8, cp_comm="a2a"))
    with pytest.raises(ValueError, match="4 key/value heads"):
        check_cp_comm(LLAMA, _cfg(cp=8, tp=2, cp_comm="a2a"))


def test_a2a_ring_splits_into_inner_all_to_all_and_outer_ring():
    cp, kv = 16, 1e6
    c = _cfg(cp=cp, cp_comm="a2a+ring")
    a = inner_a2a_size(LLAMA, c, H100x4, 0)
    # largest divisor of 16 below 16 dividing 8 kv heads and staying in an 8-GPU node
    assert a == 8
    vf, vb = cp_volumes("a2a+ring", cp, 4 * kv / 2, kv, a)
    r = cp // a
    assert vf == pytest.approx((a - 1) / a * (2 * 2 * kv + kv) + (r - 1) * kv)
    assert vb - vf == pytest.approx((r - 1) * kv)
    # the ring part hides behind attention: huge attention leaves only the all-to-all
    p = cp_pass(_fake_comm([]), H100x4, c, 0, LLAMA, kv, 1e3, 1e3)
    assert p.fwd_exposed_s < p.fwd_total_s
    assert p.fwd_total_s - p.fwd_exposed_s == pytest.approx((r - 1) * kv / 1e9)


@pytest.mark.parametrize("kind", CP_COMMS)
def test_every_variant_prices_a_cost_table(kind):
    cm = AnalyticCostModel()
    base = cm.cost_table(LLAMA, H100x4, _cfg(cp=8)).stages[0]
    st = cm.cost_table(LLAMA, H100x4, _cfg(cp=8, cp_comm=kind)).stages[0]
    # compute is the same: the difference is the exposed exchange and working memory
    assert st.flops == base.flops
    assert st.forward_s > 0 and st.weight_bytes >= base.weight_bytes
    if kind != "ring":
        assert st.weight_bytes > base.weight_bytes


def test_bad_variant_for_the_model_is_one_line_cost_model_error():
    with pytest.raises(CostModelError, match="cp-comm a2a") as e:
        AnalyticCostModel().cost_table(LLAMA, H100x4, _cfg(cp=8, tp=2, cp_comm="a2a"))
    assert "\n" not in str(e.value)
