"""Framework-specific memory terms: torchtitan's op-level selective checkpointing and loss
storage, the runtime's memory outside the allocator, and the public-runs memory mapping
(torchtitan fp32 gradient accumulation under PP, no cached FP8 weights, Sailor's
device-level reading)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from merak_sim.allocator_memory import fsdp_stream_pool_bytes, pipeline_buffer_bytes
from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.hardware import get_cluster
from merak_sim.memory import (
    FLASH,
    TORCHTITAN,
    TORCHTITAN_COMPILED,
    TORCHTITAN_COMPILED_LOSS,
    ActivationProfile,
    MemoryModelError,
    alternate_mm_layer_bytes,
    backward_working_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
    peak_memory,
    stage_params,
)
from merak_sim.model import get_model
from merak_sim.runtime_memory import (
    DEFAULT_RESERVE,
    RUNTIME_MEMORY,
    runtime_memory_bytes,
    usable_memory_bytes,
)
from merak_sim.sim.api import simulate
from merak_sim.sim.from_config import stage_rank
from merak_sim.validation.public_runs import (
    activation_profile,
    comparable_peak_bytes,
    load_rows,
    row_setup,
    skip_reason,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "public-runs"
GiB = 1 << 30


def _rows(file: str, **match: str) -> list[dict]:
    return [r for r in load_rows(DATA / file)
            if skip_reason(r) is None and (r.get("peak_mem_gib") or r.get("peak_mem_bytes"))
            and all(m in r[k] for k, m in match.items())]


def test_alternate_mm_keeps_input_q_v_attention_w1_w2_per_token():
    m = get_model("llama3-8b")
    h, kv, f, a, e = m.hidden, m.kv_dim, m.ffn_hidden, m.heads, 2
    tok = 2 * m.seq_len
    want = tok * (e * (4 * h + kv + f) + 4 * a)
    assert alternate_mm_layer_bytes(m, 2, profile=TORCHTITAN) == pytest.approx(want)
    assert layer_activation_bytes(m, 2, recompute="selective", profile=TORCHTITAN) == \
        pytest.approx(want)
    # Megatron's selective recompute keeps far more (only the s x s part is dropped).
    megatron = layer_activation_bytes(m, 2, recompute="selective", profile=FLASH)
    assert 0.4 < want / megatron < 0.5


def test_alternate_mm_under_tp_keeps_w2_partial_sums_and_reduce_scatter_outputs():
    m = get_model("llama3-70b")
    t, e = 8, 2
    h, f, a = m.hidden, m.ffn_hidden, m.heads
    per_tok = (e * h / t * 3 + e * m.kv_dim / t + 4 * a / t + e * f / t + e * h
               + 2 * e * h / t)
    got = alternate_mm_layer_bytes(m, 1, tp=t, sp=True, profile=TORCHTITAN)
    assert got == pytest.approx(m.seq_len * per_tok)
    assert got < layer_activation_bytes(m, 1, t, True, "none", TORCHTITAN)


def test_compiled_selective_checkpointing_drops_what_no_backward_reads():
    # Eager SAC caches every saved op's output; the compiled partitioner keeps only what
    # the backward graph reads: not the w2 output, not the MLP's reduce-scatter output.
    m8, m70 = get_model("llama3-8b"), get_model("llama3-70b")
    e, t = 2, 8
    tok = 2 * m8.seq_len
    assert alternate_mm_layer_bytes(m8, 2, profile=TORCHTITAN) - \
        alternate_mm_layer_bytes(m8, 2, profile=TORCHTITAN_COMPILED) == \
        pytest.approx(tok * e * m8.hidden)
    h = m70.hidden
    assert alternate_mm_layer_bytes(m70, 1, t, True, TORCHTITAN) - \
        alternate_mm_layer_bytes(m70, 1, t, True, TORCHTITAN_COMPILED) == \
        pytest.approx(m70.seq_len * (e * h + e * h / t))
    assert alternate_mm_layer_bytes(m8, 2, profile=TORCHTITAN_COMPILED_LOSS) == \
        alternate_mm_layer_bytes(m8, 2, profile=TORCHTITAN_COMPILED)


def test_eager_minus_compiled_peak_is_the_cached_w2_outputs():
    # torchtitan's 2024 H100 pair (Llama 3.1 8B, FSDP 8, same run but torch.compile):
    # the predicted difference is one w2 output per layer per token.
    rows = _rows("torchtitan.csv", source_path="202412", precision="bf16", num_gpus="8")
    eager = [r for r in rows if "compile" not in r["other_flags"]][0]
    comp = [r for r in rows if "torch.compile" in r["other_flags"]][0]
    peaks = []
    for r in (eager, comp):
        model, cluster, cfg = row_setup(r)
        cm = AnalyticCostModel().with_profile(activation_profile(r))
        table = cm.cost_table(model, cluster, cfg)
        res = simulate(model, cluster, cfg, cost_table=table, engine="evaluator",
                       sub_cluster=True, keep_trace=False)
        peaks.append(comparable_peak_bytes(r, model, cluster, cfg, table,
                                           res.peak_memory_bytes))
    tok = cfg.micro_batch_size * model.seq_len
    assert peaks[0] - peaks[1] == pytest.approx(model.layers * tok * 2 * model.hidden,
                                                rel=1e-6)


def test_eager_final_norm_keeps_its_fp32_upcast_input():
    # pow and mul save the fp32 copy of the input; the weight mul the normalised tensor.
    m = get_model("llama3-8b")
    tok, h, t = m.seq_len, m.hidden, 8
    assert last_stage_extra_bytes(m, 1, profile=TORCHTITAN_COMPILED) - \
        last_stage_extra_bytes(m, 1, profile=replace(TORCHTITAN_COMPILED,
                                                     eager_final_norm=False)) == \
        pytest.approx(tok * 4 * h)
    assert last_stage_extra_bytes(m, 1, t, True, TORCHTITAN) - \
        last_stage_extra_bytes(m, 1, t, True, replace(TORCHTITAN, eager_final_norm=False)) \
        == pytest.approx(tok * 4 * h / t)
    assert not TORCHTITAN_COMPILED_LOSS.eager_final_norm and not FLASH.eager_final_norm


def test_alternate_mm_backward_rebuilds_what_it_did_not_keep():
    m = get_model("llama3-8b")
    none = layer_activation_bytes(m, 1, recompute="none", profile=TORCHTITAN)
    sac = alternate_mm_layer_bytes(m, 1, profile=TORCHTITAN)
    grads = 2 * m.seq_len * 2 * m.hidden
    assert backward_working_bytes(m, 1, recompute="selective", profile=TORCHTITAN) == \
        pytest.approx(grads + none - sac)


def test_loss_storage_fp32_eager_loss_parallel_and_fused():
    m = get_model("llama3-8b")
    tok, V, e = m.seq_len, m.vocab, 2
    norm = tok * 2 * e * m.hidden
    eager_norm = tok * 4 * m.hidden  # the eager final norm's fp32 upcast input
    assert last_stage_extra_bytes(m, 1, profile=TORCHTITAN) == \
        pytest.approx(norm + eager_norm + tok * 4 * V)
    assert last_stage_extra_bytes(m, 1, profile=TORCHTITAN_COMPILED_LOSS) == \
        pytest.approx(norm + tok * e * V)
    head = {p.name: backward_working_bytes(m, 1, profile=p, last=True)
            for p in (FLASH, TORCHTITAN, TORCHTITAN_COMPILED_LOSS)}
    assert head["flash"] == head["torchtitan"] == pytest.approx(tok * 8 * V)  # tp 1
    assert head["torchtitan-compiled-loss"] == pytest.approx(tok * e * V)
    # DTensor loss parallel (tp > 1): three fp32 V/t temporaries in its backward.
    assert backward_working_bytes(m, 1, tp=8, sp=True, profile=TORCHTITAN, last=True) == \
        pytest.approx(tok * 12 * V / 8)
    assert backward_working_bytes(m, 1, tp=8, sp=True, profile=FLASH, last=True) == \
        pytest.approx(tok * 8 * V / 8)


def test_unknown_policies_are_rejected():
    with pytest.raises(MemoryModelError, match="selective policy"):
        ActivationProfile("x", selective="every-op")
    with pytest.raises(MemoryModelError, match="loss storage"):
        ActivationProfile("x", loss="bf16")


def test_runtime_memory_is_measured_on_gh200_and_zero_elsewhere():
    assert runtime_memory_bytes("GH200-96GB") == pytest.approx(3.28 * GiB)
    assert "nvidia-smi" in RUNTIME_MEMORY["GH200-96GB"].source
    assert runtime_memory_bytes("H100-80GB") == 0.0
    gh = get_cluster("alps-gh200").gpu
    assert usable_memory_bytes(gh) == pytest.approx(gh.memory_bytes - 3.28 * GiB)


def test_cost_table_capacity_leaves_the_runtime_its_share():
    m = get_model("llama3-8b")
    cfg = ParallelConfig(dp=4, micro_batch_size=1, global_batch_size=8)
    gh = get_cluster("alps-gh200")
    h100 = get_cluster("dgx-h100")
    cm = AnalyticCostModel()
    assert cm.cost_table(m, gh, cfg).memory_capacity_bytes == \
        pytest.approx(gh.gpu.memory_bytes - runtime_memory_bytes(gh.gpu.name))
    # Without a measurement: the default reserve (CUDA context, NCCL buffers); none on CPU.
    assert cm.cost_table(m, h100, cfg).memory_capacity_bytes == \
        pytest.approx(h100.gpu.memory_bytes - DEFAULT_RESERVE.outside_allocator_bytes)
    cpu = get_cluster("local-cpu")
    assert cm.cost_table(get_model("bert-large"), cpu, ParallelConfig(
        dp=4, micro_batch_size=1, global_batch_size=8)).memory_capacity_bytes == \
        cpu.gpu.memory_bytes


def test_with_profile_changes_the_stash_and_nothing_else():
    m = get_model("llama3-8b").with_(seq_len=4096)
    cfg = ParallelConfig(dp=8, zero=3, micro_batch_size=1, global_batch_size=8,
                         recompute="selective", attention="flash")
    cl = get_cluster("dgx-h100")
    base = AnalyticCostModel()
    a = base.cost_table(m, cl, cfg).stages[0]
    b = base.with_profile(TORCHTITAN).cost_table(m, cl, cfg).stages[0]
    assert b.activation_bytes < a.activation_bytes
    assert (b.forward_s, b.backward_s, b.state_bytes) == (a.forward_s, a.backward_s,
                                                           a.state_bytes)


def test_public_rows_map_to_torchtitan_profiles_by_release():
    dec24 = _rows("torchtitan.csv", source_path="202412", other_flags="torch.compile")[0]
    jun25 = _rows("torchtitan.csv", source_path="202506")[0]
    assert activation_profile(dec24) is TORCHTITAN_COMPILED  # 2024: the loss ran eager
    assert TORCHTITAN_COMPILED.loss == TORCHTITAN.loss
    eager = [r for r in _rows("torchtitan.csv", source_path="202412", precision="bf16")
             if "compile" not in r["other_flags"]][0]
    assert activation_profile(eager) is TORCHTITAN
    assert activation_profile(jun25) is TORCHTITAN_COMPILED_LOSS
    assert activation_profile(_rows("sailor.csv")[0]) is None


def test_sailor_memory_adds_the_runtime_outside_the_allocator():
    r = _rows("sailor.csv", model="OPT-350M")[0]
    model, cluster, cfg = row_setup(r)
    peaks = (10e9,) * cfg.pp
    table = AnalyticCostModel().cost_table(model, cluster, cfg)
    bare = comparable_peak_bytes({**r, "framework": "other"}, model, cluster, cfg, table,
                                 peaks)
    assert comparable_peak_bytes(r, model, cluster, cfg, table, peaks) == \
        pytest.approx(bare + runtime_memory_bytes("GH200-96GB"))


def test_torchtitan_pp_adds_fp32_accumulation_and_drops_the_fp8_copy():
    r = _rows("torchtitan.csv", model="405B", other_flags="1F1B")[0]
    model, cluster, cfg = row_setup(r)
    assert cfg.pp == 8 and cfg.zero == 1 and cfg.dtype == "fp8"
    peaks = (80e9,) + (10e9,) * (cfg.pp - 1)
    other = {**r, "framework": "other"}
    table = AnalyticCostModel().cost_table(model, cluster, cfg)
    got = comparable_peak_bytes(r, model, cluster, cfg, table, peaks)
    ref = comparable_peak_bytes(other, model, cluster, cfg, table, peaks)
    n = table.stages[0].layers  # the cost table's own split (uniform: 15 of 126)
    assert n == 15
    p0 = stage_params(model, n, True, False, cfg.tp)
    # Stage 0 (the largest with the embedding): + 2 B (fp32 accumulation) - 1 B (no FP8
    # copy, weights unsharded under ZeRO 1) per parameter, and torchtitan's larger
    # recompute working set (gathered norm outputs).
    work = [backward_working_bytes(model, cfg.micro_batch_size, cfg.tp, True, "full", p,
                                   cfg.dtype, cfg.cp) for p in (TORCHTITAN, FLASH)]
    alloc = _titan_rank0_allocator(model, cfg, table, [(True, False)])
    assert got - ref == pytest.approx(p0 + work[0] - work[1] + alloc, rel=0.02)


def _titan_rank0_allocator(model, cfg, table, stages) -> float:
    """What torchtitan's allocator reserves on pipeline rank 0 beyond the live tensors
    (merak_sim.allocator_memory): two gathered blocks in FSDP's all-gather pool and,
    per chunk at (first, last), pipelining's buffers."""
    b = cfg.micro_batch_size * model.seq_len * model.hidden * 2 / cfg.tp
    k = peak_memory(table, cfg)[0].peak_in_flight
    m = cfg.num_microbatches
    pool = fsdp_stream_pool_bytes([stage_params(model, 1, False, False, cfg.tp)] * 2, 2)
    return pool + sum(pipeline_buffer_bytes(b, m, min(k, m), f, la) for f, la in stages)


def test_pp_terms_follow_the_cost_tables_split_and_virtual_chunks():
    # The per-rank parameters come from the layers the cost table gives each model
    # stage, summed over a rank's chunks under virtual stages.
    r = _rows("torchtitan.csv", model="405B", other_flags="1F1B")[0]
    model, cluster, cfg = row_setup(r)
    other = {**r, "framework": "other"}
    cm = AnalyticCostModel()
    split = (30,) + (14,) * 6 + (12,)
    table = cm.cost_table(model, cluster, cfg, split)
    peaks = (80e9,) + (10e9,) * (cfg.pp - 1)
    got = comparable_peak_bytes(r, model, cluster, cfg, table, peaks)
    ref = comparable_peak_bytes(other, model, cluster, cfg, table, peaks)
    work = [backward_working_bytes(model, cfg.micro_batch_size, cfg.tp, True, "full", p,
                                   cfg.dtype, cfg.cp) for p in (TORCHTITAN, FLASH)]
    p0 = stage_params(model, 30, True, False, cfg.tp)
    alloc = _titan_rank0_allocator(model, cfg, table, [(True, False)])
    assert got - ref == pytest.approx(p0 + work[0] - work[1] + alloc, rel=0.02)
    vcfg = replace(cfg, virtual_stages=2, schedule="interleaved-1f1b")
    vtable = cm.cost_table(model, cluster, vcfg, (8,) * 15 + (6,))
    assert [stage_rank(vcfg, g) for g in (0, 8)] == [0, 0]
    vgot = comparable_peak_bytes(r, model, cluster, vcfg, vtable, peaks)
    vref = comparable_peak_bytes(other, model, cluster, vcfg, vtable, peaks)
    p0 = stage_params(model, 8, True, False, cfg.tp) + stage_params(model, 8, False, False,
                                                                      cfg.tp)
    alloc = _titan_rank0_allocator(model, vcfg, vtable, [(True, False), (False, False)])
    assert vgot - vref == pytest.approx(p0 + work[0] - work[1] + alloc, rel=0.02)


def test_dtensor_sequence_parallelism_keeps_the_gathered_norm_outputs():
    m = get_model("llama3-70b")
    t, e, tok, h = 8, 2, m.seq_len, m.hidden
    mega = layer_activation_bytes(m, 1, t, True, "none", FLASH)
    titan = layer_activation_bytes(m, 1, t, True, "none", TORCHTITAN)
    assert titan - mega == pytest.approx(tok * 2 * e * h * (1 - 1 / t))
    # Without sequence parallelism both keep the replicated norm outputs.
    assert layer_activation_bytes(m, 1, t, False, "none", TORCHTITAN) == \
        layer_activation_bytes(m, 1, t, False, "none", FLASH)
    head = last_stage_extra_bytes(m, 1, t, True, TORCHTITAN) - \
        last_stage_extra_bytes(m, 1, t, True, FLASH)
    assert head == pytest.approx(tok * e * h * (1 - 1 / t) + tok * 4 * h / t)  # + eager norm
