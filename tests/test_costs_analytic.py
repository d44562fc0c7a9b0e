"""AnalyticCostModel: structure of the cost table, TP/DP/sub-pipelining effects, comms."""

import dataclasses

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel, CostModel, CostTable, Efficiency
from merak_sim.costs.comm import collective_time, group_ranks
from merak_sim.hardware import get_cluster
from merak_sim.model import ModelSpecError, get_model
from merak_sim.runtime_memory import reserve_bytes


def cfg(**kw):
    base = dict(dp=1, tp=1, pp=1, micro_batch_size=2, global_batch_size=16)
    base.update(kw)
    if "global_batch_size" not in kw:
        base["global_batch_size"] = base["dp"] * base["micro_batch_size"] * 8
    return ParallelConfig(**base)


M = get_model("gpt-8.3b")
C = get_cluster("dgx-a100-80g", nodes=4)


def test_protocol_and_stage_count():
    cm = AnalyticCostModel()
    assert isinstance(cm, CostModel)
    t = cm.cost_table(M, C, cfg(pp=4, virtual_stages=2, schedule="interleaved-1f1b"))
    assert isinstance(t, CostTable) and len(t.stages) == 8
    assert sum(s.layers for s in t.stages) == M.layers
    # 80 GB less the reserve for the CUDA context and NCCL buffers (runtime_memory)
    assert t.peak_flops == 312e12 and t.memory_capacity_bytes == 80e9 - reserve_bytes("A100-80GB")


def test_times_positive_and_consistent():
    t = AnalyticCostModel().cost_table(M, C, cfg(pp=4, dp=2, tp=2))
    for i, s in enumerate(t.stages):
        assert s.forward_s > 0 and s.backward_s > s.forward_s
        assert s.backward_input_s + s.backward_weight_s == pytest.approx(s.backward_s)
        assert s.grad_allreduce_s > 0 and s.optimizer_s > 0
        assert (s.send_activation_s == 0) == (i == 3)
        assert s.checkpoint_bytes < s.activation_bytes
    # Same layer counts in the middle -> identical middle stages, except the send
    # (stage 1 -> 2 crosses a node boundary: ranks 8.. sit on node 1).
    assert dataclasses.replace(t.stages[1], send_activation_s=0) == \
        dataclasses.replace(t.stages[2], send_activation_s=0)
    assert t.stages[1].send_activation_s > t.stages[0].send_activation_s
    # First stage carries the embedding, last the LM head.
    assert t.stages[3].forward_s > t.stages[1].forward_s
    assert t.stages[3].flops > t.stages[1].flops


def test_flops_sum_to_model_flops():
    c = cfg(pp=4, tp=2, micro_batch_size=1)
    t = AnalyticCostModel().cost_table(M, C, c)
    per_gpu = sum(s.flops for s in t.stages)
    assert per_gpu * c.tp == pytest.approx(M.training_flops(1))


def test_tp_divides_compute_and_adds_comm():
    cm = AnalyticCostModel()
    one = cm.cost_table(M, C, cfg(tp=1, pp=8)).stages[1]
    four = cm.cost_table(M, C, cfg(tp=4, pp=8)).stages[1]
    lay1, _, _ = cm.layer_costs(M, C, cfg(tp=1, pp=8))
    lay4, _, _ = cm.layer_costs(M, C, cfg(tp=4, pp=8))
    assert lay4.forward_s < lay1.forward_s / 2.5  # GEMMs divided (less efficient)
    comm = four.forward_s - four.layers * lay4.forward_s
    ar = collective_time("all-reduce", 2 * M.seq_len * M.hidden * 2, (0, 1, 2, 3), C)
    assert comm == pytest.approx(four.layers * 2 * ar)
    assert one.forward_s == pytest.approx(one.layers * lay1.forward_s)


def test_sequence_parallel_same_comm_volume_less_memory():
    cm = AnalyticCostModel()
    a = cm.cost_table(M, C, cfg(tp=4, pp=8)).stages[1]
    b = cm.cost_table(M, C, cfg(tp=4, pp=8, sequence_parallel=True)).stages[1]
    assert b.activation_bytes < a.activation_bytes
    assert b.forward_s == pytest.approx(a.forward_s, rel=0.1)


def test_sub_pipelined_tp_hides_comm_but_costs_efficiency():
    cm = AnalyticCostModel()
    base = cfg(tp=8, pp=8, micro_batch_size=4)
    sub = dataclasses.replace(base, tp_overlap="sub-pipelined", tp_overlap_parts=2)
    lay_b, _, _ = cm.layer_costs(M, C, base)
    lay_s, _, _ = cm.layer_costs(M, C, sub)
    assert lay_s.forward_s > lay_b.forward_s  # smaller GEMMs, more kernels
    big = get_cluster("dgx-a100-80g", nodes=8)
    a, b = cm.cost_table(M, big, base).stages[1], cm.cost_table(M, big, sub).stages[1]
    exposed_a = a.forward_s - a.layers * lay_b.forward_s
    exposed_b = b.forward_s - b.layers * lay_s.forward_s
    assert exposed_b < exposed_a / 2


def test_selective_recompute_charges_attention_core():
    cm = AnalyticCostModel()
    a = cm.cost_table(M, C, cfg(tp=2, pp=8)).stages[1]
    b = cm.cost_table(M, C, cfg(tp=2, pp=8, recompute="selective")).stages[1]
    assert b.backward_s > a.backward_s and b.activation_bytes < a.activation_bytes


def test_zero1_shards_optimizer():
    cm = AnalyticCostModel()
    a = cm.cost_table(M, C, cfg(dp=4, pp=8)).stages[1]
    b = cm.cost_table(M, C, cfg(dp=4, pp=8, zero=1)).stages[1]
    assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes / 4)
    assert b.weight_bytes == a.weight_bytes
    assert b.optimizer_s < a.optimizer_s


def test_efficiency_parameters_change_times():
    slow = AnalyticCostModel(efficiency=Efficiency(gemm_max=0.4))
    fast = AnalyticCostModel(efficiency=Efficiency(gemm_max=0.8))
    c = cfg(pp=8)
    # GEMM time doubles; memory-bound kernels do not change.
    assert slow.cost_table(M, C, c).stages[1].forward_s > \
        1.5 * fast.cost_table(M, C, c).stages[1].forward_s


def test_group_ranks_megatron_order():
    c = cfg(dp=2, tp=4, pp=2)
    assert group_ranks("tp", c, pp_rank=1, dp_rank=1) == (12, 13, 14, 15)
    assert group_ranks("dp", c, pp_rank=0, tp_rank=3) == (3, 7)


def test_collective_models():
    c = get_cluster("dgx-a100-80g", nodes=2)
    n = 1e9
    intra = collective_time("all-reduce", n, tuple(range(8)), c)
    bw = c.intra.bandwidth_Bps
    assert intra == pytest.approx(2 * 7 * c.intra.latency_s + 2 * 7 / 8 * n / bw)
    rs = collective_time("reduce-scatter", n, tuple(range(8)), c)
    ag = collective_time("all-gather", n, tuple(range(8)), c)
    assert rs + ag == pytest.approx(intra)
    across = collective_time("all-reduce", n, tuple(range(16)), c)
    assert across > intra
    # One GPU per node: inter-node ring on its 1/8 share of the node network.
    two = collective_time("all-reduce", n, (0, 8), c)
    assert two == pytest.approx(2 * c.inter.latency_s + n / c.inter_bandwidth_per_gpu_Bps)
    p_in = collective_time("p2p", n, (0, 1), c)
    p_out = collective_time("p2p", n, (0, 8), c)
    assert p_in < p_out
    assert collective_time("all-reduce", n, (3,), c) == 0.0
    with pytest.raises(ValueError, match="unknown collective 'bcast'"):
        collective_time("bcast", n, (0, 1), c)


def test_bad_configs_one_line_errors():
    cm = AnalyticCostModel()
    with pytest.raises(ModelSpecError, match="tp=3 does not divide 32 attention heads"):
        cm.cost_table(M, C, cfg(tp=3))
    with pytest.raises(ModelSpecError, match="exceeds the model's 72 layers"):
        cm.cost_table(M, get_cluster("dgx-a100-80g", nodes=16), cfg(pp=73))
    with pytest.raises(ValueError, match="needs dp\\*tp\\*pp = 64 GPUs"):
        cm.cost_table(M, get_cluster("dgx-a100-80g", nodes=1), cfg(dp=8, pp=8))


def test_explicit_partition_counts():
    t = AnalyticCostModel().cost_table(M, C, cfg(pp=4), partition=[10, 20, 22, 20])
    assert [s.layers for s in t.stages] == [10, 20, 22, 20]
    with pytest.raises(ValueError, match="covers 71 layers"):
        AnalyticCostModel().cost_table(M, C, cfg(pp=4), partition=[10, 20, 21, 20])


def test_stage_memo_matches_direct_pricing():
    cm = AnalyticCostModel()
    c = cfg(dp=2, tp=2, pp=8, virtual_stages=3, schedule="interleaved-1f1b")
    big = get_cluster("dgx-a100-80g", nodes=4)
    t = cm.cost_table(M, big, c, partition=[3] * 23 + [3])
    lay, emb, head = cm.layer_costs(M, big, c)
    for g, st in enumerate(t.stages):
        assert st == cm.stage_cost(M, big, c, g, 3, lay, emb, head)


def test_tied_embedding_gradient_sum_between_first_and_last_stage():
    cm = AnalyticCostModel()
    t = cm.cost_table(M, C, cfg(pp=4))  # dp = 1: only the tied-embedding all-reduce
    assert t.stages[1].grad_allreduce_s == 0 and t.stages[2].grad_allreduce_s == 0
    tied_bytes = M.vocab * M.hidden * 2
    want = collective_time("all-reduce", tied_bytes, (0, 3), C)
    assert t.stages[0].grad_allreduce_s == pytest.approx(want)
    assert t.stages[3].grad_allreduce_s == pytest.approx(want)
    llama = get_model("llama2-7b")  # untied head: nothing to sum
    t2 = cm.cost_table(llama, C, cfg(pp=4))
    assert t2.stages[0].grad_allreduce_s == 0
