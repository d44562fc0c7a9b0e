"""``merak-sim calibrate``: fit a cost profile to measured runs.

Reads runs CSVs (docs/calibrate.md lists the columns; vTrain's published files are
recognised by their header) and merak-exec run folders, fits the GPU's efficiency
curve within physical bounds (:mod:`merak_sim.calibrate.fit`), prints the error on
the fit runs and on held-out runs, and writes a cost profile file that
``--profile FILE`` on simulate, plan and costs uses. Held-out runs: the files given
with ``--held-out``; without any, every fifth run of the input (``--hold-out-every``).
Bad input is one line with exit status 2; ``--out`` is checked before any work and
written atomically.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from .options import check_writable

#: Runs held out when no --held-out file is given (every N-th run).
DEFAULT_HOLD_OUT_EVERY = 5


def _shown(path: str) -> str:
    """A path as the profile records it: as given when relative (the repository's
    data/...), else only its name (a profile names no file outside its folder)."""
    return path if not Path(path).is_absolute() else Path(path).name


def _command(runs, held_out, run_dirs, cluster, every, free, rounds, out) -> str:
    parts = ["merak-sim calibrate", *(_shown(p) for p in runs)]
    parts += [f"--held-out {_shown(p)}" for p in held_out]
    parts += [f"--run-dir {_shown(p)}" for p in run_dirs]
    if cluster:
        parts.append(f"--cluster {cluster}")
    if every is not None:
        parts.append(f"--hold-out-every {every}")
    if free:
        parts.append(f"--free {free}")
    if rounds is not None:
        parts.append(f"--rounds {rounds}")
    return " ".join([*parts, f"--out {_shown(out)}"])


def _load(runs, run_dirs, cluster):
    from merak_sim.calibrate import load_runs, read_run_folder

    out = [r for p in runs for r in load_runs(p)]
    return out + [read_run_folder(d, cluster) for d in run_dirs]


def _errors_line(what: str, e) -> str:
    return (f"{what}: {e.runs} runs, MAPE {e.mape_pct:.2f} %, mean signed {e.signed_pct:+.2f} "
            f"%, mean |log error| {e.log_loss:.4f}, worst {e.worst_pct:+.1f} % ({e.worst_label})")


def _report(cal, out: str, seconds: float) -> None:
    click.echo(_errors_line("fit", cal.fit)
               + f"; {cal.rounds_run} rounds, "
               + ("stopped by its rule" if cal.stopped_by_rule else "stopped at the round cap"))
    click.echo(_errors_line("held out", cal.held_out) if cal.held_out else
               "held out: none (give --held-out FILE or --hold-out-every N)")
    click.echo(f"parameters of {cal.gpu} (bounds; start):")
    for k, v in cal.parameters.items():
        lo, hi = cal.bounds[k]
        mark = "  at a bound" if k in cal.at_bounds() else ""
        click.echo(f"  {k:<18} {v:<12.6g} [{lo:g}, {hi:g}; {cal.start[k]:.4g}]{mark}")
    click.echo(f"wrote cost profile: {out} ({seconds:.1f} s); use it with --profile {out}")


@click.command("calibrate")
@click.argument("runs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--held-out", multiple=True, type=click.Path(dir_okay=False),
              help="Runs file scored with the fitted profile, never fitted to "
                   "(repeatable).")
@click.option("--run-dir", "run_dirs", multiple=True, type=click.Path(file_okay=False),
              help="A merak-exec run folder (merak-run/1) as one more fit run (repeatable).")
@click.option("--cluster", default=None,
              help="Cluster preset of the run folders (default: the one run.json names; "
                   "local-cpu for gloo runs).")
@click.option("--hold-out-every", "every", type=click.IntRange(min=0), default=None,
              help=f"Hold out every N-th run of the input (default {DEFAULT_HOLD_OUT_EVERY} "
                   "without --held-out, else 0: none).")
@click.option("--free", default=None,
              help="Comma-separated parameters to fit (default: all seven of the "
                   "efficiency curve).")
@click.option("--rounds", type=click.IntRange(min=0), default=None,
              help="Cap on search rounds (default 40; the stopping rule ends it sooner).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Cost profile file to write (merak-cost-profile/1 JSON).")
def calibrate_command(runs, held_out, run_dirs, cluster, every, free, rounds, out):
    """Fit a cost profile to measured runs; print fit and held-out error."""
    from merak_sim.calibrate import calibrate, hold_out_every, load_runs
    from merak_sim.calibrate.fit import FIT_PARAMS
    from merak_sim.io import atomic_write_text

    check_writable(("--out", out))
    if not runs and not run_dirs:
        raise click.UsageError("give at least one runs file (RUNS) or --run-dir DIR")
    t0 = time.perf_counter()
    names = tuple(n.strip() for n in free.split(",")) if free else FIT_PARAMS
    fit_runs, held = hold_out_every(
        _load(runs, run_dirs, cluster),
        every if every is not None else (0 if held_out else DEFAULT_HOLD_OUT_EVERY))
    held += [r for p in held_out for r in load_runs(p)]
    gpu = fit_runs[0].cluster.gpu.name if fit_runs else "?"
    click.echo(f"calibrate: {len(fit_runs)} runs to fit, {len(held)} held out; {gpu}, "
               f"stack {', '.join(dict.fromkeys(r.stack for r in fit_runs))}; "
               f"fitting {', '.join(names)}")

    def log(msg: str) -> None:
        click.echo(msg.split(" {", 1)[0])  # the round's summary, without the point

    cal = calibrate(fit_runs, held, free=names, rounds=rounds, log=log)
    profile = cal.profile(_command(runs, held_out, run_dirs, cluster, every, free, rounds, out))
    atomic_write_text(out, profile.to_json())
    _report(cal, out, time.perf_counter() - t0)


command = calibrate_command
