"""Gantt renderings of an executed schedule: plain text and matplotlib.

matplotlib is imported only inside :func:`plot_gantt`, so importing this module (and
``merak_sim``) stays light.
"""

from __future__ import annotations

from pathlib import Path

from .execute import Execution
from .ir import Kind

__all__ = ["text_gantt", "plot_gantt", "KIND_COLORS"]

#: One colour per compute kind, shared by every Gantt chart in the toolkit.
KIND_COLORS = {
    Kind.FORWARD: "#4C72B0",
    Kind.FORWARD_NOGRAD: "#8FB0E0",
    Kind.RECOMPUTE: "#DD8452",
    Kind.BACKWARD: "#55A868",
    Kind.BACKWARD_INPUT: "#55A868",
    Kind.BACKWARD_WEIGHT: "#A6D8A8",
    Kind.ALL_REDUCE: "#8172B3",
    Kind.OPTIMIZER: "#937860",
}

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


def plot_gantt(ex: Execution, path: str | Path | None = None, title: str = "", ax=None):
    """Draw the execution as a Gantt chart; save to ``path`` (atomically) if given.

    Returns the matplotlib Axes.
    """
    import matplotlib

    if path is not None and ax is None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(max(6.0, ex.makespan * 0.25), 0.5 * len(ex.compute) + 1))
    for r, acts in enumerate(ex.compute):
        for a, s, e in acts:
            if e <= s:
                continue
            ax.barh(r, e - s, left=s, color=KIND_COLORS.get(a.kind, "grey"), edgecolor="black",
                    linewidth=0.4)
            if a.kind.per_microbatch:
                ax.text((s + e) / 2, r, str(a.microbatch), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(ex.compute)), [f"S{r}" for r in range(len(ex.compute))])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    if title:
        ax.set_title(title)
    if path is not None and own:
        import io

        from merak_sim.io import atomic_write_bytes

        buf = io.BytesIO()
        ax.figure.tight_layout()
        ax.figure.savefig(buf, format="png", dpi=110)
        plt.close(ax.figure)
        atomic_write_bytes(Path(path), buf.getvalue())
    return ax
