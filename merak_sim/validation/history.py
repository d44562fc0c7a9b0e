"""Validation results over many runs: the spread of a set of errors and errors pooled
over the runs a validation suite recorded.

On a noisy machine one run's error mixes the model's bias with the machine's drift;
repeated runs separate them: a configuration's mean error over the runs, several
standard errors from zero, is a bias of the model or the profile; a single run's
miss within its standard deviation is the machine. The history is JSON lines, one
entry per suite run (``benchmarks/cpu_validation.py`` appends them), each with the
run's ``errors`` by run name and, optionally, its ``speedup_gap_points``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from merak_sim.io import atomic_write_text

__all__ = ["spread", "read_history", "append_history", "pooled"]


def spread(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation and standard error of the mean of ``values``
    (the last two NaN with fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    sd = statistics.stdev(values)
    return mean, sd, sd / len(values) ** 0.5


def read_history(path: str | Path) -> list[dict]:
    """The entries of a history file (none if ``path`` is missing)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_history(path: str | Path, entry: dict) -> None:
    """Append ``entry`` as one JSON line to ``path`` (the file rewritten atomically, so
    an interrupted run leaves the earlier lines whole)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    atomic_write_text(path, old + json.dumps(entry) + "\n")


def pooled(entries: list[dict]) -> dict:
    """Iteration errors pooled over suite runs: per configuration the mean error, its
    standard deviation and standard error over the runs (``n``; ``measurements``
    counts the repeats ``~i`` too); the pooled targets (median and worst absolute mean
    error over the configurations); and the speed-up gap's mean and standard error
    over the runs.

    Repeats of a configuration within one run are averaged into one figure first: they
    share that run's machine state (load, clock, cache neighbours), so counting them as
    independent would understate the standard error."""
    by: dict[str, list[float]] = {}
    count: dict[str, int] = {}
    for e in entries:
        per_run: dict[str, list[float]] = {}
        for name, err in e.get("errors", {}).items():
            per_run.setdefault(name.split("~")[0], []).append(err)
        for name, v in per_run.items():
            by.setdefault(name, []).append(statistics.fmean(v))
            count[name] = count.get(name, 0) + len(v)
    rows = {}
    for name, v in by.items():
        mean, sd, se = spread(v)
        rows[name] = {"n": len(v), "measurements": count[name], "mean": mean, "sd": sd,
                      "se": se}
    means = [abs(r["mean"]) for r in rows.values()]
    gaps = [e["speedup_gap_points"] for e in entries
            if e.get("speedup_gap_points") is not None]
    out = {"runs": len(entries), "configurations": rows,
           "median_abs_mean_error": statistics.median(means) if means else float("nan"),
           "worst_abs_mean_error": max(means, default=float("nan"))}
    if gaps:
        out["speedup_gap_mean_points"], _, out["speedup_gap_se_points"] = spread(gaps)
    return out
