"""``merak-sim`` command line. Each subcommand lives in its own module of this package
and is registered in :data:`SUBCOMMANDS`.

Errors from bad input (``ValueError`` and its subclasses such as ScheduleError,
click usage errors, unreadable files) are printed as one line
``merak-sim: error: ...`` and exit with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

__all__ = ["cli", "main", "SUBCOMMANDS"]

#: module (in this package) -> name of the click command object inside it.
SUBCOMMANDS: dict[str, str] = {
    "schedule_cmd": "schedule",
    "demo_cmd": "demo",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="merak")
def cli() -> None:
    """Simulate, plan and reproduce 3D-parallel transformer training (Merak)."""


for _mod, _attr in SUBCOMMANDS.items():
    cli.add_command(getattr(importlib.import_module(f"{__name__}.{_mod}"), _attr))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit status."""
    try:
        rv = cli.main(args=argv, prog_name="merak-sim", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        return 2
    except click.UsageError as e:
        click.echo(f"merak-sim: error: {e.format_message()}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.Abort:
        click.echo("merak-sim: aborted", err=True)
        return 1
    except (ValueError, OSError, KeyError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        click.echo(f"merak-sim: error: {msg}", err=True)
        # Multi-line diagnostics (like a deadlock grid) follow the one-line error.
        extra = str(e).splitlines()[1:]
        if extra:
            click.echo("\n".join(extra), err=True)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
