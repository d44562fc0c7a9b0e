"""Figures and files of the Merak reproduction: the speed-up chart (both baseline
families and the ablation), the regime heat-map, and the CSV / text outputs."""

from __future__ import annotations

import io
from pathlib import Path

from merak_sim.io import atomic_write_bytes, atomic_write_text

from .merak import ABLATION_ORDER, Reproduction

__all__ = ["plot_reproduction", "plot_regimes", "write_outputs"]

_BASELINES = (("megatron", "vs Megatron-LM-like (full recompute)"),
              ("deepspeed", "vs DeepSpeed-like (full recompute)"),
              ("megatron-free", "vs Megatron-LM-like, free recompute"),
              ("deepspeed-free", "vs DeepSpeed-like, free recompute"))


def _pyplot(path):
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path) -> None:
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        atomic_write_bytes(path, buf.getvalue())


def plot_reproduction(rep: Reproduction, path: str | Path | None = None):
    """Left: Merak's speed-up over each baseline of both families (paper-like, forced
    into full recompute; free, choosing their own), the paper's figure marked. Right:
    the ablation over the better paper-like baseline. Written atomically as PNG when
    ``path`` is given; returns the figure."""
    plt = _pyplot(path)
    import numpy as np

    names = [m.model for m in rep.models]
    x = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    w = 0.2
    for i, (s, label) in enumerate(_BASELINES):
        vals = [m.runs[s].time_s / m.runs["merak"].time_s for m in rep.models]
        a1.bar(x + (i - 1.5) * w, vals, w, label=label,
               hatch="//" if "free" in s else None)
    a1.scatter(x - w, [m.paper for m in rep.models], marker="*", s=160, color="k",
               zorder=3, label="Merak (paper, up to)")
    a1.set_xticks(x, names)
    a1.set_ylabel("Merak's speed-up")
    a1.set_title(f"{rep.cluster}, global batch {rep.global_batch_size}")
    a1.axhline(1.0, color="grey", lw=0.8)
    top = max([m.paper for m in rep.models] + [m.speedup for m in rep.models])
    a1.set_ylim(0, top * 1.35)
    a1.legend(fontsize=7, loc="upper left", ncol=2)
    w2 = 0.2
    for i, s in enumerate(ABLATION_ORDER):
        vals = [dict((st, sp) for st, _l, _t, sp in m.ablation)[s] for m in rep.models]
        a2.bar(x + (i - 1.5) * w2, vals, w2, label=rep.models[0].runs[s].label)
    a2.set_xticks(x, names)
    a2.set_ylabel("speed-up over the better paper-like baseline")
    a2.set_title("ablation: one technique at a time")
    a2.axhline(1.0, color="grey", lw=0.8)
    a2.set_ylim(0, top * 1.35)
    a2.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    _save(fig, plt, path)
    return fig


def plot_regimes(regimes, path: str | Path | None = None):
    """Heat-map: rows model x GPU memory, columns the gain of T1, T2, T3 (each over the
    step before) and of all three over the free baseline, in percent; "no fit" where no
    plan fits. Written atomically as PNG when ``path`` is given; returns the figure."""
    plt = _pyplot(path)
    import numpy as np

    cols = (("+T1", "T1 shifted\ncritical path"), ("+T2", "T2 stage-aware\nrecompute"),
            ("+T3", "T3 sub-pipelined\nTP"), (None, "all three\nover free"))
    data = np.full((len(regimes), len(cols)), np.nan)
    for i, r in enumerate(regimes):
        for j, (step, _l) in enumerate(cols):
            x = r.total if step is None else r.factor(step)
            if x is not None:
                data[i, j] = (x - 1.0) * 100
    fig, ax = plt.subplots(figsize=(7, 0.38 * len(regimes) + 1.6))
    vmax = max(1.0, float(np.nanmax(data)) if np.isfinite(data).any() else 1.0)
    im = ax.imshow(data, cmap="Greens", vmin=0, vmax=vmax, aspect="auto")
    for i, r in enumerate(regimes):
        for j in range(len(cols)):
            v = data[i, j]
            ax.text(j, i, "no fit" if np.isnan(v) else f"{v:+.1f} %", ha="center",
                    va="center", fontsize=8, color="white" if v > 0.6 * vmax else "black")
    ax.set_xticks(range(len(cols)), [c[1] for c in cols], fontsize=8)
    ax.set_yticks(range(len(regimes)),
                  [f"{r.model} {r.memory_gb:g} GB" for r in regimes], fontsize=8)
    ax.set_title("Gain of each Merak technique over the free baseline\n"
                 "(GPU memory level; fast evaluator)", fontsize=9)
    fig.colorbar(im, ax=ax, label="speed-up %")
    fig.tight_layout()
    _save(fig, plt, path)
    return fig


def write_outputs(rep: Reproduction, out_dir: str | Path, regimes=None) -> dict[str, Path]:
    """Write the charts (PNG), the tables (CSV) and the assumptions (text) atomically;
    the regime heat-map and table too when ``regimes`` is given."""
    out = Path(out_dir)
    paths = {"chart": out / "merak_speedups.png", "table": out / "speedups.csv",
             "ablation": out / "ablation.csv", "assumptions": out / "assumptions.txt"}
    plot_reproduction(rep, paths["chart"])
    atomic_write_text(paths["table"], rep.table().to_csv(index=False))
    atomic_write_text(paths["ablation"], rep.ablation_table().to_csv(index=False))
    atomic_write_text(paths["assumptions"], "\n".join(rep.assumptions) + "\n")
    if regimes:
        import pandas as pd

        paths["regime_map"] = out / "regimes.png"
        paths["regimes"] = out / "regimes.csv"
        plot_regimes(regimes, paths["regime_map"])
        rows = [{k: v for k, v in r.to_dict().items() if k not in ("times_s", "configs",
                                                                    "t3_margin")}
                for r in regimes]
        atomic_write_text(paths["regimes"], pd.DataFrame(rows).to_csv(index=False))
    return paths
