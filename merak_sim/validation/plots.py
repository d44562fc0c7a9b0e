"""The side-by-side Gantt chart of a validated run: measured above, simulated below."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from merak_sim import timeline
from merak_sim.validation.measured import step_frame

if TYPE_CHECKING:
    from merak_sim.validation.report import AccuracyReport

__all__ = ["plot_side_by_side"]


def plot_side_by_side(report: AccuracyReport, path: str | Path | None = None):
    """Gantt charts on one time axis (:func:`merak_sim.timeline.plot_side_by_side`): the
    measured step closest to the median above, drawn at its effective starts, the
    simulation below. Saves to ``path`` if given; returns the Figure."""
    meas = step_frame(report.run, report.step).assign(start_s=lambda d: d["eff_start_s"])
    return timeline.plot_side_by_side(meas, report.sim.events(), name=report.name, path=path)
