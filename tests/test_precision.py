"""Training precisions: GEMM rates, cast kernels, state memory, MFU naming (issue 36,
item 2)."""

import pytest

from merak_sim.config import DTYPES, ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.hardware import GPU_PRESETS, HardwareError, get_cluster
from merak_sim.memory import model_state_bytes
from merak_sim.model import get_model
from merak_sim.precision import (
    LOW_PRECISION,
    get_precision,
    mfu_label,
    mfu_reference,
    optimizer_cast_bytes,
)


def test_every_config_dtype_has_a_precision():
    assert set(DTYPES) == {*(get_precision(d).name for d in DTYPES)}
    assert set(LOW_PRECISION) == {"fp8", "fp8-block", "mxfp8", "nvfp4"}


def test_cast_bytes_per_element():
    # fp8 per tensor: read 2, write 1 (the figure the model always charged).
    assert get_precision("fp8").cast_bytes() == 3
    # MXFP8: read 2, write a row-wise and a column-wise copy with an E8M0 per 32.
    assert get_precision("mxfp8").cast_bytes() == pytest.approx(2 + 2 * (1 + 1 / 32))
    # NVFP4: amax pass 2, read 2, two copies of 1/2 byte + an E4M3 scale per 16.
    assert get_precision("nvfp4").cast_bytes() == pytest.approx(4 + 2 * (0.5 + 1 / 16))
    assert get_precision("fp8-block").cast_bytes() == pytest.approx(2 + 2 * (1 + 4 / 128))
    assert get_precision("bf16").cast_bytes() == 0


def test_state_memory_per_parameter():
    p = 1e9
    assert model_state_bytes(p, "bf16").total_bytes == 16 * p
    assert model_state_bytes(p, "fp8").total_bytes == 17 * p
    assert model_state_bytes(p, "mxfp8").weight_bytes == pytest.approx((2 + 2 * 33 / 32) * p)
    assert model_state_bytes(p, "nvfp4").weight_bytes == pytest.approx((2 + 2 * 9 / 16) * p)
    # ZeRO-3 shards the cached copies with the weights.
    assert model_state_bytes(p, "nvfp4", dp=8, zero=3).weight_bytes == pytest.approx(
        (2 + 2 * 9 / 16) * p / 8)
    assert optimizer_cast_bytes("fp8") == 3 and optimizer_cast_bytes("bf16") == 0


def test_gemm_rates_and_refusals():
    b200 = GPU_PRESETS["B200-180GB"]
    assert b200.peak("mxfp8") == b200.peak("fp8") == 2 * b200.peak("bf16")
    assert b200.peak("nvfp4") == 4 * b200.peak("bf16")
    assert GPU_PRESETS["H100-80GB"].peak("fp8-block") == 1979e12
    with pytest.raises(HardwareError, match="H100-80GB has no FP4 tensor cores.*--dtype bf16"):
        GPU_PRESETS["H100-80GB"].peak("nvfp4")
    with pytest.raises(HardwareError, match="no block-scaled tensor cores.*Blackwell"):
        GPU_PRESETS["H200-141GB"].peak("mxfp8")


def _layer(dtype: str, cluster: str = "dgx-b200"):
    m = get_model("llama3-8b")
    cfg = ParallelConfig(dp=8, dtype=dtype, global_batch_size=8)
    return AnalyticCostModel().layer_costs(m, get_cluster(cluster), cfg)[0]


def test_low_precision_layers_are_faster_and_cast_more():
    bf16, fp8, mx, fp4 = (_layer(d) for d in ("bf16", "fp8", "mxfp8", "nvfp4"))
    t = [x.forward_s + x.backward_input_s + x.backward_weight_s for x in (bf16, fp8, mx, fp4)]
    assert t[0] > t[2] > t[3] and t[0] > t[1]
    # Same FP8 rate: MXFP8 differs from per-tensor FP8 only by its casts.
    ratio = get_precision("mxfp8").cast_bytes() / 3
    assert mx.fp8_cast_s == pytest.approx(fp8.fp8_cast_s * ratio, rel=0.05)
    assert mx.fp8_cast_s > fp8.fp8_cast_s and bf16.fp8_cast_s == 0


def test_nvfp4_refused_on_hopper_in_the_cost_model():
    m = get_model("llama3-8b")
    cfg = ParallelConfig(dp=8, dtype="nvfp4", global_batch_size=8)
    with pytest.raises(HardwareError, match="nvfp4 cannot run"):
        AnalyticCostModel().cost_table(m, get_cluster("dgx-h100"), cfg)


def test_mfu_is_named_against_its_peak():
    assert mfu_reference("mxfp8") == "bf16" and mfu_reference("fp32") == "fp32"
    line = mfu_label("nvfp4", 2.5e15, 10e15)
    assert "bf16 dense peak 2,500 TFLOP/s" in line and "10,000" in line and "0.25" in line
    m = get_model("llama3-8b")
    cfg = ParallelConfig(dp=8, dtype="mxfp8", global_batch_size=8)
    tab = AnalyticCostModel().cost_table(m, get_cluster("dgx-b200"), cfg)
    assert tab.peak_flops == 2250e12 and tab.meta["mfu_reference"] == "bf16"
    assert any(n.startswith("MFU against the bf16 dense peak 2,250") for n in tab.notes)
