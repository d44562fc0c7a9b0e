"""Refit the Hopper and A100 PyTorch profiles, or choose megatron-te's free parameters.

    .venv/bin/python -m research.studies.hopper_fit --fit                # every profile
    .venv/bin/python -m research.studies.hopper_fit --fit --profile a100-pytorch
    .venv/bin/python -m research.studies.hopper_fit --cv                 # megatron-te

``--fit`` refits each profile of merak_sim/costs/calibrated_hopper.py on its declared
fit rows of data/public-runs (merak_sim.validation.fidelity.FIT_MODELS; research/
hopper_fit.py) from the committed values and prints them to copy into that file;
``--cv`` cross-validates megatron-te's candidate parameter sets by model family inside
its fit rows (research/fit_cv.py), refits the winner on all its fit rows and prints
it. The fidelity table itself is the product's: ``merak-sim fidelity``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from merak_sim.costs.calibrated_hopper import A100_PROFILES, HOPPER_PROFILES
from merak_sim.validation.fidelity import FIT_SPLIT
from merak_sim.validation.public_runs import load_rows
from research.fit_cv import choose
from research.hopper_fit import (
    CHOSEN,
    HopperParams,
    cross_validate_profile,
    fit,
    fit_rows,
    published_values,
)

ROOT = Path(__file__).resolve().parents[2]


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


def _fit(paths: list[Path], profiles: list[str]) -> int:
    """Refit ``profiles`` from their committed values and print them."""
    data = {f"public-runs/{p.stem}": load_rows(p) for p in paths}
    print(FIT_SPLIT)
    for profile in profiles:
        rows = fit_rows(data, profile)
        print(f"{profile}: {len(rows)} expressible fit rows", flush=True)
        params, loss = fit(rows, HopperParams.committed(profile), log=print)
        print(f"{profile} fitted (mean |log error| {loss:.4f}): {params.values}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data")
    ap.add_argument("--fit", action="store_true",
                    help="refit the Hopper and A100 PyTorch values and print them")
    ap.add_argument("--profile", action="append", choices=[*HOPPER_PROFILES, *A100_PROFILES],
                    help="with --fit: refit only this profile (repeatable)")
    ap.add_argument("--cv", action="store_true",
                    help="cross-validate megatron-te's candidate parameter sets by model "
                         "family, refit the winner on all its fit rows and print it")
    args = ap.parse_args(argv)
    if args.fit == args.cv:
        print("hopper_fit: error: give --fit or --cv", file=sys.stderr)
        return 2
    paths = sorted((args.data / "public-runs").glob("*.csv"))
    if not paths:
        print(f"hopper_fit: error: no CSV under {args.data / 'public-runs'}; pass --data",
              file=sys.stderr)
        return 2
    if args.cv:
        return _cv(paths)
    return _fit(paths, args.profile or [*HOPPER_PROFILES, *A100_PROFILES])


if __name__ == "__main__":
    sys.exit(main())
