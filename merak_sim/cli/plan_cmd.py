"""``merak-sim plan``: the fastest dp x tp x pp configuration that fits, as a plan file.

Without ``--json`` a rich table of the top candidates (and one example of each way a
candidate lost), the search counts and the assumptions; with ``--json`` exactly one
JSON object on stdout: ``{"plan": <merak-plan/1>, "counts": {...}, "seconds": s,
"top": [rows...], "notes": [...]}``. The best plan is always written to ``--out``
(atomically), ready for ``merak-sim dispatch``. A model that fits nowhere is a one-line
error naming the smallest memory shortfall and the closest candidate (exit 2).
"""

from __future__ import annotations

import json
import math

import click

from merak_sim.schedule import SCHEDULES

_SYSTEM_CHOICES = ["full", "megatron", "deepspeed", "merak"]


def _csv_ints(value: str | None, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.UsageError(f"{what} takes comma-separated integers, got {value!r}") \
            from None
    if not out or any(x < 1 for x in out):
        raise click.UsageError(f"{what} takes positive integers, got {value!r}")
    return out


def _clean(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    if hasattr(v, "item"):
        return v.item()
    return v


@click.command("plan")
@click.option("--model", "model", required=True, help="Model preset name or JSON file.")
@click.option("--cluster", "cluster", required=True, help="Cluster preset name or JSON file.")
@click.option("--nodes", type=int, default=None, help="Nodes of the cluster.")
@click.option("--global-batch-size", type=int, required=True, help="Samples per iteration.")
@click.option("--top", "top_k", type=int, default=3, show_default=True,
              help="Candidates confirmed with the SimPy engine (and rows shown x3).")
@click.option("--space", "system", type=click.Choice(_SYSTEM_CHOICES), default="full",
              show_default=True,
              help="Search everything, or restrict to a system of the paper reproduction.")
@click.option("--tp", "tp", default=None, help="Allowed tp degrees, e.g. 1,2,4.")
@click.option("--pp", "pp", default=None, help="Allowed pp degrees, e.g. 4,8.")
@click.option("--micro-batch-sizes", default=None, help="Allowed micro-batch sizes.")
@click.option("--schedules", default=None,
              help=f"Comma-separated schedules ({', '.join(SCHEDULES)}).")
@click.option("--memory-margin", type=float, default=0.0, show_default=True,
              help="Fraction of GPU memory kept free.")
@click.option("--no-confirm", is_flag=True, help="Rank by the fast evaluator only.")
@click.option("--executable", is_flag=True,
              help="Only options merak-exec runs today (what dispatch accepts).")
@click.option("--out", type=click.Path(dir_okay=False), default="plan.json",
              show_default=True, help="Where to write the best plan (merak-plan/1).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every candidate (with why it lost) as CSV.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan_command(model, cluster, nodes, global_batch_size, top_k, system, tp, pp,
                 micro_batch_sizes, schedules, memory_margin, no_confirm, executable, out,
                 csv_path, as_json):
    """Search parallel configurations; print the ranking and write the best plan."""
    import sys

    from merak_sim.io import atomic_write_text
    from merak_sim.planner import SYSTEMS, SearchSpace, search

    space = SearchSpace() if system == "full" else SYSTEMS[system]
    changes = {}
    if tp is not None:
        changes["tp"] = _csv_ints(tp, "--tp")
    if pp is not None:
        changes["pp"] = _csv_ints(pp, "--pp")
    if micro_batch_sizes is not None:
        changes["micro_batch_sizes"] = _csv_ints(micro_batch_sizes, "--micro-batch-sizes")
    if schedules is not None:
        names = tuple(s.strip() for s in schedules.split(",") if s.strip())
        changes["schedules"] = names
    if changes:
        space = space.with_(**changes)
    if executable:
        from merak_sim.executable import executable_space
        from merak_sim.resolve import resolve_model

        space = executable_space(space, resolve_model(model))
    res = search(model, cluster, global_batch_size, nodes=nodes, space=space, top_k=top_k,
                 confirm=not no_confirm, progress=not as_json and sys.stderr.isatty())
    res.save(out)
    if csv_path:
        atomic_write_text(csv_path, res.table.to_csv(index=False))
    if as_json:
        top = [{k: _clean(v) for k, v in row.items()}
               for row in res.top(max(top_k, 10)).to_dict(orient="records")]
        click.echo(json.dumps({"plan": res.best.to_dict(), "plan_file": str(out),
                               "counts": res.counts, "seconds": res.seconds, "top": top,
                               "notes": list(res.notes)}))
        return
    from rich.console import Console

    # Wide enough for the table when stdout is a file or a pipe.
    con = Console(width=None if sys.stdout.isatty() else 160)
    con.print(res.rich_table(max(top_k, 10)))
    con.print(res.counts_line())
    b = res.best_result
    cfg = res.best_config
    con.print(f"[bold]best[/bold]: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} "
              f"v={cfg.virtual_stages} mbs={cfg.micro_batch_size} {cfg.schedule} "
              f"recompute={cfg.recompute}"
              + (f" {list(cfg.recompute_fractions)}" if cfg.recompute_fractions else "")
              + f" sp={cfg.sequence_parallel} tp-overlap={cfg.tp_overlap} zero={cfg.zero}: "
              f"{b.iteration_time_s:.3f} s/iteration, "
              f"{b.throughput_samples_per_s:.2f} samples/s, MFU {b.mfu:.1%}, peak "
              f"{max(b.peak_memory_bytes) / 2**30:.1f} GiB ({b.engine})")
    for n in res.notes:
        con.print(f"assumption: {n}", markup=False)
    con.print(f"wrote plan: {out}", markup=False)
    if csv_path:
        con.print(f"wrote candidates: {csv_path}", markup=False)


command = plan_command
