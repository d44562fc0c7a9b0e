"""The caching allocator's reservations (merak_sim.allocator_memory.reserved_bytes) in
the cost table, and so in every peak the simulator, the memory model and the planner
compare with the capacity; the public-runs comparison swaps them for the row's stack."""

from __future__ import annotations

from dataclasses import replace

import pytest

from merak_sim.allocator_memory import (
    BACKEND,
    MEGATRON,
    cublas_workspace_bytes,
    fsdp_stream_pool_bytes,
    reserved_bytes,
)
from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.hardware import get_cluster
from merak_sim.memory import peak_memory, stage_params
from merak_sim.model import get_model
from merak_sim.planner import NoFeasiblePlanError, SearchSpace, search
from merak_sim.sim import simulate
from merak_sim.sim.from_config import zero_bubble_costs

MiB = 1 << 20
MODEL = get_model("gpt-2.5b")
H100 = get_cluster("dgx-h100", nodes=1)
CFG = ParallelConfig(dp=4, tp=2, pp=1, micro_batch_size=2, global_batch_size=8)
CM = AnalyticCostModel()


def test_gpu_tables_reserve_the_cublas_workspace_on_every_rank():
    cfg = replace(CFG, dp=2, pp=2, global_batch_size=8)
    table = CM.cost_table(MODEL, H100, cfg)
    assert table.reserved_bytes == (32 * MiB, 32 * MiB)
    a100 = CM.cost_table(MODEL, get_cluster("dgx-a100-80g", nodes=1), cfg)
    assert a100.reserved_bytes == (cublas_workspace_bytes("A100-80GB"),) * 2


def test_zero_3_adds_fsdp2s_all_gather_pool_of_two_units():
    cfg = replace(CFG, zero=3)
    table = CM.cost_table(MODEL, H100, cfg)
    # The backend's units are the cost model's: the embedding, each layer, the head.
    emb = stage_params(MODEL, 0, True, False, 2)
    units = [emb] + [stage_params(MODEL, 1, False, False, 2)] * MODEL.layers
    units.append(stage_params(MODEL, 0, True, True, 2) - emb)
    assert table.reserved(0) == pytest.approx(32 * MiB + fsdp_stream_pool_bytes(units, 2))
    # ZeRO 1 keeps Megatron-style flat buffers: no FSDP2 pool; the Megatron stack has
    # none at any stage.
    assert CM.cost_table(MODEL, H100, replace(CFG, zero=1)).reserved(0) == 32 * MiB
    layers = [st.layers for st in table.stages]
    assert reserved_bytes(MODEL, "H100-80GB", cfg, layers, MEGATRON) == (32 * MiB,)
    assert reserved_bytes(MODEL, "H100-80GB", cfg, layers, BACKEND) == table.reserved_bytes


def test_simulated_peak_and_memory_model_include_the_reservation():
    cfg = replace(CFG, zero=3)
    table = CM.cost_table(MODEL, H100, cfg)
    bare = replace(table, reserved_bytes=())
    for engine in ("evaluator", "simpy"):
        got = simulate(MODEL, H100, cfg, cost_table=table, engine=engine, keep_trace=False)
        ref = simulate(MODEL, H100, cfg, cost_table=bare, engine=engine, keep_trace=False)
        assert got.peak_memory_bytes[0] == pytest.approx(
            ref.peak_memory_bytes[0] + table.reserved(0), rel=1e-12)
        assert got.iteration_time_s == ref.iteration_time_s
    assert peak_memory(table, cfg)[0].total_bytes == pytest.approx(got.peak_memory_bytes[0],
                                                                   rel=1e-12)


def test_a_run_just_under_capacity_without_the_reservation_does_not_fit_with_it():
    table = CM.cost_table(MODEL, H100, CFG)
    bare = replace(table, reserved_bytes=())
    live = simulate(MODEL, H100, CFG, cost_table=bare, engine="evaluator").peak_memory_bytes[0]
    cap = live + 16 * MiB  # under the 32 MiB cuBLAS workspace
    assert simulate(MODEL, H100, CFG, cost_table=replace(bare, memory_capacity_bytes=cap),
                    engine="evaluator").fits_in_memory
    res = simulate(MODEL, H100, CFG, cost_table=replace(table, memory_capacity_bytes=cap),
                   engine="evaluator")
    assert not res.fits_in_memory


class _Capped:
    """The analytic model with a set capacity (and optionally no reservations)."""

    def __init__(self, capacity: float, reserve: bool):
        self.capacity, self.reserve = capacity, reserve

    def cost_table(self, model, cluster, config, partition=None):
        t = replace(CM.cost_table(model, cluster, config, partition),
                    memory_capacity_bytes=self.capacity)
        return t if self.reserve else replace(t, reserved_bytes=())

    def comm_time(self, collective, nbytes, ranks, cluster):
        return CM.comm_time(collective, nbytes, ranks, cluster)


def test_planner_rejects_a_plan_just_under_capacity_without_the_reservation():
    space = SearchSpace(tp=(2,), pp=(1,), micro_batch_sizes=(2,), schedules=("1f1b",),
                        recompute=("none",), sequence_parallel=(False,),
                        tp_overlap=("none",), zero=(0,))
    table = CM.cost_table(MODEL, H100, CFG)
    live = simulate(MODEL, H100, CFG, cost_table=replace(table, reserved_bytes=()),
                    engine="evaluator").peak_memory_bytes[0]
    cap = live + 16 * MiB
    plan = search(MODEL, H100, 8, space=space, cost_model=_Capped(cap, False), confirm=False)
    assert plan.best.parallel.tp == 2
    with pytest.raises(NoFeasiblePlanError):
        search(MODEL, H100, 8, space=space, cost_model=_Capped(cap, True), confirm=False)
    roomy = search(MODEL, H100, 8, space=space, cost_model=_Capped(cap + 32 * MiB, True),
                   confirm=False)
    # The planner's peak, the simulator's and the reservation agree.
    peak = live + 32 * MiB
    assert roomy.table.iloc[0]["peak_memory_gib"] * 2**30 == pytest.approx(peak, rel=1e-9)
    assert roomy.best_result.peak_memory_bytes[0] == pytest.approx(peak, rel=1e-9)


def test_cpu_runs_reserve_nothing():
    cpu = get_cluster("local-cpu")
    model = MODEL.with_(layers=2, hidden=256, heads=4, kv_heads=4, seq_len=64, vocab=512,
                        ffn_hidden=1024, max_positions=64)
    cfg = ParallelConfig(dp=1, tp=2, pp=2, micro_batch_size=1, global_batch_size=4,
                         zero=0)
    table = CM.cost_table(model, cpu, cfg)
    assert table.reserved_bytes == (0.0, 0.0)
    got = simulate(model, cpu, cfg, cost_table=table, engine="evaluator")
    ref = simulate(model, cpu, cfg, cost_table=replace(table, reserved_bytes=()),
                   engine="evaluator")
    assert got.peak_memory_bytes == ref.peak_memory_bytes


def test_zero_bubble_memory_limit_leaves_room_for_the_reservation():
    # zb-auto's per-rank limit counts the micro-batches that fit beside the state and
    # the allocator's reservation, as the simulated peak does.
    cfg = replace(CFG, dp=2, pp=2, zero=3, global_batch_size=8)
    table = CM.cost_table(MODEL, H100, cfg)
    fractions = (0.0, 0.0)
    per = [st.kept_bytes(0.0) for st in table.stages]
    # A capacity where the reservation costs rank 0 one micro-batch's room.
    res0 = table.reserved(0)
    assert 0 < res0 < 3 * per[0]
    cap = table.stages[0].state_bytes + 3 * per[0] + min(res0, per[0]) / 2
    held = zero_bubble_costs(replace(table, memory_capacity_bytes=cap), fractions)
    bare = zero_bubble_costs(
        replace(table, memory_capacity_bytes=cap, reserved_bytes=()), fractions)
    for r, st in enumerate(table.stages):
        free = cap - st.state_bytes
        assert bare.memory_limit[r] == int(free // per[r])
        assert held.memory_limit[r] == int((free - table.reserved(r)) // per[r])
    assert held.memory_limit[0] == bare.memory_limit[0] - 1 == 2
