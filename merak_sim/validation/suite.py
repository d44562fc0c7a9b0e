"""Figures over the runs of a validation suite: accuracy against the targets and the
speed-up of one configuration over another (:func:`summarize`)."""

from __future__ import annotations

import statistics

from merak_sim.validation.report import AccuracyReport

__all__ = ["summarize", "repeat_pairs"]


def repeat_pairs(names, base: str, new: str) -> list[tuple[str, str]]:
    """The ``(base, new)`` pair and its repeats among run ``names``: ``base~i`` with
    ``new~i`` (a suite measures repeats of a configuration under ``name~i``)."""
    return [(base, new)] + [(n, new + n[len(base):]) for n in names
                            if n.startswith(base + "~")]


def summarize(reports: list[AccuracyReport],
              speedup: tuple[str, str] | list[tuple[str, str]] | None = None) -> dict:
    """Suite figures against the validation targets: iteration median / worst absolute
    error (and the worst run's name), per-action median absolute error (all runs
    pooled), worst activation error, the lowest and median CPU share of every run's
    iterations (:func:`merak_sim.validation.measured.cpu_shares`, where the runs have
    one) and optionally the speed-up of run ``new`` over run ``base`` for each
    ``(base, new)`` name pair (median over the pairs, measured and simulated)."""
    it = [abs(r.iteration_error) for r in reports]
    acts = [e for r in reports for e in r.action_abs_errors]
    worst = max(reports, key=lambda r: abs(r.iteration_error))
    out = {"runs": len(reports),
           "iteration_median_abs_error": statistics.median(it),
           "iteration_worst_abs_error": max(it),
           "iteration_worst_run": worst.name,
           "action_median_abs_error": statistics.median(acts) if acts else float("nan"),
           "activation_worst_abs_error": max(float(r.memory["activation_error"].abs().max())
                                             for r in reports)}
    shares = [x for r in reports if r.cpu is not None for x in r.cpu["share"]]
    if shares:  # the runs kept CPU times: did other work take the ranks' cores?
        out["cpu_share_min"] = min(shares)
        out["cpu_share_median"] = statistics.median(shares)
    if speedup is not None:
        out.update(_speedup(reports, [speedup] if isinstance(speedup, tuple) else
                            list(speedup)))
    return out


def _speedup(reports: list[AccuracyReport], pairs: list[tuple[str, str]]) -> dict:
    """Median speed-up of ``new`` over ``base`` over the name pairs present, measured
    and simulated, and their gap in percentage points (empty when no pair is)."""
    by = {r.name: r for r in reports}
    got = [(by[b], by[n]) for b, n in pairs if b in by and n in by]
    if not got:
        return {}
    ms = [b.measured_iteration_s / n.measured_iteration_s - 1.0 for b, n in got]
    ps = [b.predicted_iteration_s / n.predicted_iteration_s - 1.0 for b, n in got]
    out = {"speedup_pairs": len(got), "speedup_measured": statistics.median(ms),
           "speedup_predicted": statistics.median(ps)}
    out["speedup_gap_points"] = 100 * (out["speedup_predicted"] - out["speedup_measured"])
    return out
