"""Evaluator speed on vTrain's rows: per-row median and max milliseconds.

    .venv/bin/python benchmarks/evaluator_speed.py [--single] [--repeat N] [--clock cpu]

Per row (vTrain's multi-node rows; ``--single`` adds the single-node ones), each the
median of ``--repeat`` runs:

- ``cold``: the whole :func:`predict_row` (cost table,
  schedule, compile, evaluation, result) with every schedule and its compiled
  structure forgotten first (:func:`merak_sim.sim.api.forget_schedules`): the first
  sight of a schedule shape.
  A generator that declares a steady-state period (1F1B) is evaluated on one small
  base and extended exactly (:mod:`merak_sim.sim.periodic`); simulate pauses
  Python's cyclic garbage collector while it evaluates (its structures are acyclic).
- ``cold, full evaluation``: the same figures by evaluating the row's own schedule
  in full, also from nothing: cost table, ``generate+lower``
  (:func:`~merak_sim.sim.api.shape_schedule`), ``structure`` (the first
  :func:`~merak_sim.sim.program.compile_program` of that schedule object, less a
  re-pricing), ``plan`` (its dependency order, :func:`~merak_sim.sim.evaluator.plan`),
  ``price`` (compile_program of the known schedule), ``evaluate``
  (:func:`~merak_sim.sim.api.evaluator_trace`) and ``result``
  (:func:`~merak_sim.sim.result.build_result`).
- ``first call, file order``: predict_row the first time the row is predicted, rows
  in file order, caches kept: a row reuses the schedules (bases included) an earlier
  row built, as a fit or a planner sweeping many configurations does.
- ``again``: predict_row once everything of the row is known.

Both cold paths give the same figures (tests/test_evaluator_cold.py checks them to
1e-9). Printed, not asserted: timings depend on the machine's load (shown);
``--clock cpu`` times this process's CPU instead of the wall clock, which other
processes on a shared machine disturb less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from merak_sim.calibrate.stacks import stack_cost_model
from merak_sim.calibrate.vtrain import VTRAIN_STACK, VTrainRow, load_vtrain, row_setup
from merak_sim.costs.protocol import CostModel
from merak_sim.layout import RankLayout
from merak_sim.sim.api import evaluator_trace, forget_schedules, shape_schedule, simulate
from merak_sim.sim.evaluator import plan
from merak_sim.sim.from_config import recompute_fractions, split_grad_sync
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result

ROOT = Path(__file__).resolve().parents[1]

FULL_PARTS = ("cost table", "generate+lower", "structure", "plan", "price", "evaluate",
              "result")
LABELS = ("cold", "cold, full evaluation", *(f"  {k}" for k in FULL_PARTS),
          "first call, file order", "again")


def vtrain_cost_model(cluster) -> CostModel:
    """The model pricing the vTrain rows (their stack, the published efficiency)."""
    return stack_cost_model(VTRAIN_STACK, cluster, None)


def predict_row(r: VTrainRow) -> float:
    """Predicted iteration seconds of a vTrain row: the whole simulate() call."""
    model, cluster, cfg = row_setup(r)
    return simulate(model, cluster, cfg, cost_model=vtrain_cost_model(cluster),
                    engine="evaluator", sub_cluster=True, keep_trace=False).iteration_time_s


#: The clock every figure reads (``--clock``).
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def _median(fn, repeat: int, before=None) -> float:
    out = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = clock()
        fn()
        out.append(clock() - t)
    return statistics.median(out)


def full_parts(r) -> dict[str, float]:
    """Seconds of each part of one cold full evaluation of row ``r``."""
    model, cluster, cfg = row_setup(r)
    t = [clock()]
    table = vtrain_cost_model(cluster).cost_table(model, cluster, cfg)
    t.append(clock())
    sched = shape_schedule(cfg.schedule, cfg.pp, cfg.num_microbatches, cfg.virtual_stages)
    t.append(clock())
    rc = recompute_fractions(cfg, sched)
    compile_program(sched, table, rc)
    t.append(clock())
    prog = compile_program(sched, table, rc)
    again = clock() - t[-1]
    pl = plan(prog)
    t.append(clock())
    prog = compile_program(sched, table, rc)
    t.append(clock())
    capacity = float(table.memory_capacity_bytes)
    tr = evaluator_trace(prog, RankLayout.of(cfg), capacity, zero=split_grad_sync(cfg), pl=pl,
                         record_memory=False)
    t.append(clock())
    build_result(tr, capacity=capacity, peak_flops=float(table.peak_flops),
                 engine="evaluator", global_batch=cfg.global_batch_size,
                 seq_len=model.seq_len, config=cfg, keep_trace=False)
    t.append(clock())
    d = [b - a for a, b in zip(t, t[1:], strict=False)]
    d[2] = max(d[2] - again, 0.0)  # structure: the first compile less a re-pricing
    return dict(zip(FULL_PARTS, d, strict=True))


def row_times(r, repeat: int) -> dict[str, float]:
    """Seconds of the cold figures of the module docstring for one row."""
    out = {"cold": _median(lambda: predict_row(r), repeat, forget_schedules)}
    runs = []
    for _ in range(repeat):
        forget_schedules()
        runs.append(full_parts(r))
    for k in FULL_PARTS:
        out[f"  {k}"] = statistics.median(x[k] for x in runs)
    out["cold, full evaluation"] = statistics.median(sum(x.values()) for x in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data" / "vtrain")
    ap.add_argument("--single", action="store_true", help="also the 1,440 single-node rows")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (median kept)")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                    help="wall clock (default) or this process's CPU time")
    args = ap.parse_args(argv)
    global clock
    clock = CLOCK[args.clock]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; median of "
          f"{args.repeat} runs per figure, {args.clock} clock")
    sets = [("multi", load_vtrain(args.data_dir / "ground_truth_multi.csv"))]
    if args.single:
        sets.append(("single", load_vtrain(args.data_dir / "ground_truth_single.csv")))
    predict_row(sets[0][1][0])  # imports and first-use caches outside the figures
    for name, rows in sets:
        times = {k: [] for k in LABELS}
        for r in rows:
            for k, v in row_times(r, args.repeat).items():
                times[k].append(v)
        forget_schedules()
        for r in rows:
            times["first call, file order"].append(_median(lambda r=r: predict_row(r), 1))
            times["again"].append(_median(lambda r=r: predict_row(r), args.repeat))
        print(f"vTrain {name} ({len(rows)} rows): median / max ms per row")
        for k in LABELS:
            xs = times[k]
            print(f"  {k:24s} {1e3 * statistics.median(xs):9.2f} {1e3 * max(xs):9.1f}")
        cold, full = times["cold"], times["cold, full evaluation"]
        ratio = statistics.median(full) / statistics.median(cold)
        print(f"  {'full / cold':24s} {ratio:8.1f}x {max(full) / max(cold):8.1f}x")
        worst = max(range(len(rows)), key=cold.__getitem__)
        _m, _c, cfg = row_setup(rows[worst])
        print(f"  slowest cold row: pp={cfg.pp} micro-batches={cfg.num_microbatches} "
              f"tp={cfg.tp} dp={cfg.dp}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
