"""What every ``merak-sim`` command shares: one flag vocabulary and the checks made
before any work starts.

- :class:`AliasOption` keeps old spellings of a flag working without showing them in
  ``--help`` (``--mbs`` for ``--micro-batch-size``, ``--model-json`` for ``--model``).
- :func:`parse_recompute` is the one recompute syntax (``none``, ``full``,
  ``selective``, ``stage-aware``, ``stage-aware:C0``, ``stage-aware:c0,c1,...``).
- :func:`check_writable` proves every output path can be written before a command
  computes anything, without leaving a file or folder behind
  (:func:`merak_sim.io.check_output_path`, shared with merak-exec).
- :func:`check_work` refuses inputs whose work would take minutes, naming the limit
  and what goes further.
- :func:`emit_json` is ``--json`` (print) and ``--json-out FILE`` (write atomically).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from merak_sim.io import OutputPathError, check_output_path
from merak_sim.progress import REPLAY_BOUND, WorkBound

__all__ = ["ORDER_HELP", "PIPELINE_SEND_HELP", "AliasOption", "Recompute", "parse_recompute",
           "check_writable", "check_work", "emit_json", "json_options", "stacked", "POSITIVE",
           "NON_NEGATIVE"]

class _BoundedInt(click.ParamType):
    """An integer of at least ``low``; the error names the value's field."""

    def __init__(self, low: int, what: str) -> None:
        self.low, self.what = low, what
        self.name = f"integer >= {low}"

    def convert(self, value, param, ctx):
        """The integer, or a usage error naming the field and the bound."""
        if isinstance(value, int) and not isinstance(value, bool):
            v = value
        else:
            try:
                v = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not an integer", param, ctx)
        if v < self.low:
            field = param.name if param is not None else "value"
            self.fail(f"{field} must be a {self.what} integer, got {v}", param, ctx)
        return v


#: ``--order``'s help, the same in every command that places ranks.
ORDER_HELP = ("Rank placement, axes fastest varying first (default tp-cp-dp-pp, "
              "Megatron's; e.g. dp-tp-cp-pp keeps data-parallel replicas in a node).")

#: ``--pipeline-send``'s help, the same in every command that prices sends (its
#: choices: :data:`merak_sim.costs.comm.PIPELINE_SENDS`).
PIPELINE_SEND_HELP = ("How activations cross a pipeline boundary: the full activation "
                      "per GPU, or 1/tp of it and an all-gather over the receiving TP "
                      "group (Megatron-LM without sequence parallelism). Default: "
                      "scatter-gather on the measured A100 presets, full elsewhere.")

POSITIVE = _BoundedInt(1, "positive")
NON_NEGATIVE = _BoundedInt(0, "non-negative")


class AliasOption(click.Option):
    """An option whose secondary spellings are hidden aliases: ``--help`` shows only
    the first name; every name works."""

    def get_help_record(self, ctx: click.Context):
        """The help line with the first spelling only."""
        saved = self.opts
        self.opts = self.opts[:1]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = saved

    def get_error_hint(self, ctx: click.Context) -> str:
        """Errors name the first spelling only."""
        return f"'{self.opts[0]}'"


@dataclass(frozen=True)
class Recompute:
    """A parsed ``--recompute`` value: the policy and, for stage-aware, either the
    first stage's fraction ``c0`` or explicit per-stage ``fractions``."""

    policy: str
    c0: float = 0.75
    fractions: tuple[float, ...] | None = None


def _fraction(text: str, whole: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise click.BadParameter(f"bad recompute fraction {text!r} in {whole!r}",
                                 param_hint="'--recompute'") from None
    if not 0.0 <= x <= 1.0:
        raise click.BadParameter(f"recompute fractions lie in [0, 1], got {text} in "
                                 f"{whole!r}", param_hint="'--recompute'")
    return x


def parse_recompute(text: str) -> Recompute:
    """Parse the shared recompute syntax; a bad value is a click usage error."""
    from merak_sim.config import RECOMPUTE_POLICIES

    policy, sep, arg = text.strip().partition(":")
    if policy not in RECOMPUTE_POLICIES:
        raise click.BadParameter(
            f"{text!r} is not one of {', '.join(RECOMPUTE_POLICIES)} (stage-aware takes "
            "stage-aware:C0 or stage-aware:c0,c1,...)", param_hint="'--recompute'")
    if not sep:
        return Recompute(policy)
    if policy != "stage-aware":
        raise click.BadParameter(f"only stage-aware takes fractions, got {text!r}",
                                 param_hint="'--recompute'")
    vals = tuple(_fraction(x, text) for x in arg.split(","))
    return Recompute(policy, c0=vals[0]) if len(vals) == 1 else Recompute(policy,
                                                                          fractions=vals)


def check_writable(*named: tuple[str, str | None], folder: bool = False) -> None:
    """Fail with a one-line usage error unless every ``(flag, path)`` given can be
    written (:func:`merak_sim.io.check_output_path`, the checker merak-exec uses too:
    no device, FIFO, socket or directory is replaced; nothing is left behind)."""
    for flag, path in named:
        if path is None:
            continue
        try:
            check_output_path(path, folder=folder)
        except OutputPathError as e:
            raise click.UsageError(f"{flag} {e}") from None


def check_work(units: int, what: str, fix: str, bound: WorkBound = REPLAY_BOUND,
               alternative: str | None = None) -> None:
    """Refuse at once, in one line, when ``units`` micro-batch passes exceed ``bound``
    (default: building and replaying a schedule action by action), naming what goes
    further (``alternative``, default the bound's own)."""
    if not bound.admits(units):
        raise click.UsageError(bound.refusal(units, what, fix, alternative))


def emit_json(obj: Any, as_json: bool, json_out: str | None, **dumps: Any) -> str:
    """``--json`` prints ``obj``; ``--json-out FILE`` writes it atomically. Returns
    the text."""
    from merak_sim.io import atomic_write_text

    text = json.dumps(obj, **dumps)
    if json_out:
        atomic_write_text(json_out, text + "\n")
    if as_json:
        click.echo(text)
    return text


def stacked(*options: Callable) -> Callable:
    """One decorator applying ``options`` as if written one above the other (the first
    on top): a command's option groups declared beside it, so the command stays short."""
    def deco(f: Callable) -> Callable:
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco


def json_options(f):
    """The ``--json`` / ``--json-out FILE`` pair of options."""
    f = click.option("--json-out", "json_out", type=click.Path(dir_okay=False),
                     default=None, help="Write the JSON object to FILE.")(f)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON object.")(f)
