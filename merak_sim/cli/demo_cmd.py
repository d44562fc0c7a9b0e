"""``merak-sim demo``: the embedded default job (schedule comparison, table and plot)."""

from __future__ import annotations

from pathlib import Path

import click

from merak_sim.io import atomic_write_text
from merak_sim.schedule import generate, replay, stage_aware_fractions

from .options import POSITIVE, check_work, check_writable


def schedule_comparison(pp: int = 4, microbatches: int = 8) -> list[dict]:
    """Unit-cost makespans of the Merak schedule family against 1F1B (f=1, b=2, r=1).

    Returns one row per variant with its makespan and speed-up over 1F1B with full
    recomputation, as in the toy analysis of Merak's schedules (Lai et al., TPDS 2023).
    """
    c = list(stage_aware_fractions(pp, 0.75))
    if pp >= 3:
        c[pp - 2] = c[pp - 3]  # stage S-2 holds 3 micro-batches at its start
    variants = [
        ("1f1b, full recompute", "1f1b", 1.0),
        ("pre-recompute (T1.2)", "pre-recompute", 1.0),
        ("last-no-recompute (T1.1-2)", "last-no-recompute", 1.0),
        ("shifted-critical-path (T1)", "shifted-critical-path", 1.0),
        ("T1 + stage-aware c0=0.75 (T2)", "shifted-critical-path", c),
        ("1f1b, no recompute", "1f1b", 0.0),
    ]
    base = None
    rows = []
    for label, name, rc in variants:
        res = replay(generate(name, pp, microbatches), recompute=rc)
        base = base or res.makespan
        rows.append({"variant": label, "schedule": name, "makespan": res.makespan,
                     "speedup": base / res.makespan, "bubble": res.bubble_fraction,
                     "execution": res.execution})
    return rows


@click.command("demo")
@click.option("--out", type=click.Path(file_okay=False), default="out/demo", show_default=True)
@click.option("--pp", type=POSITIVE, default=4, show_default=True)
@click.option("--microbatches", type=POSITIVE, default=8, show_default=True)
def demo_command(out, pp, microbatches):
    """Compare pipeline schedules on unit costs; print a table and write a plot."""
    check_writable(("--out", out), folder=True)
    check_work(pp * microbatches, "pp x micro-batches", "use fewer stages or micro-batches")
    from rich.console import Console
    from rich.table import Table

    rows = schedule_comparison(pp, microbatches)
    table = Table(title=f"Unit-cost schedule comparison, S={pp}, M={microbatches} "
                        "(f=1, b=2, recompute=1, free communication)")
    for col in ("variant", "makespan", "speed-up vs 1F1B+recompute", "bubble"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["variant"], f"{r['makespan']:.2f}", f"{r['speedup']:.3f}x",
                      f"{r['bubble']:.3f}")
    Console().print(table)

    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    from merak_sim.io import atomic_write_bytes
    from merak_sim.schedule.render import plot_gantt

    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 2.0 * len(rows)), sharex=True)
    for ax, r in zip(axes, rows, strict=True):
        plot_gantt(r["execution"], ax=ax, title=f"{r['variant']}: {r['makespan']:.2f}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    path = Path(out) / "schedules.png"
    atomic_write_bytes(path, buf.getvalue())
    atomic_write_text(Path(out) / "schedules.csv", "variant,makespan,speedup,bubble\n" + "".join(
        f"{r['variant']},{r['makespan']},{r['speedup']},{r['bubble']}\n" for r in rows))
    click.echo(f"wrote {path}")
command = demo_command
