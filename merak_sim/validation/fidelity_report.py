"""Fidelity over every open dataset in data/: one table per dataset and group.

    .venv/bin/python benchmarks/fidelity.py            # the table (about a minute)
    .venv/bin/python benchmarks/fidelity.py --fit      # refit the profiles, print values
    .venv/bin/python benchmarks/fidelity.py --fit --profile a100-pytorch  # one profile
    .venv/bin/python benchmarks/fidelity.py --limit 5  # 5 rows per file (a quick check)
    .venv/bin/python benchmarks/fidelity.py --cv       # choose megatron-te's free parameters

Prints and writes benchmarks/results/fidelity.md: first the target (per public-runs
source, its held-out H100 / A100 bf16 rows: MAPE against 10 %), then per dataset and role (vTrain
single-node = the A100 fit; llm-foundry H100 MPT-1b/7b/30b and NeMo H100 GPT-3 /
LLaMA-2 / Nemotron = the two Hopper fits; llm-foundry A100 MPT-1b/7b = the A100
PyTorch fit; every other row held out) and per group (GPU
type, software stack, GPUs, tp, pp, cp, ZeRO stage, precision): rows, MAPE, mean signed
error, worst row, and the peak-memory error where the data publishes peak memory; then
every public-runs row the model cannot express with its reason
(merak_sim/experiments/fidelity.py, public_runs.py). Uses the committed calibration
(merak_sim/costs/calibrated.py, calibrated_hopper.py); ``--fit`` refits the Hopper
and A100 PyTorch profiles (merak_sim/experiments/hopper_fit.py) and prints them to copy
into calibrated_hopper.py, without writing the table; ``--cv`` cross-validates
megatron-te's candidate parameter sets by model family inside its fit rows
(merak_sim/experiments/fit_cv.py), refits the winner and prints it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from merak_sim.costs.calibrated_hopper import A100_PROFILES, HOPPER_PROFILES
from merak_sim.experiments.fidelity import (
    PUBLIC_GROUPS,
    TARGET,
    TARGET_MAPE_PCT,
    VTRAIN_GROUPS,
    Outcome,
    public_run_outcomes,
    summarise,
    vtrain_outcomes,
)
from merak_sim.experiments.fit_cv import choose
from merak_sim.experiments.hopper_fit import (
    CHOSEN,
    FIT_SPLIT,
    HopperParams,
    cross_validate_profile,
    fit,
    fit_rows,
    published_values,
)
from merak_sim.experiments.public_runs import load_rows
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


def _target(stats) -> list[str]:
    """The target's rows: per source, its held-out H100 / A100 bf16 group."""
    out = [f"## Target: held-out {TARGET} rows, MAPE <= {TARGET_MAPE_PCT:g} % per source",
           "", "| dataset | rows | MAPE % | mean signed % | worst % | target |",
           "|---|---|---|---|---|---|"]
    cells = {s.dataset: s for s in stats if s.group == f"target={TARGET}"}
    for ds in dict.fromkeys(s.dataset for s in stats if s.dataset.startswith("public-runs")
                            and s.role == "held out"):
        s = cells.get(ds)
        if s is None:
            out.append(f"| {ds} | 0 | - | - | - | no held-out {TARGET} rows |")
            continue
        met = "met" if s.mape_pct <= TARGET_MAPE_PCT else "missed"
        out.append(f"| {ds} | {s.rows} | {s.mape_pct:.2f} | {s.signed_pct:+.2f} "
                   f"| {s.worst_pct:+.1f} | {met} |")
    return out + [""]


#: Peak memory target: within this share of the published figure, per source.
TARGET_MEM_PCT = 10.0


def _memory_target(stats) -> list[str]:
    """Per source with published peak memory: its rows' memory MAPE against the target."""
    out = [f"## Target: peak memory within {TARGET_MEM_PCT:g} % where published (MAPE per "
           "source)", "", "| dataset | memory rows | memory MAPE % | target |", "|---|---|---|---|"]
    for s in stats:
        if s.group == "all" and s.mem_rows:
            met = "met" if s.mem_mape_pct <= TARGET_MEM_PCT else "missed"
            out.append(f"| {s.dataset} | {s.mem_rows} | {s.mem_mape_pct:.2f} | {met} |")
    return out + [""]


def _by_role(outs: list[Outcome]) -> list[Outcome]:
    """Outcomes with the dataset split by role, so fitted and held-out rows of one file
    are reported apart."""
    return [Outcome(f"{o.dataset} ({o.role})", o.role, o.label, o.groups, o.measured_s,
                    o.predicted_s, o.mem_err) for o in outs]


def _cv(paths: list[Path]) -> int:
    """Leave-one-family-out choice of megatron-te's free parameters (hopper_fit)."""
    data = {f"public-runs/{p.stem}": load_rows(p) for p in paths}
    profile = "megatron-te"
    rows = fit_rows(data, profile)
    results = cross_validate_profile(rows, profile, log=print)
    print("| variant | free | " + " | ".join(results[0].fold_losses) + " | score |")
    for r in results:
        print(f"| {r.variant.name} | {len(r.variant.free)} | "
              + " | ".join(f"{v:.4f}" for v in r.fold_losses.values()) + f" | {r.score:.4f} |")
    win = choose(results).variant
    print(f"chosen: {win.name} ({', '.join(win.free) or 'nothing fitted'}); committed: "
          f"{CHOSEN[profile]} ({'same' if CHOSEN[profile] == win.name else 'DIFFERS'})")
    start = HopperParams(published_values(profile, win.free), profile)
    params, loss = fit(rows, start, rounds=12)
    print(f"{profile} refitted on {len(rows)} rows (mean |log error| {loss:.4f}): "
          f"{params.values}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fidelity.md")
    ap.add_argument("--fit", action="store_true",
                    help="refit the Hopper and A100 PyTorch values and print them")
    ap.add_argument("--profile", action="append", choices=[*HOPPER_PROFILES, *A100_PROFILES],
                    help="with --fit: refit only this profile (repeatable)")
    ap.add_argument("--limit", type=int, default=0,
                    help="at most this many rows per file (0: all; the table is not written)")
    ap.add_argument("--cv", action="store_true",
                    help="cross-validate megatron-te's candidate parameter sets by model "
                         "family, refit the winner on all its fit rows and print it")
    args = ap.parse_args(argv)
    if not (args.data / "vtrain").is_dir():
        print(f"fidelity: error: {args.data / 'vtrain'} not found; pass --data", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    paths = sorted((args.data / "public-runs").glob("*.csv"))
    if args.cv:
        return _cv(paths)
    if args.fit:
        data = {f"public-runs/{p.stem}": load_rows(p) for p in paths}
        print(FIT_SPLIT)
        for profile in args.profile or [*HOPPER_PROFILES, *A100_PROFILES]:
            rows = fit_rows(data, profile)
            print(f"{profile}: {len(rows)} expressible fit rows", flush=True)
            params, loss = fit(rows, HopperParams.committed(profile), log=print)
            print(f"{profile} fitted (mean |log error| {loss:.4f}): {params.values}")
        return 0
    vt = vtrain_outcomes(args.data / "vtrain", progress=print, limit=args.limit or None)
    stats = summarise(vt, VTRAIN_GROUPS)
    skipped, public = [], []
    for path in paths:
        done, sk = public_run_outcomes(path, limit=args.limit or None)
        public += done
        skipped += sk
        print(f"{path.stem}: {len(done)} predicted, {len(sk)} skipped "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    stats += summarise(_by_role(public), PUBLIC_GROUPS)
    reasons = Counter((s.dataset, s.reason) for s in skipped)
    doc = [
        "# Fidelity over the open data",
        "",
        f"Command: `.venv/bin/python benchmarks/fidelity.py` ({time.strftime('%Y-%m-%d')}, "
        f"{time.perf_counter() - t0:.0f} s). Calibration: merak_sim/costs/calibrated.py "
        "(A100 under Megatron, fitted to vTrain's single-node rows only) and "
        f"merak_sim/costs/calibrated_hopper.py ({FIT_SPLIT}); role \"fit\" marks the rows "
        "a fit saw, every other row is held out (never fitted to). Error = predicted / "
        "measured iteration time - 1; memory error = predicted / published peak memory "
        "- 1 (the memory model, not fitted; compared with what each source's column "
        "measures: torchtitan the caching allocator's peak reserved memory, live tensors "
        "plus the allocator's documented reservations (merak_sim/allocator_memory.py), "
        "Sailor the device's used memory, both including backward's transient tensors).",
        "",
        *_target(stats),
        *_memory_target(stats),
        *_table(stats),
        "",
        f"## Public-runs rows not expressible ({len(skipped)} of {len(skipped) + len(public)}"
        " rows, none dropped)",
        "",
        "| dataset | reason | rows |",
        "|---|---|---|",
        *[f"| {d} | {r} | {n} |" for (d, r), n in sorted(reasons.items())],
        "",
    ]
    rows = ["## Every predicted public-runs row", "",
            "| dataset | role | row | measured s | predicted s | error % | memory error % |",
            "|---|---|---|---|---|---|---|",
            *[f"| {o.dataset} | {o.role} | {o.label} | {o.measured_s:.4g} | "
              f"{o.predicted_s:.4g} | {100 * o.err:+.1f} | "
              f"{'-' if o.mem_err is None else f'{100 * o.mem_err:+.1f}'} |" for o in public],
            "", "## Every skipped row", "", "| dataset | row | reason |", "|---|---|---|",
            *[f"| {s.dataset} | {s.label.replace('|', '/')} | {s.reason} |" for s in skipped],
            ""]
    print("\n".join(doc))
    if not args.limit:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, "\n".join(doc + rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
