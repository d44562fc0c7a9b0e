"""Evaluator speed on vTrain's rows: per-row median and max seconds.

    .venv/bin/python benchmarks/evaluator_speed.py [--single]

Three figures per row (vTrain's multi-node rows; ``--single`` adds the single-node ones):
``predict`` = the whole :func:`merak_sim.experiments.vtrain.predict_row` (schedule
generation, lowering, compile, cost table, evaluation, result); ``compile+evaluate`` =
:func:`~merak_sim.sim.program.compile_program` and :func:`~merak_sim.sim.evaluator.evaluate`
of a prepared schedule (what a fit or a planner repeats per cost table);
``evaluate`` = the dependency-graph pass alone (:func:`~merak_sim.sim.evaluator.plan`
precomputed). Printed, not asserted: timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from merak_sim.experiments.vtrain import PreparedRow, load_vtrain, predict_row, vtrain_cost_model
from merak_sim.sim.evaluator import evaluate, plan
from merak_sim.sim.program import compile_program

ROOT = Path(__file__).resolve().parents[1]


def _clock(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data" / "vtrain")
    ap.add_argument("--single", action="store_true", help="also the 1,440 single-node rows")
    args = ap.parse_args(argv)
    sets = [("multi", load_vtrain(args.data_dir / "ground_truth_multi.csv"))]
    if args.single:
        sets.append(("single", load_vtrain(args.data_dir / "ground_truth_single.csv")))
    for name, rows in sets:
        whole, comp, ev = [], [], []
        worst = None
        for r in rows:
            whole.append(_clock(lambda r=r: predict_row(r)))
            p = PreparedRow.of(r)
            table = vtrain_cost_model().cost_table(p.model, p.cluster, p.config)
            comp.append(_clock(lambda p=p, t=table: evaluate(
                compile_program(p.schedule, t, p.recompute))))
            prog = compile_program(p.schedule, table, p.recompute)
            pl = plan(prog)
            ev.append(_clock(lambda prog=prog, pl=pl: evaluate(prog, pl)))
            if worst is None or whole[-1] > worst[0]:
                worst = (whole[-1], r)
        print(f"vTrain {name} ({len(rows)} rows): median / max ms per row")
        for label, xs in (("predict", whole), ("compile+evaluate", comp), ("evaluate", ev)):
            print(f"  {label:18s} {1e3 * statistics.median(xs):9.2f} {1e3 * max(xs):9.1f}")
        r = worst[1]
        print(f"  slowest row: pp={r.pp} micro-batches={r.global_batch // (r.dp * r.micro_batch)}"
              f" tp={r.tp} dp={r.dp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
