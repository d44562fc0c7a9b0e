"""Measured NCCL collectives and pipeline sends (merak_sim.costs.nccl, costs.comm)."""

import csv
from pathlib import Path

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.calibrated import CalibratedCostModel
from merak_sim.costs.comm import (
    CostModelError,
    collective_time,
    measured_collectives,
    pipeline_send_time,
)
from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.nccl import A100_NVSWITCH, NCCL_TABLES
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model

DATA = Path(__file__).resolve().parents[1] / "data" / "vtrain" / "nccl-a100"


def test_embedded_table_rebuilds_from_the_csv_files():
    for p, times in A100_NVSWITCH.allreduce_s:
        got = {}
        with open(DATA / f"AR_GPU{p}.csv", newline="") as f:
            for row in csv.reader(f):
                if not row[0].startswith("size"):
                    got[int(row[0])] = (float(row[3]) + float(row[5])) / 2 * 1e-9
        for size, t in zip(A100_NVSWITCH.sizes_bytes, times, strict=True):
            assert t == pytest.approx(got[size], abs=1e-8), (p, size)


def test_bus_bandwidth_grows_with_group_size():
    bw = [A100_NVSWITCH.bus_bandwidth_Bps(64 << 20, p) / 1e9 for p in (2, 4, 8)]
    assert bw[0] < bw[1] < bw[2]
    assert bw == pytest.approx([166, 185, 202], rel=0.02)


def test_interpolation_and_edges():
    t = A100_NVSWITCH
    lo, hi = t.sizes_bytes[0], t.sizes_bytes[1]
    mid = t.allreduce_time((lo + hi) / 2, 4)
    assert t.allreduce_time(lo, 4) < mid < t.allreduce_time(hi, 4)
    assert t.allreduce_time(10, 4) == t.allreduce_time(lo, 4)  # latency plateau
    big = t.sizes_bytes[-1]
    assert t.allreduce_time(2 * big, 8) > t.allreduce_time(big, 8)
    assert t.time("reduce-scatter", big, 8) == pytest.approx(0.5 * t.allreduce_time(big, 8))
    assert t.time("all-reduce", 1e6, 1) == 0.0


def test_measured_collectives_replace_alpha_beta_inside_a_node():
    c = get_cluster("vtrain-a100", nodes=2)
    meas = measured_collectives(A100_NVSWITCH)
    ranks = tuple(range(4))
    n = 64 << 20
    assert meas("all-reduce", n, ranks, c) == pytest.approx(
        A100_NVSWITCH.allreduce_time(n, 4))
    assert meas("all-reduce", n, ranks, c) != collective_time("all-reduce", n, ranks, c)
    # Across nodes the intra-node halves of the hierarchical algorithm are measured.
    both = (0, 1, 8, 9)
    assert meas("all-reduce", n, both, c) != collective_time("all-reduce", n, both, c)
    # p2p keeps the link model.
    assert meas("p2p", n, (0, 8), c) == collective_time("p2p", n, (0, 8), c)


def test_scatter_gather_sends_one_tp_th_across_nodes():
    c = get_cluster("vtrain-a100", nodes=2)
    src, dst = (0, 1, 2, 3), (8, 9, 10, 11)
    n = 32 << 20
    full = pipeline_send_time("full", n, src, dst, c)
    sg = pipeline_send_time("scatter-gather", n, src, dst, c)
    assert full == pytest.approx(collective_time("p2p", n, (0, 8), c))
    assert sg == pytest.approx(collective_time("p2p", n / 4, (0, 8), c)
                               + collective_time("all-gather", n, dst, c))
    assert sg < full
    assert pipeline_send_time("scatter-gather", n, (0,), (8,), c) == full
    with pytest.raises(CostModelError, match="pipeline send"):
        pipeline_send_time("bogus", n, src, dst, c)
    with pytest.raises(CostModelError, match="pipeline send"):
        AnalyticCostModel(pipeline_send="bogus")


def test_cost_table_uses_the_pipeline_send_mode():
    model = get_model("vtrain-3.6b")
    c = get_cluster("vtrain-a100", nodes=2)
    cfg = ParallelConfig(dp=1, tp=8, pp=2, global_batch_size=8, dtype="fp16")
    full = AnalyticCostModel(pipeline_send="full").cost_table(model, c, cfg)
    sg = AnalyticCostModel(pipeline_send="scatter-gather").cost_table(model, c, cfg)
    assert sg.stages[0].send_activation_s < full.stages[0].send_activation_s
    assert sg.stages[0].forward_s == full.stages[0].forward_s
    # Sequence parallelism already shards the activation: no scatter-gather on top.
    cfg_sp = ParallelConfig(dp=1, tp=8, pp=2, global_batch_size=8, dtype="fp16",
                            sequence_parallel=True)
    assert (AnalyticCostModel(pipeline_send="full").cost_table(model, c, cfg_sp)
            .stages[0].send_activation_s
            == AnalyticCostModel(pipeline_send="scatter-gather").cost_table(model, c, cfg_sp)
            .stages[0].send_activation_s)


def test_calibrated_model_measures_a100_clusters_only():
    assert set(NCCL_TABLES) == {"vtrain-a100", "dgx-a100-80g", "dgx-a100-40g"}
    model = get_model("vtrain-3.6b")
    cfg = ParallelConfig(dp=1, tp=8, pp=1, global_batch_size=8, dtype="fp16")
    a100 = get_cluster("dgx-a100-80g", nodes=1)
    t = CalibratedCostModel().cost_table(model, a100, cfg)
    alpha_beta = AnalyticCostModel(efficiency=Efficiency(**t.meta["efficiency"])).cost_table(
        model, a100, cfg)
    assert t.stages[0].tp_comm_fwd_s != alpha_beta.stages[0].tp_comm_fwd_s


def test_calibrated_model_takes_a_pipeline_send_and_keeps_the_defaults_without_one():
    model = get_model("vtrain-3.6b")
    cfg = ParallelConfig(dp=1, tp=8, pp=2, global_batch_size=8, dtype="fp16")
    send = {}
    for name in ("vtrain-a100", "dgx-h100"):
        c = get_cluster(name, nodes=2)
        send[name] = {ps: CalibratedCostModel(ps).cost_table(model, c, cfg)
                      .stages[0].send_activation_s
                      for ps in (None, "full", "scatter-gather")}
        assert send[name]["scatter-gather"] < send[name]["full"]
    # Defaults: scatter-gather on the measured A100 preset, full on the others.
    assert send["vtrain-a100"][None] == send["vtrain-a100"]["scatter-gather"]
    assert send["dgx-h100"][None] == send["dgx-h100"]["full"]
    with pytest.raises(CostModelError, match="unknown pipeline send 'half'"):
        CalibratedCostModel("half")


def test_pipeline_send_option_reaches_simulate_costs_and_plan(tmp_path, capsys):
    import json

    from merak_sim.cli import main

    base = ["--model", "vtrain-3.6b", "--cluster", "dgx-h100", "--nodes", "2"]
    cfg = ["--dp", "1", "--tp", "8", "--pp", "2", "--global-batch-size", "8",
           "--dtype", "fp16"]
    got = {}
    for ps in ("full", "scatter-gather"):
        assert main(["simulate", *base, *cfg, "--micro-batch-size", "1", "--schedule",
                     "1f1b", "--recompute", "none", "--engine", "evaluator",
                     "--pipeline-send", ps, "--json"]) == 0
        sim = json.loads(capsys.readouterr().out)["iteration_time_s"]
        assert main(["costs", *base, *cfg, "--pipeline-send", ps, "--json"]) == 0
        costs = json.loads(capsys.readouterr().out)
        assert main(["plan", *base, "--global-batch-size", "8", "--tp", "8", "--pp", "2",
                     "--schedules", "1f1b", "--micro-batch-sizes", "1", "--dtype", "fp16",
                     "--top", "1", "--no-confirm", "--pipeline-send", ps,
                     "--space", "megatron",  # no sequence parallelism: the sends differ
                     "--out", str(tmp_path / f"{ps}.json"), "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        got[ps] = (sim, costs, plan["plan"]["predicted"]["iteration_time_s"])
    assert got["scatter-gather"][0] < got["full"][0]
    assert got["scatter-gather"][2] < got["full"][2]
    assert got["scatter-gather"][1] != got["full"][1]
