"""``merak-sim dispatch``: turn a plan file into a launch script for a real cluster."""

from __future__ import annotations

import click

from merak_sim.dispatch import LAUNCHERS, write_launch
from merak_sim.plan import Plan


@click.command("dispatch")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="torchrun", show_default=True)
@click.option("--nodes", type=int, default=None,
              help="Number of nodes (default: the shape the plan was priced on).")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs (processes) per node (default: the plan's).")
@click.option("--script", default=None,
              help="Training script to launch (default: python -m merak_exec train).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/dispatch",
              show_default=True, help="Directory for plan.json and the launch script.")
@click.option("--time", "time_limit", default=None,
              help="sbatch --time (e.g. 2:00:00 or 1-12:00:00).")
@click.option("--partition", default=None, help="sbatch --partition.")
@click.option("--output", default=None, help="sbatch --output (e.g. merak-%j.out).")
@click.option("--force", is_flag=True,
              help="Dispatch a plan merak-exec cannot run yet or one priced on another "
                   "cluster shape.")
def dispatch_command(plan_file, launcher, nodes, gpus_per_node, script, out_dir, time_limit,
                     partition, output, force):
    """Write a torchrun launch script or an sbatch file, plus the config file
    (plan.json) the real backend reads."""
    from .options import check_writable

    check_writable(("--out", out_dir), folder=True)
    plan = Plan.load(plan_file)
    files = write_launch(plan, launcher, nodes, gpus_per_node, out_dir, script, force=force,
                         time=time_limit, partition=partition, output=output)
    if files.forced:
        click.echo(f"merak-sim: warning: {files.forced} (dispatched with --force)", err=True)
    click.echo(f"wrote {files.plan}")
    click.echo(f"wrote {files.launcher}")
    for line in files.node_commands:
        click.echo(line)


command = dispatch_command
