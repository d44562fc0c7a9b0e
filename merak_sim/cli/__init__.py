"""``merak-sim`` command line.

Every module of this package named ``*_cmd.py`` defines one click command in a
module attribute ``command``; they are registered automatically, so adding a
subcommand never touches this file.

Errors from bad input (``ValueError`` and its subclasses such as ScheduleError,
click usage errors, unreadable files) are printed as one line
``merak-sim: error: ...`` and exit with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="merak")
def cli() -> None:
    """Simulate, plan and reproduce 3D-parallel transformer training (Merak)."""


for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.endswith("_cmd"):
        cli.add_command(importlib.import_module(f"{__name__}.{_info.name}").command)


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
        text = str(e) or type(e).__name__
        lines = text.splitlines()
        click.echo(f"merak-sim: error: {lines[0]}", err=True)
        # Multi-line diagnostics (like a deadlock grid) follow the one-line error.
        if len(lines) > 1:
            click.echo("\n".join(lines[1:]), err=True)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
