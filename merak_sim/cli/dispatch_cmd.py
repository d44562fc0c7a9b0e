"""``merak-sim dispatch``: turn a plan file into a launch script for a real cluster."""

from __future__ import annotations

import click

from merak_sim.dispatch import LAUNCHERS, write_launch
from merak_sim.plan import Plan


@click.command("dispatch")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="torchrun", show_default=True)
@click.option("--nodes", type=int, required=True, help="Number of nodes.")
@click.option("--gpus-per-node", type=int, required=True, help="GPUs (processes) per node.")
@click.option("--script", default=None,
              help="Training script to launch (default: python -m merak_exec train).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/dispatch",
              show_default=True, help="Directory for plan.json and the launch script.")
def dispatch_command(plan_file, launcher, nodes, gpus_per_node, script, out_dir):
    """Write a torchrun launch script or an sbatch file, plus the config file
    (plan.json) the real backend reads."""
    plan = Plan.load(plan_file)
    files = write_launch(plan, launcher, nodes, gpus_per_node, out_dir, script)
    click.echo(f"wrote {files.plan}")
    click.echo(f"wrote {files.launcher}")
    for i, cmd in enumerate(files.node_commands):
        click.echo(f"node {i}: {cmd}")


command = dispatch_command
