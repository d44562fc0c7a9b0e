"""Gantt renderings of an executed schedule: plain text, and matplotlib through
:mod:`merak_sim.timeline` (which imports matplotlib only when drawing, so importing
this module and ``merak_sim`` stays light).
"""

from __future__ import annotations

from pathlib import Path

from merak_sim import timeline

from .execute import Execution
from .ir import Kind

__all__ = ["text_gantt", "execution_events", "plot_gantt"]

_LETTER = {
    Kind.FORWARD: "F",
    Kind.FORWARD_NOGRAD: "f",
    Kind.RECOMPUTE: "r",
    Kind.BACKWARD: "B",
    Kind.BACKWARD_INPUT: "I",
    Kind.BACKWARD_WEIGHT: "W",
}


def text_gantt(ex: Execution, scale: float = 1.0) -> str:
    """One line per rank, ``scale`` characters per time unit; each compute action is
    drawn as its letter (F, f = F*, r = R, B, I, W) followed by its micro-batch, idle
    time as dots."""
    width = int(round(ex.makespan * scale))
    lines = []
    for r, acts in enumerate(ex.compute):
        row = ["."] * width
        for a, s, e in acts:
            if a.kind not in _LETTER:
                continue
            lo, hi = int(round(s * scale)), int(round(e * scale))
            label = f"{_LETTER[a.kind]}{a.microbatch}"
            for i in range(lo, min(hi, width)):
                row[i] = label[i - lo] if i - lo < len(label) else "-"
        lines.append(f"S{r} |{''.join(row)}|")
    return "\n".join(lines)


def execution_events(ex: Execution) -> list[tuple]:
    """The compute actions of an execution as events-table rows
    (:data:`merak_sim.timeline.EVENT_COLUMNS`; times in the execution's units, AR on
    the "collective" stream)."""
    return [(r, a.stage, a.chunk, "collective" if a.kind is Kind.ALL_REDUCE else "compute",
             a.kind.name, str(a), a.microbatch, s, e, 0)
            for r, acts in enumerate(ex.compute) for a, s, e in acts]


def plot_gantt(ex: Execution, path: str | Path | None = None, title: str = "", ax=None):
    """Draw the execution as a Gantt chart (:func:`merak_sim.timeline.plot_gantt`, each
    bar labelled with its micro-batch); save to ``path`` (atomically) if given.

    Returns the matplotlib Axes.
    """
    n = len(ex.compute)
    out = timeline.plot_gantt(
        execution_events(ex), ax=ax, path=path, max_ranks=n, title=title, time_scale=1.0,
        time_label="time", row_label="S{}", annotate=True,
        figsize=(max(6.0, ex.makespan * 0.25), 0.5 * n + 1))
    if path is not None and ax is None:
        import matplotlib.pyplot as plt

        plt.close(out.figure)  # written to a file, not shown
    return out
