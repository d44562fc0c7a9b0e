"""``merak-sim`` command line.

Every module of this package named ``*_cmd.py`` defines one click command in a
module attribute ``command`` (named as the module, less ``_cmd``, with dashes); they
are found automatically and imported when used, so adding a subcommand never touches
this file.

Errors from bad input (``ValueError`` and its subclasses such as ScheduleError,
click usage errors, unreadable files) are printed as one line
``merak-sim: error: ...`` and exit with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys

import click

__all__ = ["cli", "main"]


class _Commands(click.Group):
    """The ``*_cmd.py`` modules of this package as subcommands, each imported only when
    its command runs or is listed (``merak-sim simulate`` loads the simulator alone,
    and merak-exec can use :mod:`merak_sim.cli.vocab` without loading any command)."""

    def _modules(self) -> dict[str, str]:
        return {info.name[:-4].replace("_", "-"): f"{__name__}.{info.name}"
                for info in pkgutil.iter_modules(__path__) if info.name.endswith("_cmd")}

    def list_commands(self, ctx) -> list[str]:
        """Every subcommand's name, sorted."""
        return sorted(self._modules())

    def get_command(self, ctx, name: str) -> click.Command | None:
        """Subcommand ``name``, its module imported on first use."""
        if name not in self.commands:
            module = self._modules().get(name)
            if module is None:
                return None
            self.add_command(importlib.import_module(module).command, name)
        return self.commands[name]


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="merak")
def cli() -> None:
    """Simulate, plan and reproduce 3D-parallel transformer training (Merak)."""


def _as_flags(text: str, argv: list[str] | None) -> str:
    """``text`` with each Python keyword form ``name='value'`` (``name=True`` for a
    flag) of an option of the command being run written as that option
    (``mode='full'`` -> ``--mode full``): errors raised below the command line name
    its flags."""
    args = sys.argv[1:] if argv is None else argv
    cmd = cli.get_command(None, next((a for a in args if not a.startswith("-")), ""))
    if cmd is None:
        return text
    opts = {p.name: p for p in cmd.params
            if isinstance(p, click.Option) and p.opts[0].startswith("--")}

    def flag(m: re.Match) -> str:
        p = opts.get(m.group(1))
        if p is None or (m.group(2) == "True") != bool(p.is_flag):
            return m.group(0)
        return p.opts[0] if p.is_flag else f"{p.opts[0]} {m.group(3)}"

    text = re.sub(r"\b([a-z_]+)=(True|'([^']*)')", flag, text)
    return re.sub(r"(--[\w-]+) \(\1\)", r"\1", text)  # "--x (--x)" said twice


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
        text = _as_flags(str(e) or type(e).__name__, argv)
        lines = text.splitlines()
        click.echo(f"merak-sim: error: {lines[0]}", err=True)
        # Multi-line diagnostics (like a deadlock grid) follow the one-line error.
        if len(lines) > 1:
            click.echo("\n".join(lines[1:]), err=True)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
