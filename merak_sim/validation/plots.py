"""The side-by-side Gantt chart of a validated run: measured above, simulated below."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from merak_sim.io import atomic_write_bytes
from merak_sim.schedule.render import KIND_COLORS
from merak_sim.validation.measured import step_frame

if TYPE_CHECKING:
    from merak_sim.validation.report import AccuracyReport

__all__ = ["plot_side_by_side"]


def _draw(ax, df, ranks, title: str, colors: dict) -> None:
    """One timeline: a row per rank, a bar per action coloured by kind."""
    for i, r in enumerate(ranks):
        sub = df[df["rank"] == r]
        for kind, g in sub.groupby("kind"):
            bars = list(zip(g["start_s"] * 1e3, (g["end_s"] - g["start_s"]) * 1e3, strict=True))
            ax.broken_barh(bars, (i - 0.4, 0.8), facecolors=colors.get(kind, "grey"),
                           edgecolor="white", linewidth=0.3, label=kind)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_title(f"{title} ({df['end_s'].max() * 1e3:.1f} ms)", fontsize=9)


def plot_side_by_side(report: AccuracyReport, path: str | Path | None = None):
    """Gantt charts on one time axis: the measured step closest to the median above
    (effective starts), the simulation below. Saves to ``path`` if given."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    colors = {k.name: c for k, c in KIND_COLORS.items()}
    meas = step_frame(report.run, report.step)
    meas = meas[meas["stream"] != "p2p"].assign(start_s=lambda d: d["eff_start_s"])
    sim = report.sim.events()
    sim = sim[sim["stream"] != "p2p"]
    ranks_m = sorted(meas["rank"].unique())
    ranks_s = sorted(sim["rank"].unique())
    fig, axes = plt.subplots(2, 1, sharex=True,
                             figsize=(12, 1.6 + 0.5 * (len(ranks_m) + len(ranks_s))))
    _draw(axes[0], meas, ranks_m, f"{report.name}: measured", colors)
    _draw(axes[1], sim, ranks_s, f"{report.name}: simulated", colors)
    h, lab = axes[0].get_legend_handles_labels()
    h2, lab2 = axes[1].get_legend_handles_labels()
    uniq = dict(zip(lab + lab2, h + h2, strict=False))
    axes[0].legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.005, 1),
                   fontsize=7)
    axes[1].set_xlabel("time (ms)")
    fig.tight_layout()
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
        atomic_write_bytes(path, buf.getvalue())
    return fig
