"""The planner searches the expert-parallel degree of an MoE model (issue 35 item 4):
divisors of the experts folding onto a stage's tp x cp x dp ranks, etp 1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from merak_sim.executable import executable_space
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.moe import MoESpec
from merak_sim.planner.search import search
from merak_sim.planner.space import SearchSpace, enumerate_candidates, expert_degrees

#: Qwen3-30B-A3B's layer shape on 8 layers: ep=1 fits one DGX H100 node, so time decides.
MOE = replace(get_model("qwen3-30b-a3b"), name="qwen3-moe-8l", layers=8, extra={})
SPACE = SearchSpace(tp=(1,), pp=(1,), schedules=("1f1b",), recompute=("full",),
                    tp_overlap=("none",), zero=(1,), sequence_parallel=(False,),
                    micro_batch_sizes=(1,))


def _nvlink_times(factor: float) -> tuple[dict[int, float], int]:
    c = get_cluster("dgx-h100", nodes=1)
    fast = replace(c, intra=replace(c.intra, bandwidth_Bps=c.intra.bandwidth_Bps * factor,
                                    latency_s=c.intra.latency_s / factor))
    res = search(MOE, fast, 64, space=SPACE, exhaustive=True, confirm=False)
    assert res.best_config.etp == 1
    return {int(r.ep): float(r.time_s) for r in res.table.itertuples()}, res.best_config.ep


def test_expert_degrees_fold_onto_the_stage_ranks():
    assert expert_degrees(MOE, 8, None) == (1, 2, 4, 8)
    assert expert_degrees(MOE, 12, None) == (1, 2, 4)  # 128 experts: 3 does not divide
    assert expert_degrees(MOE, 8, (4, 16)) == (4,)
    assert expert_degrees(get_model("gpt-1.5b"), 8, None) == (1,)
    dense = {c.ep for c in enumerate_candidates(get_model("gpt-1.5b"), 8, 8, 64, SPACE)}
    assert dense == {1}
    eps = sorted({c.ep for c in enumerate_candidates(MOE, 8, 8, 64, SPACE)})
    assert eps == [1, 2, 4, 8]


def test_moe_plan_picks_ep_above_1_when_the_all_to_all_is_cheap():
    # Ten times NVLink4: the all-to-all is cheap, more tokens per expert make the grouped
    # GEMMs faster and the expert gradients need no data-parallel reduction at ep=8.
    times, best = _nvlink_times(10.0)
    assert sorted(times) == [1, 2, 4, 8]
    assert best == 8 and times[8] < times[2] < times[1]
    # On the real NVLink4 the all-to-all costs more than it saves on this small model.
    times, best = _nvlink_times(1.0)
    assert best == 1 and times[1] < times[8]


def test_branch_and_bound_agrees_with_the_exhaustive_search_on_ep():
    c = get_cluster("dgx-h100", nodes=1)
    fast = replace(c, intra=replace(c.intra, bandwidth_Bps=c.intra.bandwidth_Bps * 10))
    bb = search(MOE, fast, 64, space=SPACE.with_(zero=(0, 1)), confirm=False)
    ex = search(MOE, fast, 64, space=SPACE.with_(zero=(0, 1)), exhaustive=True,
                confirm=False)
    assert bb.best_config == ex.best_config and bb.best_config.ep > 1


def test_space_refuses_bad_ep_and_executable_space_drops_ep():
    with pytest.raises(ValueError, match="ep must be a positive integer, got 0"):
        SearchSpace(ep=(0,))
    with pytest.raises(ValueError, match="ep must not be empty"):
        SearchSpace(ep=())
    gpt = get_model("gpt-1.5b")
    assert executable_space(SearchSpace(ep=(1, 2, 8)), gpt).ep == (1,)
    with pytest.raises(ValueError, match="allows only ep=8"):
        executable_space(SearchSpace(ep=(8,)), gpt)
