"""The public MoE rows (data/public-runs/nemo_perf.csv) mapped onto the simulator: which
are expressible and why not, the mapping of one row, the declared fit subset."""

from collections import Counter
from pathlib import Path

import pytest

from merak_sim.costs.calibrated_hopper import hopper_cost_model
from merak_sim.sim.api import simulate
from merak_sim.validation.fidelity import fit_rows, is_moe_row, role_of
from merak_sim.validation.public_runs import (
    load_rows,
    measured_step_s,
    row_setup,
    skip_reason,
)

NEMO = Path(__file__).resolve().parents[1] / "data" / "public-runs" / "nemo_perf.csv"
DS = "public-runs/nemo_perf"


@pytest.fixture(scope="module")
def h100_moe():
    return [r for r in load_rows(NEMO) if is_moe_row(r) and r["gpu_type"].startswith("H100")]


def test_h100_moe_rows_mapped_or_named(h100_moe):
    why = Counter(skip_reason(r) for r in h100_moe)
    assert why[None] >= 16  # Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS-120B
    for reason in why:
        assert reason is None or "precision not stated" in reason or "MoE preset" in reason


def test_a_qwen3_235b_row_maps_to_its_preset_and_degrees(h100_moe):
    row = next(r for r in h100_moe if r["model"] == "Qwen3_235B_a22B" and not skip_reason(r))
    model, cluster, cfg = row_setup(row)
    assert model.name == "qwen3-235b-a22b" and model.moe.experts == 128
    assert (cfg.dp, cfg.tp, cfg.pp, cfg.virtual_stages, cfg.ep, cfg.etp) == (
        16, 2, 8, 4, 32, 1)
    assert cfg.moe_a2a_overlap and cfg.dtype == "fp8"
    assert cluster.world_size == 256


def test_tokendrop_rows_get_capacity_factor_one():
    row = next(r for r in load_rows(NEMO) if "tokendrop" in r["model"]
               and r["gpu_type"].startswith("H100"))
    assert skip_reason(row) == "precision not stated"  # 25.09's table states none
    fake = dict(row, precision="FP8")
    assert row_setup(fake)[0].moe.capacity_factor == 1.0


def test_declared_fit_subset_and_hopper_fits_untouched(h100_moe):
    roles = Counter(role_of(DS, r) for r in h100_moe if not skip_reason(r))
    assert roles["fit"] == 3 and roles["held out"] >= 13
    assert all(r["model"].startswith("Qwen3_30B") and r["pp"] in ("", "1")
               for r in h100_moe if role_of(DS, r) == "fit")
    assert not any(is_moe_row(r) for r in fit_rows({DS: load_rows(NEMO)}, "megatron-te"))


def test_held_out_qwen3_235b_row_is_priced(h100_moe):
    row = next(r for r in h100_moe if r["model"] == "Qwen3_235B_a22B" and not skip_reason(r))
    model, cluster, cfg = row_setup(row)
    res = simulate(model, cluster, cfg, cost_model=hopper_cost_model("megatron-te"),
                   engine="evaluator", sub_cluster=True, keep_trace=False)
    err = res.iteration_time_s / measured_step_s(row) - 1
    assert abs(err) < 0.12  # issue 35's held-out H100 MoE target
    assert any("all-to-all" in n for n in res.notes)
