"""``merak-sim schedule``: print, validate, replay and draw one pipeline schedule.

``--recompute`` takes the shared recompute syntax (:func:`.options.parse_recompute`)
or a bare fraction in [0, 1] for every stage; ``--json`` prints the schedule as JSON
and ``--json-out FILE`` writes it.
"""

from __future__ import annotations

from pathlib import Path

import click

from merak_sim.io import atomic_write_text
from merak_sim.schedule import SCHEDULES, generate, replay, stage_aware_fractions, validate
from merak_sim.schedule.render import plot_gantt, text_gantt

from .options import POSITIVE, check_work, check_writable, json_options, parse_recompute


def _unit_fractions(text: str, pp: int) -> float | tuple[float, ...]:
    """The checkpointed fraction(s) of the unit-cost replay from ``--recompute``."""
    try:
        x = float(text)
    except ValueError:
        pass
    else:
        if not 0.0 <= x <= 1.0:
            raise click.BadParameter(f"recompute fraction lies in [0, 1], got {text}",
                                     param_hint="'--recompute'")
        return x
    rc = parse_recompute(text)
    if rc.policy == "none":
        return 0.0
    if rc.policy == "full":
        return 1.0
    if rc.policy == "selective":
        raise click.BadParameter("selective recomputation has no unit cost; give none, "
                                 "full, a fraction or stage-aware",
                                 param_hint="'--recompute'")
    if rc.fractions is not None:
        if len(rc.fractions) != pp:
            raise click.BadParameter(f"{len(rc.fractions)} fractions for {pp} stages",
                                     param_hint="'--recompute'")
        return rc.fractions
    return stage_aware_fractions(pp, rc.c0)


@click.command("schedule")
@click.option("--schedule", "name", required=True, type=click.Choice(list(SCHEDULES)),
              help="Schedule generator.")
@click.option("--pp", type=POSITIVE, required=True, help="Pipeline stages S.")
@click.option("--microbatches", type=POSITIVE, required=True, help="Micro-batches M.")
@click.option("--virtual-stages", type=POSITIVE, default=1, show_default=True,
              help="Model chunks per rank (interleaved-1f1b).")
@click.option("--recompute", default="1", show_default=True,
              help="Checkpointed fraction in [0, 1] for the unit-cost replay, or none | "
                   "full | stage-aware | stage-aware:C0 | stage-aware:c0,c1,...")
@click.option("--gantt", "gantt_png", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart PNG of the unit-cost replay.")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), default=None,
              help="Write the schedule as CSV (one row per rank).")
@json_options
def schedule_command(name, pp, microbatches, virtual_stages, recompute, gantt_png, csv_out,
                     as_json, json_out):
    """Print the per-rank action sequences of a schedule, prove it deadlock-free, and
    replay it with unit costs (f=1, b=2, recompute 1, free communication)."""
    check_writable(("--gantt", gantt_png), ("--csv", csv_out), ("--json-out", json_out))
    fractions = _unit_fractions(recompute, pp)
    check_work(pp * virtual_stages * microbatches, "pp x virtual stages x micro-batches",
               "use fewer stages or micro-batches")
    sched = generate(name, pp, microbatches, virtual_stages)
    report = validate(sched)
    res = replay(sched, recompute=fractions)
    if csv_out:
        atomic_write_text(csv_out, sched.to_csv())
    if json_out:
        atomic_write_text(json_out, sched.to_json())
    if as_json:
        click.echo(sched.to_json())
        return
    shown = (f"{fractions:g}" if isinstance(fractions, float)
             else "[" + ",".join(f"{c:.2g}" for c in fractions) + "]")
    click.echo(f"# {name}: pp={pp} microbatches={microbatches} virtual_stages={virtual_stages}")
    click.echo(sched.format())
    click.echo("")
    click.echo(f"validated: deadlock-free; peak in-flight micro-batches per rank: "
               f"{list(report.peak_in_flight)}")
    click.echo(f"unit-cost makespan (f=1, b=2, recompute={shown}): {res.makespan:g}  "
               f"bubble fraction: {res.bubble_fraction:.3f}")
    if pp * microbatches <= 256:
        click.echo(text_gantt(res.execution))
    if gantt_png:
        plot_gantt(res.execution, Path(gantt_png), title=f"{name} S={pp} M={microbatches}")
        click.echo(f"wrote {gantt_png}")


command = schedule_command
