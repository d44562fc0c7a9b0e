"""The efficiency curve: named parameters, shape behaviour, validation, defaults."""

import pytest

from merak_sim.costs.efficiency import DEFAULT_EFFICIENCY, Efficiency, default_efficiency
from merak_sim.hardware import GPU_PRESETS


def test_every_gpu_preset_has_a_default():
    for name in GPU_PRESETS:
        assert name in DEFAULT_EFFICIENCY
    assert default_efficiency("unknown-gpu") == DEFAULT_EFFICIENCY["A100-80GB"]


def test_gemm_efficiency_grows_with_size_and_saturates():
    e = Efficiency()
    sizes = [64, 256, 1024, 4096, 16384]
    effs = [e.gemm(n, n, n) for n in sizes]
    assert effs == sorted(effs)
    assert effs[-1] < e.gemm_max and effs[-1] > 0.95 * e.gemm_max
    # Thin GEMMs (tensor-parallel shards) are less efficient than square ones.
    assert e.gemm(8192, 128, 4096) < e.gemm(8192, 4096, 4096)


def test_gemm_time_and_overheads():
    e = Efficiency(kernel_overhead_s=1e-5)
    t = e.gemm_time(4096, 4096, 4096, 312e12)
    assert t == pytest.approx(2 * 4096**3 / (312e12 * e.gemm(4096, 4096, 4096)) + 1e-5)
    assert e.gemm_time(64, 64, 64, 312e12, batch=8, attention=True) > \
        e.gemm_time(64, 64, 64, 312e12, batch=8)
    assert e.mem_time(1e9, 2e12, kernels=3) == pytest.approx(1e9 / (2e12 * e.mem_bw_eff)
                                                            + 3e-5)


def test_parameters_are_named_and_settable():
    e = Efficiency().with_(gemm_max=0.6, kernel_overhead_s=2e-5)
    assert e.to_dict()["gemm_max"] == 0.6 and e.kernel_overhead_s == 2e-5
    assert set(e.to_dict()) == {"gemm_max", "gemm_dim_half", "gemm_flops_half",
                                "attn_factor", "mem_bw_eff", "kernel_overhead_s", "host_op_s"}


@pytest.mark.parametrize("kw,needle", [
    ({"gemm_max": 0.0}, "gemm_max must be positive"),
    ({"gemm_max": 1.2}, "must be <= 1"),
    ({"mem_bw_eff": -0.1}, "mem_bw_eff must be positive"),
    ({"kernel_overhead_s": -1.0}, "kernel_overhead_s must be >= 0, got -1.0"),
])
def test_bad_parameters(kw, needle):
    with pytest.raises(ValueError, match=needle):
        Efficiency(**kw)
