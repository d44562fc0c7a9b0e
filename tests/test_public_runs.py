"""Mapping of published runs (data/public-runs) onto model, cluster and configuration."""

from pathlib import Path

import pytest

from merak_sim.allocator_memory import cublas_workspace_bytes
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.validation.public_runs import (
    MEMORY_MEASURE,
    comparable_peak_bytes,
    load_rows,
    measured_step_s,
    preset_for,
    row_setup,
    skip_reason,
    stage_layers,
)
from merak_sim.memory import stage_params

DATA = Path(__file__).resolve().parents[1] / "data" / "public-runs"


def _row(file: str, **match: str) -> dict:
    for r in load_rows(DATA / file):
        if all(r[k] == v for k, v in match.items()):
            return r
    raise LookupError(match)


@pytest.mark.parametrize("name,preset", [
    ("Llama 3.1 8B", "llama3-8b"), ("LLAMA3_70B", "llama3-70b"),
    ("LLAMA3.1_405B", "llama3-405b-like"), ("Llama 2 13B", "llama2-13b"),
    ("LLAMA2-7B", "llama2-7b"), ("MPT-30b", "mpt-30b"), ("GPT3-175B", "gpt3-175b"),
    ("GPT3-5B", "nemo-gpt3-5b"), ("Nemotron-8B", None), ("OPT-350M", None)])
def test_model_names_map_to_presets(name, preset):
    assert preset_for(name) == preset


def test_torchtitan_fsdp_and_cp_rows():
    r = _row("torchtitan.csv", model="Llama 3.1 8B", num_gpus="8", seq_len="8192",
             precision="bf16", other_flags="FSDP2")
    model, cluster, cfg = row_setup(r)
    assert model.name == "llama3-8b" and model.vocab == 128256 and model.seq_len == 8192
    assert cluster.name == "dgx-h100" and cluster.world_size == 8
    assert (cfg.dp, cfg.tp, cfg.zero, cfg.zero_group, cfg.recompute) == (8, 1, 3, 0,
                                                                        "selective")
    assert cfg.attention == "flash" and cfg.dtype == "bf16"
    assert measured_step_s(r) == pytest.approx(16 * 8192 / (5762 * 8))
    r = _row("torchtitan.csv", model="Llama 3.1 8B", seq_len="65536")
    _, _, cfg = row_setup(r)
    assert (cfg.dp, cfg.cp, cfg.zero, cfg.dtype, cfg.recompute) == (4, 2, 3, "fp8", "full")
    r = _row("torchtitan.csv", model="Llama 3 8B", activation_recompute=(
        "selective layer (torchtitan 'int' option; default every 2nd layer)"))
    model, cluster, cfg = row_setup(r)
    assert cluster.name == "dgx-a100-80g" and cfg.recompute == "stage-aware"
    assert cfg.recompute_fractions == (0.5,)


def test_llmfoundry_and_nemo_rows():
    r = _row("llmfoundry.csv", model="MPT-70b", num_gpus="512", gpu_type="H100 80GB")
    model, cluster, cfg = row_setup(r)
    assert model.name == "mpt-70b" and cluster.nodes == 64
    assert (cfg.dp, cfg.zero, cfg.micro_batch_size, cfg.global_batch_size) == (512, 3, 8,
                                                                               4096)
    r = _row("llmfoundry.csv", model="MPT-7b", gpu_type="A100 40GB (1600 Gbps RoCE node-node)",
             seq_len="2048", num_gpus="8")
    assert row_setup(r)[1].name == "dgx-a100-40g"
    r = _row("nemo_perf.csv", model="LLAMA2-70B", precision="FP8")
    model, cluster, cfg = row_setup(r)
    assert model.vocab == 32000 and (cfg.tp, cfg.pp, cfg.virtual_stages, cfg.dp) == (4, 4,
                                                                                     20, 4)
    assert cfg.schedule == "interleaved-1f1b" and cfg.zero == 1 and cfg.overlap_param_gather
    assert cfg.sequence_parallel and cfg.dtype == "fp8"
    r = _row("nemo_perf.csv", model="LLAMA3_8B", other_flags="Megatron FSDP (sharding group "
             "size 8)", precision="FP8-CS")
    _, _, cfg = row_setup(r)
    assert (cfg.dp, cfg.zero) == (8, 3)


@pytest.mark.parametrize("file,match,needle", [
    ("nemo_perf.csv", {"model": "Kimi_K2"}, "MoE model without an MoE preset"),
    ("torchtitan.csv", {"precision": "fp8 rowwise (torchao Float8)"},
     "row-wise scaling is not"),
    ("nemo_perf_finetune.csv", {"task": "sft"}, "fine-tuning"),
    ("sailor.csv", {"gpu_type": "heterogeneous: RTX 3090+Titan RTX"}, "heterogeneous"),
    ("sailor.csv", {"model": "GPT-Neo-2.7B (as configured by Sailor)", "num_gpus": "16",
                    "pp": "1"}, "copy error"),
    ("nemo_perf.csv", {"model": "LLAMA3_8B", "precision": "",
                       "gpu_type": "H100 SXM 80GB (DGX-H100)"}, "precision not stated"),
    ("torchtitan.csv", {"mfu_pct": "", "tokens_per_sec_per_gpu": ""}, "no measured"),
])
def test_unexpressible_rows_give_their_reason(file, match, needle):
    r = _row(file, **match)
    assert needle in skip_reason(r)
    with pytest.raises(ValueError, match="not expressible"):
        row_setup(r)


def test_sailor_rows_are_fp32_with_tf32_matmuls_on_gh200():
    r = _row("sailor.csv", model="OPT-350M", num_gpus="64", pp="4")
    model, cluster, cfg = row_setup(r)
    assert cluster.name == "alps-gh200" and cluster.gpus_per_node == 4 and cluster.nodes == 16
    assert cluster.gpu.peak("fp32") == pytest.approx(cluster.gpu.peak("bf16") / 2)
    assert (model.dtype, cfg.dtype, cfg.attention, cfg.sequence_parallel) == (
        "fp32", "fp32", "unfused", False)
    assert (cfg.dp, cfg.tp, cfg.pp, cfg.micro_batch_size, cfg.zero) == (4, 4, 4, 8, 0)
    assert measured_step_s(r) == pytest.approx(2.72578)


def test_shape_mismatch_and_block_scaled_precision_are_refused():
    r = _row("llmfoundry.csv", model="MPT-70b", num_gpus="512", gpu_type="H100 80GB")
    assert "differs from preset" in skip_reason({**r, "n_layers": "81"})
    assert "no block-scaled tensor cores" in skip_reason({**r, "precision": "MXFP8"})
    assert "row-wise" in skip_reason({**r, "precision": "fp8 rowwise (torchao Float8)"})


def test_hsdp_row_shards_inside_groups_and_replicates_across():
    r = _row("torchtitan.csv", model="Llama 3.1 8B", num_gpus="128", precision="bf16",
             other_flags="FSDP2")
    _, _, cfg = row_setup({**r, "dp": "4", "dp_shard": "32"})
    assert (cfg.dp, cfg.zero, cfg.zero_group, cfg.shard_group) == (128, 3, 32, 32)


def test_published_memory_is_compared_with_the_allocator_peak():
    # torchtitan logs the caching allocator's peak reserved memory: the prediction is
    # the simulated peak plus the backward working set (here the loss on the last stage)
    # and what the allocator reserves beyond live tensors (the freed 16-bit logits,
    # FSDP's all-gather stream pool of two units, the cuBLAS workspace).
    assert "reserved" in MEMORY_MEASURE["torchtitan"] and "used" in MEMORY_MEASURE["sailor"]
    # (bf16: torchtitan's fp8 would also drop the cached FP8 weights, tested elsewhere)
    r = {**_row("torchtitan.csv", model="Llama 3.1 8B", seq_len="32768"), "precision": "bf16"}
    model, cluster, cfg = row_setup(r)
    tok = cfg.micro_batch_size * model.seq_len
    table = AnalyticCostModel().cost_table(model, cluster, cfg)
    # The simulated peak holds the table's (the backend's) reservations.
    got = comparable_peak_bytes(r, model, cluster, cfg, table, (20e9 + table.reserved(0),))
    pool = 2 * (stage_params(model, 0, True, True) + stage_params(model, 1, False, False))
    assert got == pytest.approx(20e9 + tok * 8 * model.vocab + tok * 2 * model.vocab + pool
                                + cublas_workspace_bytes(cluster.gpu.name))
    assert comparable_peak_bytes(r, model, cluster, cfg, table, (30e9,)) > 30e9


def test_sailor_stage_layers_drop_the_embedding_and_head_counts():
    r = {"other_flags": "layers_per_stage=7/9/9/9; stage0[7 layers]", "pp": "4",
         "n_layers": "32"}
    assert stage_layers(r) == (6, 9, 9, 8)
    assert stage_layers({**r, "pp": "2"}) is None  # counts disagree with pp
    assert stage_layers({**r, "n_layers": "24"}) is None
    assert stage_layers({"other_flags": "FSDP2", "pp": "1", "n_layers": "8"}) is None
    rows = [r for r in load_rows(DATA / "sailor.csv") if skip_reason(r) is None
            and _int_or(r["pp"]) > 1]
    assert rows and all(sum(stage_layers(r)) == int(r["n_layers"]) for r in rows)


def _int_or(v: str) -> int:
    return int(v) if v.strip() else 1


def test_torchtitan_fsdp_under_pipelining_keeps_parameters_unsharded():
    r = _row("torchtitan.csv", model="Llama 3.1 405B", seq_len="32768")
    _, _, cfg = row_setup(r)
    assert (cfg.pp, cfg.tp, cfg.dp, cfg.zero) == (8, 8, 8, 1)
    r = _row("torchtitan.csv", model="Llama 3.1 70B", num_gpus="256")
    assert row_setup(r)[2].zero == 3  # no pipelining: FSDP as ZeRO 3


def test_blackwell_rows_map_to_nvl72_and_block_scaled_precisions():
    r = _row("nemo_perf.csv", model="LLAMA3.1_405B", precision="MXFP8",
             gpu_type="GB300 (DGX-GB300 NVL72)")
    model, cluster, cfg = row_setup(r)
    assert cluster.name == "gb300-nvl72" and cluster.domain_size == 72
    assert cluster.world_size == cfg.world_size == 256 and cluster.gpus_per_node == 4
    assert cfg.dtype == "mxfp8" and model.dtype == "bf16"
    r = _row("nemo_perf.csv", model="LLAMA3_8B", precision="FP8 32x32 blocks (MX-style)",
             gpu_type="B200 (DGX-B200)")
    _, cluster, cfg = row_setup(r)
    assert cluster.name == "dgx-b200" and cfg.dtype == "mxfp8"
    r = _row("nemo_perf.csv", model="LLAMA3_70B", precision="NVFP4",
             gpu_type="GB200 (DGX-GB200 NVL72)")
    assert row_setup(r)[2].dtype == "nvfp4"
