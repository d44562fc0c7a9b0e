"""Fidelity over every open dataset in data/: one table per dataset and group.

    .venv/bin/python benchmarks/fidelity.py

Prints and writes benchmarks/results/fidelity.md: per dataset (vTrain single-node = the
calibration set; vTrain multi-node and every public-runs file = held out) and per group
(GPU type, GPUs, tp, pp, precision): rows, MAPE, mean signed error, worst row, and the
peak-memory error where the data publishes peak memory; then every public-runs row the
model cannot express yet with its reason (merak_sim/experiments/fidelity.py). Uses the
committed calibration (merak_sim/costs/calibrated.py); it does not fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from merak_sim.experiments.fidelity import (
    PUBLIC_GROUPS,
    VTRAIN_GROUPS,
    public_run_outcomes,
    summarise,
    vtrain_outcomes,
)
from merak_sim.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def _table(stats) -> list[str]:
    out = ["| dataset | role | group | rows | MAPE % | mean signed % | worst % | worst row | "
           "memory rows | memory MAPE % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in stats:
        mem = "-" if s.mem_mape_pct is None else f"{s.mem_mape_pct:.1f}"
        out.append(f"| {s.dataset} | {s.role} | {s.group} | {s.rows} | {s.mape_pct:.2f} | "
                   f"{s.signed_pct:+.2f} | {s.worst_pct:+.1f} | {s.worst_label} | "
                   f"{s.mem_rows} | {mem} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fidelity.md")
    args = ap.parse_args(argv)
    if not (args.data / "vtrain").is_dir():
        print(f"fidelity: error: {args.data / 'vtrain'} not found; pass --data", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    vt = vtrain_outcomes(args.data / "vtrain", progress=print)
    stats = summarise(vt, VTRAIN_GROUPS)
    skipped, public = [], []
    for path in sorted((args.data / "public-runs").glob("*.csv")):
        done, sk = public_run_outcomes(path)
        public += done
        skipped += sk
        print(f"{path.stem}: {len(done)} predicted, {len(sk)} skipped")
    stats += summarise(public, PUBLIC_GROUPS)
    reasons = Counter((s.dataset, s.reason) for s in skipped)
    doc = [
        "# Fidelity over the open data",
        "",
        f"Command: `.venv/bin/python benchmarks/fidelity.py` ({time.strftime('%Y-%m-%d')}, "
        f"{time.perf_counter() - t0:.0f} s). Calibration: merak_sim/costs/calibrated.py "
        "(A100, fitted to vTrain's single-node rows only: role \"fit\"); every other row "
        "is held out (never fitted to). Error = predicted / measured iteration time - 1.",
        "",
        *_table(stats),
        "",
        f"## Public-runs rows not expressible yet ({len(skipped)} rows, none dropped)",
        "",
        "| dataset | reason | rows |",
        "|---|---|---|",
        *[f"| {d} | {r} | {n} |" for (d, r), n in sorted(reasons.items())],
        "",
    ]
    rows = ["## Every skipped row", "", "| dataset | row | reason |", "|---|---|---|",
            *[f"| {s.dataset} | {s.label.replace('|', '/')} | {s.reason} |" for s in skipped],
            ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "\n".join(doc + rows))
    print("\n".join(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
