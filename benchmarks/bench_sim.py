"""Simulator speed: printed figures (median of N runs), never asserted in tests.

    .venv/bin/python benchmarks/bench_sim.py [--repeat 5] [--skip-full]

Cases:
- GPT-20B on 64 GPUs (paper-3090, dp 2, tp 4, pp 8, 64 micro-batches, shifted
  critical path): representative mode, target < 0.25 s per simulated iteration.
- GPT-3 175B on 1024 GPUs (dgx-a100-80g x 128 nodes, tp 8, pp 16, dp 8, 128
  micro-batches, 1F1B): representative mode < 1 s, full mode < 60 s.
- Fast evaluator: actions per second (target >= 1e6), with the schedule's plan
  precomputed (as the planner uses it) and including the plan.
- SimPy engine: events per second, and the evaluator / SimPy time ratio.

"simulate()" times are end to end: cost table, schedule generation, compilation,
simulation and result summary (no events table or plots).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from merak_sim.config import ParallelConfig
from merak_sim.costs.calibrated import calibrated_cost_model
from merak_sim.hardware import get_cluster
from merak_sim.layout import RankLayout
from merak_sim.model import get_model
from merak_sim.sim import (
    EngineOptions,
    compile_program,
    evaluate,
    plan,
    run_engine,
    simulate,
)
from merak_sim.sim.entities import topology_from_cluster
from merak_sim.sim.from_config import recompute_fractions, schedule_for


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median wall time of ``repeat`` calls and the last return value."""
    ts = []
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


CASES = {
    "gpt20b-64": dict(model="gpt-20b", cluster="paper-3090", nodes=16,
                      cfg=dict(dp=2, tp=4, pp=8, micro_batch_size=1, global_batch_size=128,
                               schedule="shifted-critical-path", recompute="full",
                               dtype="fp16")),
    "gpt3-1024": dict(model="gpt3-175b", cluster="dgx-a100-80g", nodes=128,
                      cfg=dict(dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1024,
                               schedule="1f1b", recompute="full", dtype="bf16")),
}


def run_case(name: str, case: dict, n: int, skip_full: bool) -> None:
    """Time one case and print its figures."""
    cfg = ParallelConfig(**case["cfg"])
    kw = dict(nodes=case["nodes"])
    t_rep, res = timed(lambda: simulate(case["model"], case["cluster"], cfg,
                                        keep_trace=False, **kw), n)
    t_ev, _ = timed(lambda: simulate(case["model"], case["cluster"], cfg, keep_trace=False,
                                     engine="evaluator", **kw), n)
    print(f"{name}: simulate() representative simpy+contention {t_rep:.3f} s, "
          f"evaluator {t_ev:.3f} s (iteration {res.iteration_time_s:.3f} s, "
          f"MFU {res.mfu:.3f}, fits {res.fits_in_memory}, M={cfg.num_microbatches})")
    # Engine-level figures on the compiled program.
    model, cluster = get_model(case["model"]), get_cluster(case["cluster"], case["nodes"])
    table = calibrated_cost_model().cost_table(model, cluster, cfg)
    sched = schedule_for(cfg)
    prog = compile_program(sched, table, recompute_fractions(cfg, sched))
    pl_ = RankLayout.of(cfg)
    t_plan, pln = timed(lambda: plan(prog), n)
    t_eval, _ = timed(lambda: evaluate(prog, pln), n)
    topo = topology_from_cluster(cluster)
    t_simpy, tr = timed(lambda: run_engine(prog, pl_, 80e9, EngineOptions(
        contention=False, record_memory=False)), n)
    t_simpy_c, trc = timed(lambda: run_engine(prog, pl_, 80e9, EngineOptions(
        contention=True, topology=topo, record_memory=False)), n)
    acts = prog.num_actions
    print(f"  actions {acts}; evaluator {acts / t_eval / 1e6:.2f} M actions/s "
          f"({t_eval * 1e3:.2f} ms), with plan {acts / (t_eval + t_plan) / 1e6:.2f} M/s; "
          f"SimPy (no contention) {t_simpy * 1e3:.1f} ms, {tr.events_processed} events, "
          f"{tr.events_processed / t_simpy / 1e3:.0f} k events/s; SimPy+contention "
          f"{t_simpy_c * 1e3:.1f} ms ({trc.events_processed / t_simpy_c / 1e3:.0f} k "
          f"events/s); evaluator/SimPy time ratio {t_eval / t_simpy:.4f} "
          f"(SimPy {t_simpy / t_eval:.0f}x slower)")
    if name == "gpt3-1024" and not skip_full:
        reps = max(1, min(n, 3))
        t_full, fres = timed(lambda: simulate(case["model"], case["cluster"], cfg,
                                              mode="full", keep_trace=False, **kw), reps)
        print(f"  full mode ({cfg.world_size} GPU entities, contention on): "
              f"{t_full:.1f} s (median of {reps}), iteration {fres.iteration_time_s:.3f} s "
              f"(representative {res.iteration_time_s:.3f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="simulator speed benchmarks")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-full", action="store_true", help="skip the 1024-GPU full mode")
    args = ap.parse_args(argv)
    n = args.repeat
    print(f"median of {n} runs; python {sys.version.split()[0]}")
    for name, case in CASES.items():
        run_case(name, case, n, args.skip_full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
