"""Physics of large runs: flash attention, grouped-query attention, ZeRO 1-3 / FSDP /
HSDP, context parallelism (ring attention) and FP8 GEMMs, formula by formula."""

import dataclasses

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel
from merak_sim.costs.kernels import default_kernels
from merak_sim.costs.ring import RingPass, check_cp, ring_pass, ring_steps
from merak_sim.costs.sharded_dp import fsdp_pass, fsdp_working_bytes, sync_groups
from merak_sim.hardware import HardwareError, get_cluster
from merak_sim.memory import (
    CPU_EAGER,
    layer_activation_breakdown,
    model_state_bytes,
)
from merak_sim.model import get_model
from merak_sim.sim.from_config import split_grad_sync

GPT = get_model("gpt-8.3b")
LLAMA70 = get_model("llama2-70b")
A100 = get_cluster("dgx-a100-80g", nodes=4)
H100 = get_cluster("dgx-h100", nodes=8)


def cfg(**kw):
    base = dict(dp=1, tp=1, pp=1, micro_batch_size=1)
    base.update(kw)
    base.setdefault("global_batch_size", base["dp"] * base["micro_batch_size"] * 8)
    return ParallelConfig(**base)


def row(model, cluster, c):
    return AnalyticCostModel().layer_breakdown(model, cluster, c)["layer"]


# ------------------------------------------------------------------ flash attention
def test_flash_keeps_no_s2_term_in_memory():
    """Flash keeps q, k, v, the output (projection input) and the fp32 log-sum-exp;
    unfused keeps the softmax, its dropout mask and the dropped probabilities."""
    b, tp = 2, 4
    flash = row(GPT, A100, cfg(tp=tp, micro_batch_size=b, attention="flash"))
    unfused = row(GPT, A100, cfg(tp=tp, micro_batch_size=b, attention="unfused"))
    a, s = GPT.heads, GPT.seq_len
    tok = b * s
    # e = 2, mask 1 byte, dropout on: (2 + 1 + 2) a s bytes per token vs 4 a.
    assert unfused["activation_bytes"] - flash["activation_bytes"] == pytest.approx(
        tok * (5 * a * s - 4 * a) / tp)
    br = layer_activation_breakdown(GPT, b, tp, profile=dataclasses.replace(
        AnalyticCostModel().profile_for(A100), attention="flash"))
    assert br["scores"] == tok * 4 * a / tp
    assert br["qkv"] == tok * 2 * (GPT.hidden + 2 * GPT.kv_dim) / tp
    assert br["proj_in"] == tok * 2 * GPT.hidden / tp


def test_auto_is_flash_on_gpus_and_measured_on_cpu():
    """"auto" is flash on GPU presets (every field of the layer row: time and bytes);
    the measured PyTorch profile on the CPU cluster (flash path without dropout: the
    same bytes as forcing flash there, as the saved-tensor measurements show)."""
    c = cfg(tp=2, micro_batch_size=2)
    auto = row(GPT, A100, c)
    assert auto == row(GPT, A100, dataclasses.replace(c, attention="flash"))
    assert auto != row(GPT, A100, dataclasses.replace(c, attention="unfused"))
    cpu = get_cluster("local-cpu")
    tiny = get_model({"family": "gpt", "layers": 2, "hidden": 64, "heads": 4,
                      "seq_len": 32, "vocab": 256, "dropout": 0.0})
    c1 = cfg()
    assert AnalyticCostModel().profile_for(cpu, c1) is CPU_EAGER
    auto = row(tiny, cpu, c1)["activation_bytes"]
    forced = row(tiny, cpu, dataclasses.replace(c1, attention="flash"))["activation_bytes"]
    assert auto == forced


def test_flash_backward_recomputes_scores():
    """Flash backward = 5/2 of the forward's work (QK^T again, dV, dP, dQ, dK) at the
    backward efficiency; the forward runs on half the tiles under causal masking."""
    c = cfg(tp=8, micro_batch_size=1, attention="flash")
    lay, _, _ = AnalyticCostModel().layer_costs(LLAMA70, H100, c)
    k = default_kernels(H100.gpu.name)
    eff = AnalyticCostModel().efficiency_for(H100)
    s, d = LLAMA70.seq_len, LLAMA70.head_dim
    work = 4.0 * (LLAMA70.heads / 8) * s * s * d * 0.5
    peak = H100.gpu.peak("bf16")
    assert lay.attn_fwd_s == pytest.approx(work / (peak * k.flash(s, d))
                                           + eff.kernel_overhead_s)
    assert lay.attn_bwd_s == pytest.approx(2.5 * work / (peak * k.flash(s, d, True))
                                           + eff.kernel_overhead_s)
    unf = AnalyticCostModel().layer_costs(LLAMA70, H100,
                                          dataclasses.replace(c, attention="unfused"))[0]
    assert lay.flops == unf.flops  # model FLOPs do not change with the kernel
    assert lay.forward_s < unf.forward_s  # no softmax through HBM, causal tiles skipped


# ------------------------------------------------------------- grouped-query attention
def test_gqa_in_flops_bytes_and_memory():
    m, h, kv, f = LLAMA70, LLAMA70.hidden, LLAMA70.kv_dim, LLAMA70.ffn_hidden
    assert kv == 8 * 128
    s = m.seq_len
    want = 2 * s * h * (h + 2 * kv) + 4 * s * s * h + 2 * s * h * h + 2 * s * h * f * 3
    assert m.layer_forward_flops(1) == want
    mha = m.with_(kv_heads=m.heads)
    assert mha.layer_forward_flops(1) - want == 2 * s * h * 2 * (h - kv)
    br = layer_activation_breakdown(m, 1, 8)
    assert br["qkv"] == s * 2 * (h + 2 * kv) / 8
    # tp above the kv heads: each GPU keeps one whole (replicated) K/V head.
    assert m.kv_dim_per_rank(16) == 128 and m.kv_dim_per_rank(4) == 256
    assert layer_activation_breakdown(m, 1, 16)["qkv"] == s * 2 * (h / 16 + 2 * 128)
    # Smaller K/V: the QKV GEMM and the ring exchange shrink.
    c = cfg(tp=8, cp=2, dp=1, attention="flash")
    lay = AnalyticCostModel().layer_costs(m, H100, c)[0]
    lay_mha = AnalyticCostModel().layer_costs(mha, H100, c)[0]
    assert lay.cp_kv_bytes == 2 * 1 * (s / 2) * (kv / 8) * 2
    assert lay_mha.cp_kv_bytes == 8 * lay.cp_kv_bytes
    assert lay.forward_s < lay_mha.forward_s


# ------------------------------------------------------------------ ZeRO / FSDP / HSDP
def test_zero_state_sharding():
    p, g = 1e9, 8
    z = [model_state_bytes(p, "bf16", g, k) for k in range(4)]
    assert (z[0].weight_bytes, z[0].grad_bytes, z[0].optimizer_bytes) == (2e9, 2e9, 12e9)
    assert z[1].optimizer_bytes == 12e9 / g and z[1].grad_bytes == 2e9
    assert z[2].grad_bytes == 2e9 / g and z[2].weight_bytes == 2e9
    assert z[3].weight_bytes == 2e9 / g
    assert model_state_bytes(p, "fp8").total_bytes == 17e9  # + the cached FP8 weights


def test_fsdp_all_gather_counts_and_overlap():
    n = 5
    ag, rs = [1.0] * n, [0.5] * n
    none = fsdp_pass(ag, rs, [0.0] * n, [0.0] * n)
    assert (none.all_gathers, none.reduce_scatters) == (2 * n, n)
    assert none.fwd_exposed_s == none.fwd_total_s == n * 1.0
    assert none.bwd_exposed_s == none.bwd_total_s == n * 1.5
    # Ample compute: only the first gather (forward), and in backward the first gather
    # and the last reduce-scatter stay exposed.
    hidden = fsdp_pass(ag, rs, [10.0] * n, [10.0] * n)
    assert hidden.fwd_exposed_s == 1.0 and hidden.bwd_exposed_s == 1.5
    assert fsdp_working_bytes([3.0, 5.0, 4.0], "bf16") == (18.0, 10.0)


def test_zero3_table_folds_exposed_collectives():
    base = cfg(dp=4, tp=8, micro_batch_size=1, global_batch_size=16)
    cm = AnalyticCostModel()
    t0 = cm.cost_table(GPT, A100, base).stages[0]
    t3 = cm.cost_table(GPT, A100, dataclasses.replace(base, zero=3)).stages[0]
    t1 = cm.cost_table(GPT, A100, dataclasses.replace(base, zero=1)).stages[0]
    assert t3.forward_s > t0.forward_s and t3.backward_s > t0.backward_s
    assert t3.grad_allreduce_s == 0.0  # no replicas: every sync is per layer
    assert t1.grad_allreduce_s > 0
    assert t3.optimizer_bytes == t1.optimizer_bytes
    assert t3.state_bytes < t1.state_bytes


def test_hsdp_groups_and_replica_all_reduce():
    c = cfg(dp=8, tp=4, zero=3, zero_group=4, global_batch_size=64)
    ranks, shard, rep = sync_groups(c, 0)
    assert ranks == tuple(range(0, 32, 4))
    assert shard == (0, 4, 8, 12) and rep == (0, 16)
    t = AnalyticCostModel().cost_table(GPT, A100, c).stages[0]
    assert t.grad_allreduce_s > 0  # the 1/4 gradient shard all-reduced across replicas
    with pytest.raises(ValueError, match="zero group 3 must divide dp"):
        cfg(dp=8, zero=3, zero_group=3)


# ------------------------------------------------------------------ context parallelism
def test_cp_ring_steps_and_exposure():
    assert ring_steps(4) == (4, 3) and ring_steps(1) == (1, 0)
    c = cfg(cp=4, tp=8, global_batch_size=8)
    t_step = 2e-3

    def comm(kind, nbytes, ranks, cluster):
        assert kind == "p2p" and len(ranks) == 2
        return t_step * nbytes / 1e6

    rp = ring_pass(comm, H100, c, 0, 1e6, attn_fwd_s=4e-3, attn_bwd_s=40e-3)
    assert isinstance(rp, RingPass)
    # forward: 3 exchanges of 2 ms against 1 ms of attention each -> 3 ms exposed
    assert rp.fwd_total_s == pytest.approx(6e-3) and rp.fwd_exposed_s == pytest.approx(3e-3)
    # backward: K/V and their gradients (4 ms per exchange) hide behind 10 ms steps
    assert rp.bwd_total_s == pytest.approx(12e-3) and rp.bwd_exposed_s == 0.0
    assert rp.bwd_bytes == 2 * rp.fwd_bytes == 6e6


def test_cp_divides_activations_and_flops():
    c1 = cfg(tp=8, dp=2, attention="flash", sequence_parallel=True, global_batch_size=16)
    c2 = dataclasses.replace(c1, cp=2)
    cm = AnalyticCostModel()
    r1, r2 = row(LLAMA70, H100, c1), row(LLAMA70, H100, c2)
    assert r2["activation_bytes"] == pytest.approx(r1["activation_bytes"] / 2)
    t = cm.cost_table(LLAMA70, H100, dataclasses.replace(c2, pp=4, dp=1,
                                                         global_batch_size=8))
    per_gpu = sum(s.flops for s in t.stages)
    assert per_gpu * 8 * 2 == pytest.approx(LLAMA70.training_flops(1))
    assert c2.world_size == 32
    with pytest.raises(ValueError, match="cp=3 does not divide the sequence"):
        check_cp(LLAMA70, 3)


# ------------------------------------------------------------------ FP8
def test_fp8_gemms_and_refusal():
    c = cfg(tp=8, micro_batch_size=1, attention="flash")
    cm = AnalyticCostModel()
    bf = cm.layer_costs(LLAMA70, H100, c)[0]
    f8 = cm.layer_costs(LLAMA70, H100, dataclasses.replace(c, dtype="fp8"))[0]
    assert f8.forward_s < bf.forward_s and f8.fp8_cast_s > 0 and bf.fp8_cast_s == 0
    assert f8.attn_fwd_s == bf.attn_fwd_s  # attention stays 16-bit
    t = cm.cost_table(LLAMA70, H100, dataclasses.replace(c, dtype="fp8", pp=8,
                                                         global_batch_size=8))
    assert t.peak_flops == 989e12  # MFU against the 16-bit peak
    with pytest.raises(HardwareError, match="no FP8 tensor cores.*--dtype bf16"):
        cm.cost_table(GPT, A100, cfg(dtype="fp8"))


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("kw, msg", [
    (dict(zero=4), "zero stage 4 unknown; choose 0, 1, 2 or 3"),
    (dict(attention="fast"), "unknown attention 'fast'"),
    (dict(cp=0), "cp must be a positive integer"),
    (dict(zero_group=2), "needs a ZeRO stage"),
    (dict(dtype="fp4"), "unknown dtype 'fp4'"),
])
def test_config_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        cfg(dp=2, **kw)


def test_config_round_trip_with_new_fields():
    c = cfg(dp=4, cp=2, zero=3, zero_group=2, attention="flash", overlap_param_gather=True,
            dtype="fp8")
    assert ParallelConfig.from_dict(c.to_dict()) == c
    assert c.shard_group == 2 and split_grad_sync(c) == 0
    assert split_grad_sync(cfg(dp=2, zero=2)) == 1
