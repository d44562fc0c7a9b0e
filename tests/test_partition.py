"""Partitioners: uniform, parameter- and time-balanced, optimality against brute force."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.config import ParallelConfig
from merak_sim.costs import AnalyticCostModel
from merak_sim.costs.analytic import parameter_balanced
from merak_sim.costs.partition import make_partition
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.partition import (
    Partition,
    PartitionError,
    as_ranges,
    balanced,
    time_balanced,
    uniform,
)


def brute_force(w, k, first=0.0, last=0.0):
    """Smallest max stage cost over every split of w into k non-empty runs."""
    n, best = len(w), float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        costs = [sum(w[b[i]:b[i + 1]]) for i in range(k)]
        costs[0] += first
        costs[-1] += last
        best = min(best, max(costs))
    return best


@settings(max_examples=150, deadline=None)
@given(w=st.lists(st.integers(1, 50), min_size=1, max_size=9),
       k=st.integers(1, 5), first=st.integers(0, 60), last=st.integers(0, 60))
def test_balanced_is_optimal(w, k, first, last):
    if k > len(w):
        with pytest.raises(PartitionError):
            balanced(w, k, first, last)
        return
    p = balanced([float(x) for x in w], k, float(first), float(last))
    assert p.max_cost == pytest.approx(brute_force(w, k, first, last))
    assert sum(p.counts) == len(w) and all(c >= 1 for c in p.counts)
    assert as_ranges(p, len(w), k) == p.ranges


def test_uniform_spreads_remainder_to_middle():
    p = uniform(10, 4)
    assert p.counts == (2, 3, 3, 2)
    assert uniform(8, 4).counts == (2, 2, 2, 2)
    assert uniform(5, 1).ranges == ((0, 5),)
    with pytest.raises(PartitionError, match="5 stages exceed 4 layers"):
        uniform(4, 5)


def test_parameter_balanced_lightens_embedding_stages():
    m = get_model("gpt-1.5b")
    p = parameter_balanced(m, 4)
    # The first stage holds the 80M-parameter embedding (~2.6 layers): fewer layers.
    assert p.counts[0] < p.counts[1]
    assert p.max_cost <= uniform_max_params(m, 4)


def uniform_max_params(m, k):
    from merak_sim.memory import stage_params
    u = uniform(m.layers, k)
    return max(stage_params(m, c, i == 0, i == k - 1) for i, c in enumerate(u.counts))


def test_time_balanced_with_head_cost():
    p = time_balanced([1.0] * 12, 4, first_extra_s=0.0, last_extra_s=2.0)
    assert p.max_cost == pytest.approx(4.0)  # brute force: ceil((12 + 2) / 4)
    assert p.max_cost == pytest.approx(brute_force([1.0] * 12, 4, 0.0, 2.0))
    assert p.counts[-1] <= 2
    assert p.stage_costs[-1] == pytest.approx(p.counts[-1] + 2.0)


def test_time_method_through_cost_model():
    m = get_model("gpt-1.5b")
    c = get_cluster("paper-3090")
    cfg = ParallelConfig(pp=8, micro_batch_size=2, global_batch_size=16)
    cm = AnalyticCostModel(partition_method="time")
    t = cm.cost_table(m, c, cfg)
    times = [s.forward_s + s.backward_s for s in t.stages]
    u = AnalyticCostModel().cost_table(m, c, cfg)
    assert max(times) <= max(s.forward_s + s.backward_s for s in u.stages) + 1e-12
    # The LM head (50257-wide GEMM) makes the last stage take fewer layers.
    assert t.stages[-1].layers < t.stages[1].layers


def test_as_ranges_errors():
    with pytest.raises(PartitionError, match="partition has 2 stages, expected 3"):
        as_ranges([3, 3], 6, 3)
    with pytest.raises(PartitionError, match="not contiguous"):
        as_ranges([(0, 2), (3, 6)], 6, 2)
    with pytest.raises(PartitionError, match="at least one layer"):
        as_ranges([0, 6], 6, 2)
    assert as_ranges(Partition(((0, 1), (1, 4))), 4, 2) == ((0, 1), (1, 4))


def test_make_partition_reports_seconds_and_time_wins():
    m = get_model("gpt-1.5b")
    c = get_cluster("paper-3090")
    cfg = ParallelConfig(pp=6, micro_batch_size=2, global_batch_size=24)
    parts = {k: make_partition(k, m, c, cfg) for k in ("uniform", "parameters", "time")}
    for k, p in parts.items():
        assert p.method == k and len(p.stage_costs) == 6 and sum(p.counts) == 48
        assert all(x > 0 for x in p.stage_costs)
    # The time-balanced partition has the smallest bottleneck stage.
    assert parts["time"].max_cost <= min(p.max_cost for p in parts.values()) + 1e-12
    with pytest.raises(PartitionError, match="unknown partition method 'random'"):
        make_partition("random", m, c, cfg)
