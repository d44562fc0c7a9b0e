"""``merak-sim schedule``: print, validate, replay and draw one pipeline schedule."""

from __future__ import annotations

from pathlib import Path

import click

from merak_sim.io import atomic_write_text
from merak_sim.schedule import SCHEDULES, generate, replay, validate
from merak_sim.schedule.render import plot_gantt, text_gantt


@click.command("schedule")
@click.option("--schedule", "name", required=True, type=click.Choice(list(SCHEDULES)),
              help="Schedule generator.")
@click.option("--pp", type=int, required=True, help="Pipeline stages S.")
@click.option("--microbatches", type=int, required=True, help="Micro-batches M.")
@click.option("--virtual-stages", type=int, default=1, show_default=True,
              help="Model chunks per rank (interleaved-1f1b).")
@click.option("--recompute", type=float, default=1.0, show_default=True,
              help="Checkpointed fraction for the unit-cost replay.")
@click.option("--gantt", "gantt_png", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart PNG of the unit-cost replay.")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), default=None,
              help="Write the schedule as CSV (one row per rank).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write the schedule as JSON.")
def schedule_command(
    name, pp, microbatches, virtual_stages, recompute, gantt_png, csv_out, json_out
):
    """Print the per-rank action sequences of a schedule, prove it deadlock-free, and
    replay it with unit costs (f=1, b=2, recompute 1, free communication)."""
    sched = generate(name, pp, microbatches, virtual_stages)
    report = validate(sched)
    res = replay(sched, recompute=recompute)
    click.echo(f"# {name}: pp={pp} microbatches={microbatches} virtual_stages={virtual_stages}")
    click.echo(sched.format())
    click.echo("")
    click.echo(f"validated: deadlock-free; peak in-flight micro-batches per rank: "
               f"{list(report.peak_in_flight)}")
    click.echo(f"unit-cost makespan (f=1, b=2, recompute={recompute:g}): {res.makespan:g}  "
               f"bubble fraction: {res.bubble_fraction:.3f}")
    if pp * microbatches <= 256:
        click.echo(text_gantt(res.execution))
    if csv_out:
        atomic_write_text(csv_out, sched.to_csv())
    if json_out:
        atomic_write_text(json_out, sched.to_json())
    if gantt_png:
        plot_gantt(res.execution, Path(gantt_png), title=f"{name} S={pp} M={microbatches}")
        click.echo(f"wrote {gantt_png}")
command = schedule_command
