"""``merak-sim dispatch``: turn a plan file into a launch script for a real cluster.

Arguments after ``--`` go to the training program (``merak-sim dispatch p.json --
--steps 100``); an unknown option before ``--`` is an error that says so.
"""

from __future__ import annotations

import click

from merak_sim.dispatch import CPUS_PER_GPU, LAUNCHERS, write_launch
from merak_sim.plan import Plan


class _PassThrough(click.Command):
    """A command whose unknown options are refused with a hint that the training
    program's arguments go after ``--``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's parsing; an unknown option's error names ``--``."""
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            raise click.UsageError(
                f"{e.format_message()} (arguments for the training program go after --, "
                f"e.g. merak-sim dispatch PLAN -- {e.option_name} ...)", ctx) from None


@click.command("dispatch", cls=_PassThrough)
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="torchrun", show_default=True)
@click.option("--nodes", type=int, default=None,
              help="Number of nodes (default: the shape the plan was priced on).")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs (processes) per node (default: the plan's).")
@click.option("--script", default=None,
              help="Training script file to launch (default: python -m merak_exec train); "
                   "a relative path is resolved now, its arguments go after --.")
@click.option("--venv", default=None, type=click.Path(file_okay=False),
              help="Virtual environment the job activates first (its bin/activate).")
@click.option("--setup", multiple=True,
              help="A shell line the job runs first, e.g. 'module load cuda/12.4' "
                   "(repeatable, in order).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/dispatch",
              show_default=True, help="Directory for plan.json and the launch script.")
@click.option("--time", "time_limit", default=None,
              help="sbatch --time (e.g. 2:00:00 or 1-12:00:00).")
@click.option("--partition", default=None, help="sbatch --partition.")
@click.option("--output", default=None, help="sbatch --output (e.g. merak-%j.out).")
@click.option("--cpus-per-task", type=int, default=None,
              help=f"sbatch --cpus-per-task of the one task per node that runs all its "
                   f"workers (default: {CPUS_PER_GPU} per GPU).")
@click.option("--exclusive", is_flag=True, help="sbatch --exclusive (whole nodes).")
@click.option("--force", is_flag=True,
              help="Dispatch a plan merak-exec cannot run yet or one priced on another "
                   "cluster shape.")
def dispatch_command(plan_file, train_args, launcher, nodes, gpus_per_node, script, venv,
                     setup, out_dir, time_limit, partition, output, cpus_per_task, exclusive,
                     force):
    """Write a torchrun launch script or an sbatch file, plus the config file
    (plan.json) the real backend reads. Arguments after -- go to the training
    program."""
    from .options import check_writable

    check_writable(("--out", out_dir), folder=True)
    plan = Plan.load(plan_file)
    files = write_launch(plan, launcher, nodes, gpus_per_node, out_dir, script, force=force,
                         time=time_limit, partition=partition, output=output,
                         cpus_per_task=cpus_per_task, exclusive=exclusive, venv=venv,
                         setup=tuple(setup), args=tuple(train_args))
    if files.forced:
        click.echo(f"merak-sim: warning: {files.forced} (dispatched with --force)", err=True)
    click.echo(f"wrote {files.plan}")
    click.echo(f"wrote {files.launcher}")
    for line in files.node_commands:
        click.echo(line)


command = dispatch_command
