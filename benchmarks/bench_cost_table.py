"""Speed of AnalyticCostModel.cost_table (the planner calls it for thousands of configs).

Prints the median of several runs, in milliseconds per call, for a cold cache (first
call for a configuration: layer costs computed) and a warm one (cached layer costs,
only the O(stages) assembly), on a 96-layer GPT-3 175B shape:

    .venv/bin/python benchmarks/bench_cost_table.py
"""

from __future__ import annotations

import statistics
import sys
import time

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.comm import clear_caches
from merak_sim.costs.layers import layer_cost
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model


def main() -> int:
    model = get_model("gpt3-175b")
    cluster = get_cluster("dgx-a100-80g", nodes=64)
    configs = [ParallelConfig(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs,
                              global_batch_size=dp * mbs * 16, recompute="full")
               for tp in (2, 4, 8) for pp in (4, 8, 16, 32) for dp in (1, 2, 4)
               for mbs in (1, 2, 4) if dp * tp * pp <= cluster.world_size]
    cm = AnalyticCostModel()
    cold, warm = [], []
    for _ in range(5):
        layer_cost.cache_clear()
        clear_caches()
        t = time.perf_counter()
        for c in configs:
            cm.cost_table(model, cluster, c)
        cold.append((time.perf_counter() - t) / len(configs))
        t = time.perf_counter()
        for c in configs:
            cm.cost_table(model, cluster, c)
        warm.append((time.perf_counter() - t) / len(configs))
    print(f"{len(configs)} configurations of {model.name} ({model.layers} layers) on "
          f"{cluster.name} x{cluster.nodes}")
    print(f"cost_table, cold cache: median {statistics.median(cold) * 1e3:.3f} ms per call "
          f"(runs: {', '.join(f'{x * 1e3:.3f}' for x in cold)})")
    print(f"cost_table, warm cache: median {statistics.median(warm) * 1e3:.3f} ms per call "
          f"(runs: {', '.join(f'{x * 1e3:.3f}' for x in warm)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
