"""``merak-sim fidelity``: the simulator against every open dataset in data/.

Predicts vTrain's A100 runs and the published public runs with the shipped
calibration and writes one markdown report (:mod:`merak_sim.validation.fidelity_report`):
targets, errors per dataset, role (fitted or held out) and group, and every row the
model cannot express with its reason. About a minute on two cores; ``--limit N``
predicts the first N rows per file (a quick look: printed, not written).
"""

from __future__ import annotations

import click

from .options import check_writable


@click.command("fidelity")
@click.option("--data", default="data", show_default=True, type=click.Path(file_okay=False),
              help="The open data folder (vtrain/ and public-runs/, as in the repository).")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Markdown report to write (the summary plus every row).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Only the first N rows of each file; nothing is written.")
def fidelity_command(data, out, limit):
    """Measured vs predicted step time (and peak memory) over the open data."""
    from merak_sim.io import atomic_write_text
    from merak_sim.validation.fidelity_report import check_data, fidelity_report

    if limit and out:
        raise click.UsageError("--limit reports a sample: give --limit or --out, not both")
    check_writable(("--out", out))
    check_data(data)
    rep = fidelity_report(data, limit=limit, progress=click.echo)
    command = "merak-sim fidelity" + (f" --out {out}" if out else "")
    summary = rep.summary_lines(command)
    click.echo("\n".join(summary))
    if out:
        atomic_write_text(out, "\n".join(summary + rep.row_lines()))
        click.echo(f"wrote {out}")


command = fidelity_command
