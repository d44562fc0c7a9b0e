"""Evaluator speed on vTrain's rows: per-row median and max milliseconds.

    .venv/bin/python benchmarks/evaluator_speed.py [--single] [--repeat N]

Per row (vTrain's multi-node rows; ``--single`` adds the single-node ones), each the
best of ``--repeat`` runs:

- ``predict, first call``: the whole :func:`merak_sim.experiments.vtrain.predict_row`
  (cost table, schedule, compile, evaluation, result) the first time the row is
  predicted, rows in file order: a row whose (schedule, pp, micro-batches) an earlier
  row had reuses that schedule (:func:`merak_sim.sim.api.schedule_of`), as a fit or a
  planner sweeping many configurations does.
- ``predict, again``: the same call once its schedule is known.
- the cold parts of a new shape: ``generate+lower`` (``cfg.build_schedule()``),
  ``structure`` (the first :func:`~merak_sim.sim.program.compile_program` of that
  schedule object, which walks it once, less a re-pricing) and ``plan`` (its
  dependency order, :func:`~merak_sim.sim.evaluator.plan`).
- ``fast path``: what a fit or a planner repeats per cost table:
  :func:`~merak_sim.sim.program.compile_program` of a known schedule (``price``, the
  cost rules gathered per action) and :func:`~merak_sim.sim.evaluator.evaluate`
  (``evaluate``, the dependency-graph pass); both are exact (tests compare them with
  the SimPy engine and with pricing action by action).

Printed, not asserted: timings depend on the machine's load (shown at the top).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from merak_sim.experiments.vtrain import PreparedRow, load_vtrain, predict_row, vtrain_cost_model
from merak_sim.sim.evaluator import evaluate, plan
from merak_sim.sim.program import compile_program

ROOT = Path(__file__).resolve().parents[1]

LABELS = ("predict, first call", "predict, again", "generate+lower", "structure", "plan",
          "fast path", "  price", "  evaluate")


def _clock(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def row_times(r, repeat: int) -> dict[str, float]:
    """Seconds of every figure of the module docstring for one row."""
    out = {"predict, first call": _clock(lambda: predict_row(r)),
           "predict, again": _clock(lambda: predict_row(r), repeat)}
    p = PreparedRow.of(r)
    table = vtrain_cost_model().cost_table(p.model, p.cluster, p.config)
    out["generate+lower"] = _clock(p.config.build_schedule, repeat)
    structure = price = plan_s = float("inf")
    for _ in range(repeat):
        sched = p.config.build_schedule()  # a new object: nothing of it is known yet
        first = _clock(lambda s=sched: compile_program(s, table, p.recompute))
        again = _clock(lambda s=sched: compile_program(s, table, p.recompute))
        prog = compile_program(sched, table, p.recompute)
        plan_s = min(plan_s, _clock(lambda prog=prog: plan(prog)))
        structure, price = min(structure, first - again), min(price, again)
    out["structure"], out["plan"], out["  price"] = max(structure, 0.0), plan_s, price
    out["  evaluate"] = _clock(lambda: evaluate(prog), repeat)
    out["fast path"] = _clock(lambda: evaluate(compile_program(sched, table, p.recompute)),
                              repeat)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data" / "vtrain")
    ap.add_argument("--single", action="store_true", help="also the 1,440 single-node rows")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; best of "
          f"{args.repeat} runs per figure")
    sets = [("multi", load_vtrain(args.data_dir / "ground_truth_multi.csv"))]
    if args.single:
        sets.append(("single", load_vtrain(args.data_dir / "ground_truth_single.csv")))
    for name, rows in sets:
        times = {k: [] for k in LABELS}
        slowest = None
        for r in rows:
            t = row_times(r, args.repeat)
            for k in LABELS:
                times[k].append(t[k])
            if slowest is None or t["fast path"] > slowest[0]:
                slowest = (t["fast path"], r)
        print(f"vTrain {name} ({len(rows)} rows): median / max ms per row")
        for k in LABELS:
            xs = times[k]
            print(f"  {k:20s} {1e3 * statistics.median(xs):9.2f} {1e3 * max(xs):9.1f}")
        r = slowest[1]
        print(f"  slowest fast path: pp={r.pp} micro-batches="
              f"{r.global_batch // (r.dp * r.micro_batch)} tp={r.tp} dp={r.dp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
