"""Memory model: Korthikanti's five settings, model-state bytes, schedule-driven peaks."""

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel
from merak_sim.hardware import get_cluster
from merak_sim.memory import (
    FLASH,
    backward_working_bytes,
    korthikanti_layer_bytes,
    layer_activation_breakdown,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    model_state_bytes,
    peak_memory,
    stage_params,
)
from merak_sim.model import ModelSpec, ModelSpecError, get_model
from merak_sim.schedule import validate
from merak_sim.sim.from_config import recompute_fractions, schedule_for

SHAPES = [("gpt-8.3b", 2), ("gpt-20b", 1), ("gpt3-175b", 1), ("gpt-1.5b", 4)]


@pytest.mark.parametrize("name,b", SHAPES)
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_five_settings(name, b, t):
    m = get_model(name)
    if m.heads % t:  # gpt-1.5b has 25 heads: only tp=1 applies
        t = 1
    s, h, a = m.seq_len, m.hidden, m.heads
    # no parallelism
    assert layer_activation_bytes(m, b) == pytest.approx(
        korthikanti_layer_bytes(s, b, h, a, 1, "none"))
    assert korthikanti_layer_bytes(s, b, h, a, 1, "none") == s * b * h * (34 + 5 * a * s / h)
    # tensor parallel
    assert layer_activation_bytes(m, b, tp=t) == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    # tensor + sequence parallel
    assert layer_activation_bytes(m, b, tp=t, sp=True) == pytest.approx(
        s * b * h / t * (34 + 5 * a * s / h))
    # selective recompute (with tp + sp)
    assert layer_activation_bytes(m, b, tp=t, sp=True, recompute="selective") == \
        pytest.approx(s * b * h / t * 34)
    # full recompute: 2sbh per layer
    assert layer_activation_bytes(m, b, tp=t, recompute="full") == 2 * s * b * h
    assert layer_checkpoint_bytes(m, b, tp=t, sp=True) == pytest.approx(2 * s * b * h / t)


def test_breakdown_components_gpt():
    m = get_model("gpt-8.3b")
    d = layer_activation_breakdown(m, 1)
    sbh = m.seq_len * m.hidden
    assert d["residual"] == 8 * sbh and d["masks"] == 2 * sbh
    assert d["qkv"] + d["proj_in"] == 8 * sbh and d["mlp"] == 16 * sbh
    assert d["scores"] == 5 * m.heads * m.seq_len ** 2


def test_no_dropout_and_flash_variants():
    m = get_model("gpt-8.3b").with_(dropout=0.0)
    d = layer_activation_breakdown(m, 1)
    assert d["masks"] == 0 and d["scores"] == 2 * m.heads * m.seq_len ** 2
    f = layer_activation_breakdown(m, 1, profile=FLASH)
    assert f["scores"] == 4 * m.heads * m.seq_len


def test_llama_gqa_swiglu_activations():
    m = get_model("llama2-70b")
    d = layer_activation_breakdown(m, 1, tp=8)
    tok = m.seq_len
    assert d["qkv"] == tok * 2 * (m.hidden + 2 * m.kv_dim) / 8
    assert d["mlp"] == tok * 3 * 2 * m.ffn_hidden / 8
    assert d["masks"] == 0  # LLaMA trains without dropout


def test_model_state_bytes_mixed_and_fp32():
    mp = model_state_bytes(1e9, "bf16")
    assert (mp.weight_bytes, mp.grad_bytes, mp.optimizer_bytes) == (2e9, 2e9, 12e9)
    f32 = model_state_bytes(1e9, "fp32")
    assert (f32.weight_bytes, f32.grad_bytes, f32.optimizer_bytes) == (4e9, 4e9, 8e9)
    assert mp.total_bytes == f32.total_bytes == 16e9
    z = model_state_bytes(1e9, "fp16", dp=8, zero=1)
    assert z.optimizer_bytes == 12e9 / 8 and z.weight_bytes == 2e9


def test_stage_params_sum_to_model():
    m = get_model("gpt-8.3b")
    # pp=1, tp=1: everything once.
    assert stage_params(m, m.layers, True, True) == m.total_params()
    # pp=2: the last stage holds a second copy of the tied word embedding.
    two = stage_params(m, 36, True, False) + stage_params(m, 36, False, True)
    assert two == m.total_params() + m.vocab * m.hidden
    l2 = get_model("llama2-7b")
    assert stage_params(l2, 32, True, True) == l2.total_params()
    bert = get_model("bert-large")
    assert stage_params(bert, 24, True, True) == bert.total_params()


def test_tp_divisibility_error_names_numbers():
    with pytest.raises(ModelSpecError, match="tp=3 does not divide 32 attention heads"):
        layer_activation_bytes(get_model("gpt-8.3b"), 1, tp=3)
    with pytest.raises(ValueError, match="micro_batch must be a positive integer, got 0"):
        layer_activation_bytes(get_model("gpt-8.3b"), 0)


@pytest.mark.parametrize("schedule", ["1f1b", "shifted-critical-path", "gpipe"])
def test_peak_memory_uses_schedule_in_flight(schedule):
    m = ModelSpec(name="t", family="gpt", layers=8, hidden=512, heads=8, seq_len=256,
                  vocab=1000)
    cfg = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8, schedule=schedule,
                         recompute="none")
    table = AnalyticCostModel().cost_table(m, get_cluster("dgx-a100-80g"), cfg)
    sched = schedule_for(cfg)
    rep = validate(sched)
    peaks = peak_memory(table, cfg, sched)
    for r, pk in enumerate(peaks):
        assert pk.peak_in_flight == rep.peak_in_flight[r]
        st = table.stages[r]
        if schedule == "shifted-critical-path":
            # F* micro-batches hold only their input: between the two bounds.
            assert rep.peak_full_in_flight[r] * st.activation_bytes <= \
                pk.activation_peak_bytes <= rep.peak_in_flight[r] * st.activation_bytes
        else:
            # No recompute: every alive micro-batch holds the full activation set.
            assert pk.activation_peak_bytes == pytest.approx(rep.peak_full_in_flight[r]
                                                             * st.activation_bytes)
        assert pk.state_bytes == pytest.approx(st.state_bytes)
    if schedule == "1f1b":
        assert [p.peak_in_flight for p in peaks] == [4, 3, 2, 1]
        for r, pk in enumerate(peaks):
            assert pk.activation_peak_bytes == pytest.approx((4 - r) * table.stages[r]
                                                             .activation_bytes)


def test_peak_memory_full_recompute_and_stage_aware():
    m = ModelSpec(name="t", family="gpt", layers=8, hidden=512, heads=8, seq_len=256,
                  vocab=1000)
    c = get_cluster("dgx-a100-80g")
    full = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8, recompute="full")
    t = AnalyticCostModel().cost_table(m, c, full)
    pk = peak_memory(t, full)
    assert pk[0].activation_peak_bytes == pytest.approx(4 * t.stages[0].checkpoint_bytes)
    sa = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8,
                        recompute="stage-aware", recompute_c0=0.75)
    pk2 = peak_memory(t, sa)
    c1 = recompute_fractions(sa)[1]
    assert pk2[1].activation_peak_bytes == pytest.approx(3 * t.stages[1].kept_bytes(c1))
    # Stage-aware keeps more than full recompute but less than none on stage 1.
    none = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8)
    assert pk[1].activation_peak_bytes < pk2[1].activation_peak_bytes < \
        peak_memory(t, none)[1].activation_peak_bytes


def test_f_star_keeps_only_stage_input():
    m = ModelSpec(name="t", family="gpt", layers=8, hidden=512, heads=8, seq_len=256,
                  vocab=1000)
    cfg = ParallelConfig(pp=4, micro_batch_size=1, global_batch_size=8,
                         schedule="shifted-critical-path", recompute="full")
    t = AnalyticCostModel().cost_table(m, get_cluster("dgx-a100-80g"), cfg)
    assert t.stages[1].input_bytes == m.seq_len * m.hidden * 2
    assert t.stages[1].input_bytes < t.stages[1].checkpoint_bytes
    pk = peak_memory(t, cfg)
    assert all(p.activation_peak_bytes > 0 for p in pk)


def test_backward_working_set_rebuilds_a_checkpointed_layer_and_the_loss():
    m = get_model("llama3-8b").with_(seq_len=4096)
    e, tok, h = 2, 2 * 4096, m.hidden
    grads = 2 * tok * e * h
    assert backward_working_bytes(m, 2, profile=FLASH) == pytest.approx(grads)
    full = backward_working_bytes(m, 2, recompute="full", profile=FLASH)
    assert full == pytest.approx(grads + layer_activation_bytes(m, 2, profile=FLASH))
    # The loss: fp32 gradients of log-probabilities and logits (8 V bytes per token),
    # vocabulary sharded over tp; it dominates a layer at a 128k vocabulary.
    head = backward_working_bytes(m, 2, tp=2, sp=True, profile=FLASH, last=True)
    assert head == pytest.approx(tok * 8 * m.vocab / 2)
    assert backward_working_bytes(m, 2, tp=2, sp=True, profile=FLASH, cp=2,
                                  last=True) == pytest.approx(head / 2)
