"""``merak-sim validate --run RUNDIR``: prediction versus measurement of one run.

Reads a run directory (``merak-run/1``: the measured iterations and the stage profile
of the machine they ran on, see :mod:`merak_sim.validation.rundir`), simulates the
same configuration from the profile and prints the iteration-time error, the
per-action error table, the per-rank compute / exposed-communication / bubble
comparison and the memory error per stage, and the error of each block of timed
iterations against the profiler steps bracketing it. ``--json`` prints one JSON
object (the summary plus the tables); ``--gantt`` writes the side-by-side chart
(measured above, simulated below). A missing or malformed run directory is a one-line
error with exit status 2.
"""

from __future__ import annotations

import click


@click.command("validate")
@click.option("--run", "run_dir", required=True, type=click.Path(file_okay=False),
              help="Run directory written by the validation measurement.")
@click.option("--profile", "profile", default=None, type=click.Path(dir_okay=False),
              help="Price from this stage profile instead of RUNDIR/profile.json.")
@click.option("--gantt", "gantt", default=None, type=click.Path(dir_okay=False),
              help="Write the side-by-side Gantt chart (PNG/SVG/PDF) here.")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False),
              help="Also write the markdown report here.")
@click.option("--statistic", type=click.Choice(["mean", "median", "min"]), default="mean",
              show_default=True,
              help="mean: profile and action means against the median iteration; "
                   "median: medians throughout; min: fastest samples on both sides (the "
                   "lower envelope of a shared machine).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def command(run_dir: str, profile: str | None, gantt: str | None, report_path: str | None,
            statistic: str, as_json: bool) -> None:
    """Compare a measured run with its simulation (iteration, actions, memory)."""
    from merak_sim.io import atomic_write_text
    from merak_sim.validation.compare import compare_run

    from .options import check_writable

    check_writable(("--gantt", gantt), ("--report", report_path))

    rep = compare_run(run_dir, profile, statistic=statistic)
    if gantt:
        rep.plot(gantt)
    md = rep.to_markdown()
    if report_path:
        atomic_write_text(report_path, md)
    if as_json:
        click.echo(rep.to_json())
    else:
        click.echo(md, nl=False)
