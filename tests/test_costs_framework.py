"""Framework kernel facts (merak_sim.costs.framework): Megatron's fused-softmax
availability rule, its eager fp32 softmax and its fp32 cross entropy, and that the
default options are the layer model's own charges."""

import pytest

from merak_sim.calibrate.stacks import stack_cost_model
from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.framework import (
    MEGATRON,
    FrameworkKernels,
    LogitBytes,
    batch_per_block,
    cross_entropy,
    megatron_softmax_fused,
    softmax_extra,
    torch_softmax,
)
from merak_sim.costs.fusion import EagerExtra
from merak_sim.costs.layers import LayerOptions, edge_costs, layer_cost
from merak_sim.costs.partition import make_partition
from merak_sim.hardware import get_cluster
from merak_sim.memory import KORTHIKANTI
from merak_sim.model import ModelSpec

PEAK, BW = 312e12, 2.039e12
GPT = ModelSpec(name="h1024", family="gpt", layers=24, hidden=1024, heads=16,
                seq_len=1024, vocab=51200, dtype="fp16")
EFF = Efficiency()


def test_torch_softmax_bytes_and_kernels():
    # fp16: cast 2+4, scale 4+4, mask 4+1+4, softmax 4+4, cast 4+2; backward adds the
    # softmax backward's second read (the saved output).
    assert torch_softmax(2) == LogitBytes(37, 5, 41, 5)
    # fp32 input: no casts.
    assert torch_softmax(4) == LogitBytes(25, 3, 29, 3)


def test_cross_entropy_bytes_and_kernels():
    assert cross_entropy(FrameworkKernels(), 2) == LogitBytes(12.0, 3, 24.0, 3)
    # cast 2+4, max 4, subtract 8, exp 8, sum 4, divide 8; backward multiply 8, cast 6.
    assert cross_entropy(MEGATRON, 2) == LogitBytes(38, 6, 14, 2)
    assert cross_entropy(MEGATRON, 4) == LogitBytes(32, 5, 8, 1)


def test_batch_per_block_follows_the_warp_layout():
    assert batch_per_block(2048) == batch_per_block(129) == 4
    assert batch_per_block(128) == batch_per_block(32) == 8


@pytest.mark.parametrize("e,sq,sk,batches,fused", [
    (2, 1024, 1024, 4, True),
    (2, 2048, 2048, 8, True),
    (2, 1024, 1024, 2, False),       # tp=8, 16 heads, micro-batch 1
    (2, 2048, 2048, 6, False),       # 3 heads per GPU x micro-batch 2
    (2, 1024, 1024, 2.5, False),     # not a whole number of score matrices
    (4, 1024, 1024, 4, False),       # fp32 input never takes the fused kernel
    (2, 16, 16, 4, False),           # too short
    (2, 8192, 8192, 4, False),       # too long
    (2, 1022, 1022, 4, False),       # lengths not multiples of 4
    (2, 64, 64, 4, False),           # short keys: 8 batches per block
    (2, 64, 64, 8, True),
])
def test_megatron_availability_rule(e, sq, sk, batches, fused):
    assert megatron_softmax_fused(e, sq, sk, batches) is fused


def test_softmax_extra_only_on_fallback_under_megatron():
    assert softmax_extra(FrameworkKernels(), 2, 1024, 1024, 2) == EagerExtra()
    assert softmax_extra(MEGATRON, 2, 1024, 1024, 4) == EagerExtra()
    sc = 2 * 1024 * 1024
    assert softmax_extra(MEGATRON, 2, 1024, 1024, 2) == EagerExtra(
        fwd_bytes=sc * 33, bwd_bytes=sc * 33, fwd_kernels=4, bwd_kernels=4)


def test_default_options_are_the_layer_models_own_charges():
    args = (GPT, PEAK, BW, EFF, 2, 1, 8, False, 1)
    assert layer_cost(*args, LayerOptions(framework=FrameworkKernels())) == layer_cost(*args)
    assert edge_costs(*args[:8], 1, FrameworkKernels()) == edge_costs(*args[:8])
    # Megatron's rule keeps the fused charge where the kernel is available.
    fused = (GPT, PEAK, BW, EFF, 2, 2, 8, False, 1)
    assert layer_cost(*fused, LayerOptions(framework=MEGATRON)) == layer_cost(*fused)


def test_fallback_adds_the_eager_softmax_to_the_layer():
    args = (GPT, PEAK, BW, EFF, 2, 1, 8, False, 1)
    base = layer_cost(*args)
    meg = layer_cost(*args, LayerOptions(framework=MEGATRON))
    sc = 1 * 16 / 8 * 1024 * 1024
    extra = EFF.mem_time(sc * 33, BW, 4)
    assert meg.forward_s - base.forward_s == pytest.approx(extra)
    assert meg.backward_input_s - base.backward_input_s == pytest.approx(extra)
    assert meg.backward_weight_s == base.backward_weight_s
    assert meg.kernels_fwd == base.kernels_fwd + 4
    assert meg.attn_core_s > base.attn_core_s


def test_megatron_cross_entropy_in_the_head():
    m, tp = 2 * 1024, 2
    base_emb, base = edge_costs(GPT, PEAK, BW, EFF, 2, 2, tp, False)
    emb, head = edge_costs(GPT, PEAK, BW, EFF, 2, 2, tp, False, 1, MEGATRON)
    assert emb == base_emb
    g = head.backward_weight_s
    logits = m * GPT.vocab / tp
    norm = m * GPT.hidden * 2
    assert head.forward_s - g == pytest.approx(EFF.mem_time(logits * 38 + 2 * norm, BW, 7))
    assert head.backward_input_s - g == pytest.approx(
        EFF.mem_time(logits * 14 + 4 * norm, BW, 3))
    assert base.forward_s - g == pytest.approx(EFF.mem_time(logits * 12 + 2 * norm, BW, 4))
    assert head.kernels_fwd == 8 and base.kernels_fwd == 5
    # Megatron moves more bytes in forward and fewer in backward.
    assert head.forward_s > base.forward_s and head.backward_input_s < base.backward_input_s


def test_megatron_stacks_are_priced_with_megatron_kernels():
    cluster = get_cluster("vtrain-a100")
    assert stack_cost_model("megatron-deepspeed", cluster, None).base.framework == MEGATRON
    assert stack_cost_model("megatron", cluster, None).framework == MEGATRON
    assert stack_cost_model("default", cluster, None).framework == FrameworkKernels()
    a = AnalyticCostModel()
    assert a.framework == FrameworkKernels()
    assert a.with_collectives(a.comm_time).framework == FrameworkKernels()
    b = AnalyticCostModel(framework=MEGATRON)
    assert b.with_profile(KORTHIKANTI).framework == MEGATRON


def test_unknown_choices_are_rejected():
    with pytest.raises(ValueError, match="softmax rule"):
        FrameworkKernels(softmax_rule="apex")
    with pytest.raises(ValueError, match="cross entropy"):
        FrameworkKernels(cross_entropy="fp16")


def test_time_partition_balances_by_the_given_models_own_layer_times():
    cluster = get_cluster("dgx-a100-80g")
    cfg = ParallelConfig(pp=4, micro_batch_size=2, global_batch_size=16)
    megatron = AnalyticCostModel(framework=MEGATRON)
    p = make_partition("time", GPT, cluster, cfg, megatron)
    assert p.ranges == megatron.time_partition(GPT, cluster, cfg).ranges
    # Megatron's fp32 cross entropy makes the head dearer than the default charges
    # do, so the model's own partition differs from the default model's.
    assert p.ranges != make_partition("time", GPT, cluster, cfg).ranges


def test_time_partition_of_a_wrapping_model_uses_its_base():
    cluster = get_cluster("vtrain-a100")
    cfg = ParallelConfig(pp=4, micro_batch_size=2, global_batch_size=16)
    wrapped = stack_cost_model("megatron-deepspeed", cluster, None)
    p = make_partition("time", GPT, cluster, cfg, wrapped)
    assert p.ranges == wrapped.base.time_partition(GPT, cluster, cfg).ranges
    assert p.ranges != AnalyticCostModel().time_partition(GPT, cluster, cfg).ranges
