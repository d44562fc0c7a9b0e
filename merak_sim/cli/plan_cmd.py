"""``merak-sim plan``: the fastest dp x tp x pp configuration that fits, as a plan file.

Without ``--json`` a rich table of the top candidates (and one example of each way a
candidate lost), the search counts and the assumptions; with ``--json`` exactly one
JSON object on stdout: ``{"plan": <merak-plan/1>, "counts": {...}, "seconds": s,
"top": [rows...], "notes": [...]}``. The best plan is always written to ``--out``
(atomically), ready for ``merak-sim dispatch``. A model that fits nowhere is a one-line
error naming the smallest memory shortfall and the closest candidate (exit 2).
"""

from __future__ import annotations

import math
import textwrap

import click

from merak_sim.config import DTYPES
from merak_sim.costs.comm import PIPELINE_SENDS
from merak_sim.schedule import SCHEDULES

from .options import (
    ORDER_HELP,
    PIPELINE_SEND_HELP,
    POSITIVE,
    AliasOption,
    check_writable,
    emit_json,
    json_options,
    stacked,
)
from .profile_option import load_profile, profile_option

_SYSTEM_CHOICES = ["full", "megatron", "deepspeed", "merak"]


def _csv_ints(value: str | None, what: str, zero_ok: bool = False) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.UsageError(f"{what} takes comma-separated integers, got {value!r}") \
            from None
    if not out or any(x < (0 if zero_ok else 1) for x in out):
        raise click.UsageError(f"{what} takes {'non-negative' if zero_ok else 'positive'} "
                               f"integers, got {value!r}")
    return out


def _clean(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    if hasattr(v, "item"):
        return v.item()
    return v


def _print_plan(res, top_k: int, memory_margin: float, written) -> None:
    """The readable answer: the ranked table, the counts, the best plan, why it won
    (one short line per knob), the assumptions (the memory kept free first) and the
    ``(what, path)`` files written."""
    from rich.console import Console

    from merak_sim.costs.attention_choice import attention_label
    from merak_sim.runtime_memory import reserve_note

    # The terminal's width; off a terminal $COLUMNS or 80 (the table folds to fit).
    con = Console()
    con.print(res.rich_table(max(top_k, 10), width=con.width))
    con.print(res.counts_line())
    b = res.best_result
    cfg = res.best_config
    con.print(f"[bold]best[/bold]: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} "
              f"v={cfg.virtual_stages} mbs={cfg.micro_batch_size} {cfg.schedule} "
              f"recompute={cfg.recompute}"
              + (f" {list(cfg.recompute_fractions)}" if cfg.recompute_fractions else "")
              + f" sp={cfg.sequence_parallel} tp-overlap={cfg.tp_overlap} zero={cfg.zero}"
              + (f" hsdp={cfg.zero_group}" if cfg.zero_group else "")
              + (f" cp={cfg.cp}" if cfg.cp > 1 else "")
              + f" attention={attention_label(cfg, res.cluster.gpu.name)}"
              f" overlap-param-gather={cfg.overlap_param_gather}"
              f" dtype={cfg.dtype}: "
              f"{b.iteration_time_s:.3f} s/iteration, "
              f"{b.throughput_samples_per_s:.2f} samples/s, MFU {b.mfu:.1%}, peak "
              f"{max(b.peak_memory_bytes) / 2**30:.1f} GiB ({b.engine})")
    con.print("why this plan (the closest alternative per knob):", markup=False)
    for line in res.explanation():
        con.print(textwrap.fill(line, width=max(40, con.width), initial_indent="  - ",
                                subsequent_indent="    "), markup=False, soft_wrap=True)
    con.print(f"assumption: {reserve_note(res.cluster.gpu, memory_margin)}", markup=False)
    for n in res.notes:
        con.print(f"assumption: {n}", markup=False)
    for what, path in written:
        if path:
            con.print(f"wrote {what}: {path}", markup=False)



#: the search space: allowed values of each configuration field.
_SPACE_OPTS = stacked(
    click.option("--tp", "tp", default=None, help="Allowed tp degrees, e.g. 1,2,4."),
    click.option("--pp", "pp", default=None, help="Allowed pp degrees, e.g. 4,8."),
    click.option("--cp", "cp", default=None, help="Allowed context-parallel degrees, e.g. 1,2,4."),
    click.option("--zero", "zero", default=None, help="Allowed ZeRO stages, e.g. 0,1,2,3."),
    click.option("--zero-groups", "--hsdp", "zero_groups", default=None,
                 help="Allowed HSDP shard-group sizes (0: shard over all), e.g. 0,8."),
    click.option("--attention", "attention", default=None,
                 help="Allowed attention kernels, e.g. flash or flash,unfused (default auto: "
                      "flash on GPU presets; the --space systems: unfused)."),
    click.option("--overlap-param-gather", type=click.Choice(["off", "on", "both"]),
                 default=None, help="Overlap of the DP gradient reduction and the ZeRO 1/2 "
                                    "parameter all-gather with compute."),
    click.option("--dtype", "dtype", type=click.Choice(list(DTYPES)),
                 default=None, help="Training precision (default bf16)."),
    click.option("--order", default=None, help=ORDER_HELP + " Every candidate uses it."),
    click.option("--pipeline-send", type=click.Choice(PIPELINE_SENDS), default=None,
                 help=PIPELINE_SEND_HELP),
    profile_option,
    click.option("--micro-batch-sizes", "--mbs", "micro_batch_sizes", cls=AliasOption,
                 default=None, help="Allowed micro-batch sizes."),
    click.option("--schedules", default=None,
                 help=f"Comma-separated schedules ({', '.join(SCHEDULES)})."),
)


#: plan's memory margin, ranking and outputs.
_OUTPUT_OPTS = stacked(
    click.option("--memory-margin", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0,
                 show_default=True,
                 help="Fraction of GPU memory kept free beyond the reserve every plan keeps "
                      "(CUDA context and NCCL buffers, 2.28 GiB on a GPU without a measurement: "
                      "merak_sim.runtime_memory), in [0, 1); 0.15 without expandable segments."),
    click.option("--no-confirm", is_flag=True, help="Rank by the fast evaluator only."),
    click.option("--executable", is_flag=True,
                 help="Only options merak-exec runs today (what dispatch accepts)."),
    click.option("--out", type=click.Path(dir_okay=False), default="plan.json",
                 show_default=True, help="Where to write the best plan (merak-plan/1)."),
    click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
                 help="Also write every candidate (with why it lost) as CSV."),
    json_options,
)


#: how the search ranks: candidates confirmed, and the system it stands for.
_SEARCH_OPTS = stacked(
    click.option("--top", "top_k", type=POSITIVE, default=3, show_default=True,
                 help="Candidates confirmed with the SimPy engine (and rows shown x3)."),
    click.option("--space", "system", type=click.Choice(_SYSTEM_CHOICES), default="full",
                 show_default=True,
                 help="Search everything, or restrict to a system of the paper reproduction."),
)


@click.command("plan")
@click.option("--model", "--model-json", "model", cls=AliasOption, required=True,
              help="Model preset name or JSON file.")
@click.option("--cluster", "--cluster-json", "cluster", cls=AliasOption, required=True,
              help="Cluster preset name or JSON file.")
@click.option("--nodes", type=POSITIVE, default=None, help="Nodes of the cluster.")
@click.option("--global-batch-size", type=POSITIVE, required=True,
              help="Samples per iteration.")
@_SEARCH_OPTS
@_SPACE_OPTS
@_OUTPUT_OPTS
def plan_command(model, cluster, nodes, global_batch_size, top_k, system, tp, pp,
                 cp, zero, zero_groups, attention, overlap_param_gather, dtype, order,
                 pipeline_send, micro_batch_sizes, schedules, memory_margin, no_confirm,
                 executable, out, csv_path, as_json, json_out, profile_file):
    """Search parallel configurations; print the ranking and write the best plan."""
    import sys

    from merak_sim.costs.calibrated import calibrated_cost_model
    from merak_sim.io import atomic_write_text
    from merak_sim.planner import SYSTEMS, SearchSpace, search

    check_writable(("--out", out), ("--csv", csv_path), ("--json-out", json_out))
    space = SearchSpace() if system == "full" else SYSTEMS[system]
    changes = {}
    if tp is not None:
        changes["tp"] = _csv_ints(tp, "--tp")
    if pp is not None:
        changes["pp"] = _csv_ints(pp, "--pp")
    if cp is not None:
        changes["cp"] = _csv_ints(cp, "--cp")
    if zero is not None:
        changes["zero"] = _csv_ints(zero, "--zero", zero_ok=True)
    if zero_groups is not None:
        changes["zero_groups"] = _csv_ints(zero_groups, "--zero-groups", zero_ok=True)
    if attention is not None:
        changes["attention"] = tuple(a.strip() for a in attention.split(",") if a.strip())
    if overlap_param_gather is not None:
        changes["overlap_param_gather"] = {"off": (False,), "on": (True,),
                                           "both": (False, True)}[overlap_param_gather]
    if dtype is not None:
        changes["dtype"] = dtype
    if order is not None:
        changes["order"] = order
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
    profile = load_profile(profile_file)
    cost_model = (None if pipeline_send is None and profile is None
                  else calibrated_cost_model(pipeline_send, profile))
    res = search(model, cluster, global_batch_size, nodes=nodes, space=space, top_k=top_k,
                 cost_model=cost_model, confirm=not no_confirm, memory_margin=memory_margin,
                 progress="bar" if sys.stderr.isatty() else "lines")
    res.save(out)
    if csv_path:
        atomic_write_text(csv_path, res.table.to_csv(index=False))
    if as_json or json_out:
        from merak_sim.runtime_memory import reserve_bytes

        top = [{k: _clean(v) for k, v in row.items()}
               for row in res.top(max(top_k, 10)).to_dict(orient="records")]
        emit_json({"plan": res.best.to_dict(), "plan_file": str(out),
                   "counts": res.counts, "seconds": res.seconds, "top": top,
                   "notes": list(res.notes), "explanation": res.explanation(),
                   "memory_reserve_bytes": reserve_bytes(res.cluster.gpu.name),
                   "memory_margin": memory_margin},
                  as_json, json_out)
    if as_json:
        return
    _print_plan(res, top_k, memory_margin, (("plan", out), ("candidates", csv_path),
                                             ("JSON", json_out)))

command = plan_command
