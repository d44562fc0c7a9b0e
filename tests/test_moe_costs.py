"""MoE costs and memory (merak_sim.costs.moe): the all-to-all on the links it crosses,
tokens per expert and the grouped GEMMs' efficiency, imbalance, overlap, expert state
by ep / edp, refusals, and the notes that say where the time goes."""

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import CostModelError, inter_bandwidth_per_gpu
from merak_sim.costs.moe import a2a_time, moe_layer_cost
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model

CM = AnalyticCostModel()
QWEN = get_model("qwen3-30b-a3b")


def _cfg(**kw):
    base = dict(dp=16, ep=16, global_batch_size=64, dtype="bf16", attention="flash")
    return ParallelConfig(**(base | kw))


def _layer(model, cluster, cfg):
    eff = CM.efficiency_for(cluster)
    peak = CM.peak16(cluster, cfg)
    return moe_layer_cost(model, cluster, cfg, eff, peak, peak, 0)


def test_a2a_inside_a_node_and_across_nodes():
    cl = get_cluster("dgx-h100", nodes=2)
    n = 8e6
    inside = a2a_time(n, tuple(range(8)), cl)
    assert inside == pytest.approx(n * 7 / 8 / cl.intra.bandwidth_Bps + cl.intra.latency_s)
    both = a2a_time(n, tuple(range(16)), cl)
    inter = n * 8 / 16 / inter_bandwidth_per_gpu(cl)
    intra = n * 7 / 16 / cl.intra.bandwidth_Bps
    assert both == pytest.approx(max(inter, intra) + cl.intra.latency_s
                                 + cl.inter.latency_s)
    assert both > inside  # the NIC share is the slower link
    assert a2a_time(n, (3,), cl) == 0.0


def test_tokens_per_expert_and_a2a_bytes():
    cl = get_cluster("dgx-h100", nodes=2)
    c = _layer(QWEN, cl, _cfg())
    t = 4096  # one sequence per GPU, tp = cp = 1
    assert c.tokens_per_expert == pytest.approx(16 * t * 8 / 128)
    assert c.a2a_bytes == pytest.approx(2 * t * 8 * 2048 * 2)
    assert c.imbalance_s == 0.0
    assert c.a2a_exposed_fwd_s == c.a2a_fwd_s > 0


def test_imbalance_costs_the_busiest_rank():
    cl = get_cluster("dgx-h100", nodes=2)
    skew = QWEN.with_(moe=QWEN.moe.__class__(experts=128, top_k=8, expert_ffn=768,
                                             imbalance=1.5))
    even, busy = _layer(QWEN, cl, _cfg()), _layer(skew, cl, _cfg())
    assert busy.imbalance_s > 0
    assert busy.grouped_fwd_s + busy.grouped_bwd_s == pytest.approx(
        even.grouped_fwd_s + even.grouped_bwd_s + busy.imbalance_s)
    assert busy.a2a_fwd_s > even.a2a_fwd_s
    capped = skew.with_(moe=skew.moe.__class__(experts=128, top_k=8, expert_ffn=768,
                                               imbalance=1.5, capacity_factor=1.0))
    assert _layer(capped, cl, _cfg()).imbalance_s == 0.0


def test_grouped_gemm_efficiency_falls_with_tokens_per_expert():
    cl = get_cluster("dgx-h100", nodes=2)
    big = _layer(QWEN, cl, _cfg())
    small = _layer(QWEN.with_(seq_len=256), cl, _cfg())
    per_token_big = big.grouped_fwd_s / big.tokens_per_expert
    per_token_small = small.grouped_fwd_s / small.tokens_per_expert
    assert per_token_small > 1.5 * per_token_big


def test_overlap_hides_the_all_to_all_behind_compute():
    cl = get_cluster("dgx-h100", nodes=2)
    plain, hidden = _layer(QWEN, cl, _cfg()), _layer(QWEN, cl, _cfg(moe_a2a_overlap=True))
    assert hidden.a2a_fwd_s == plain.a2a_fwd_s
    assert hidden.a2a_exposed_fwd_s < plain.a2a_exposed_fwd_s


def test_expert_state_shrinks_with_ep_and_zero_over_edp():
    cl = get_cluster("dgx-h100", nodes=2)
    w8 = CM.cost_table(QWEN, cl, _cfg(ep=8)).stages[0]
    w16 = CM.cost_table(QWEN, cl, _cfg(ep=16)).stages[0]
    experts = 48 * 128 * 3 * 2048 * 768
    assert w8.weight_bytes - w16.weight_bytes == pytest.approx(2 * experts * (1 / 8 - 1 / 16))
    # ZeRO-1: the optimizer state of the experts is sharded over edp = 16 / ep.
    z8 = CM.cost_table(QWEN, cl, _cfg(ep=8, zero=1)).stages[0]
    z16 = CM.cost_table(QWEN, cl, _cfg(ep=16, zero=1)).stages[0]
    assert z8.optimizer_bytes == pytest.approx(z16.optimizer_bytes, rel=1e-9)
    assert z8.grad_allreduce_s > z16.grad_allreduce_s  # edp = 2 syncs expert grads


def test_flops_are_the_active_parameters():
    cl = get_cluster("dgx-h100", nodes=2)
    cfg = _cfg()
    table = CM.cost_table(QWEN, cl, cfg)
    assert table.stages[0].flops == pytest.approx(QWEN.training_flops(1), rel=1e-9)


@pytest.mark.parametrize("model,kw,msg", [
    ("qwen3-30b-a3b", dict(dp=16, ep=16), None),
    ("mixtral-8x7b", dict(dp=16, ep=16), "ep=16 does not divide the 8 experts"),
    ("llama3-8b", dict(dp=8, ep=2), "needs an MoE model"),
    ("qwen3-30b-a3b", dict(dp=10, ep=1, etp=5), "etp=5 does not divide the expert ffn"),
])
def test_refusals_are_one_line(model, kw, msg):
    cl = get_cluster("dgx-h100", nodes=2)
    cfg = ParallelConfig(global_batch_size=80, **kw)
    if msg is None:
        CM.check(get_model(model), cl, cfg)
        return
    with pytest.raises(CostModelError, match=msg) as e:
        CM.check(get_model(model), cl, cfg)
    assert "\n" not in str(e.value)


def test_notes_say_where_the_time_goes():
    cl = get_cluster("dgx-h100", nodes=2)
    notes = CM.cost_table(QWEN, cl, _cfg()).notes
    moe = [n for n in notes if n.startswith("MoE")]
    assert len(moe) == 3
    assert "all-to-all" in moe[2] and "grouped GEMM" in moe[2] and "imbalance" in moe[2]
    assert not any(n.startswith("MoE") for n in CM.cost_table(
        get_model("llama3-8b"), cl, ParallelConfig(dp=16, global_batch_size=64)).notes)
