"""Fixed costs at scale (issue 36 item 5; merak_sim.costs.fixed): each term against its
formula in the module docstring, told as notes, charged only where the cluster sets
gpu_jitter_cv (so the presets' figures do not move)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import collective_time
from merak_sim.costs.fixed import GRAD_NORM_BYTES, fixed_costs, slowest_of_n_s
from merak_sim.hardware import Cluster, HardwareError, get_cluster
from merak_sim.model import get_model

MODEL = get_model("llama3-8b")
CFG = ParallelConfig(dp=2, tp=2, pp=4, global_batch_size=16)
CL = get_cluster("dgx-h100", 2)


def test_slowest_of_n_is_cv_t_sqrt_2_ln_n():
    assert slowest_of_n_s(2.0, 0.01, 10_000) == pytest.approx(
        0.01 * 2.0 * math.sqrt(2 * math.log(10_000)))
    # grows with N, and vanishes with one GPU or no jitter
    assert slowest_of_n_s(1.0, 0.02, 1024) < slowest_of_n_s(1.0, 0.02, 16384)
    assert slowest_of_n_s(1.0, 0.02, 1) == slowest_of_n_s(1.0, 0.0, 9) == 0.0
    # the bound holds against a simulated maximum of N normals (Boucheron et al. 2.5)
    import random
    rng = random.Random(7)
    n, cv = 512, 0.05
    means = [max(1 + cv * rng.gauss(0, 1) for _ in range(n)) - 1 for _ in range(200)]
    assert sum(means) / len(means) < slowest_of_n_s(1.0, cv, n)
    with pytest.raises(ValueError, match="jitter"):
        slowest_of_n_s(1.0, -0.1, 4)


def test_terms_match_their_formulas():
    table = AnalyticCostModel().cost_table(MODEL, CL, CFG)
    fc = fixed_costs(collective_time, CL, CFG, table.stages)
    assert fc.ranks == 16
    assert fc.grad_norm_s == collective_time("all-reduce", GRAD_NORM_BYTES,
                                             tuple(range(16)), CL)
    assert 0 < fc.grad_norm_s < 1e-3  # latency-bound: microseconds, not bandwidth
    assert fc.optimizer_s == max(st.optimizer_s for st in table.stages)
    # pp=4 in 16 ranks of 8-GPU nodes: stage boundaries cross nodes (tp-cp-dp-pp order)
    assert fc.pipeline_latency_s == pytest.approx(2 * 3 * CL.inter.latency_s)
    busiest = max(st.forward_s + st.backward_s for st in table.stages)
    assert fc.compute_s == pytest.approx(CFG.num_microbatches * busiest)


def test_presets_charge_nothing_and_tell_each_term_as_a_note():
    table = AnalyticCostModel().cost_table(MODEL, CL, CFG)
    fixed = [n for n in table.notes if n.startswith("fixed: ")]
    assert len(fixed) == 4
    assert all("not charged" in n for n in fixed if "gradient-norm" in n or "slowest" in n)
    for word in ("optimizer step", "gradient-norm", "fill/drain", "slowest of 16"):
        assert any(word in n for n in fixed), word


def test_jitter_charges_grad_norm_and_slowest_of_n_in_the_optimizer_step():
    cm = AnalyticCostModel()
    base = cm.cost_table(MODEL, CL, CFG)
    cv = 0.02
    jit = dataclasses.replace(CL, gpu_jitter_cv=cv)
    table = cm.cost_table(MODEL, jit, CFG)
    fc = fixed_costs(collective_time, jit, CFG, base.stages)
    want = fc.grad_norm_s + cv * fc.compute_s * math.sqrt(2 * math.log(16))
    for a, b in zip(base.stages, table.stages, strict=True):
        assert b.optimizer_s - a.optimizer_s == pytest.approx(want)
        assert b.forward_s == a.forward_s
    zero = cm.cost_table(MODEL, dataclasses.replace(CL, gpu_jitter_cv=0.0), CFG)
    assert zero.stages[0].optimizer_s - base.stages[0].optimizer_s == pytest.approx(
        fc.grad_norm_s)


def test_cluster_json_takes_and_checks_the_jitter():
    cl = Cluster.from_json({"preset": "dgx-h100", "gpu_jitter_cv": 0.01})
    assert cl.gpu_jitter_cv == 0.01 and Cluster.from_json(cl.to_dict()).gpu_jitter_cv == 0.01
    assert "gpu_jitter_cv" not in CL.to_dict()  # unset: the old form
    with pytest.raises(HardwareError, match="gpu_jitter_cv"):
        Cluster.from_json({"preset": "dgx-h100", "gpu_jitter_cv": -1})
