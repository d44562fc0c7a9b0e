"""``merak-sim simulate``: one configuration through the discrete-event simulator.

A stable contract for scripts: without ``--json`` a readable summary table; with
``--json`` exactly one JSON object on stdout (keys listed in
:meth:`merak_sim.sim.result.SimResult.to_dict`). Bad input is a one-line error with
exit status 2; a configuration that does not fit in memory is a result
(``fits_in_memory: false`` and the overflow), exit status 0.
"""

from __future__ import annotations

import click

from merak_sim.costs.comm import PIPELINE_SENDS
from merak_sim.progress import TEARDOWN_AFTER, exit_without_teardown

from .options import (
    PIPELINE_SEND_HELP,
    POSITIVE,
    AliasOption,
    check_work,
    check_writable,
    emit_json,
    json_options,
    stacked,
)
from .profile_option import load_profile, profile_option
from .vocab import CONFIG_FLAGS, config_from_options, config_options, refuse_plan_clash

#: what a run must give when it has no plan (the other fields have defaults)
_REQUIRED = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "schedule",
             "recompute")


def _from_plan(plan_file: str):
    """(model, cluster, ParallelConfig) of a plan file; a configuration option given as
    well is refused (:func:`~merak_sim.cli.vocab.refuse_plan_clash`)."""
    from merak_sim.plan import Plan

    refuse_plan_clash(click.get_current_context())
    plan = Plan.load(plan_file)
    return plan.model, plan.cluster, plan.parallel


def _config(given: dict):
    """The ParallelConfig of the options (every field in :data:`_REQUIRED` given)."""
    missing = [CONFIG_FLAGS[k].flags[0] for k in _REQUIRED if given.get(k) is None]
    if missing:
        raise click.UsageError(f"missing option(s) {', '.join(missing)} (or give --plan "
                               "FILE)")
    return config_from_options(given)


def _what_ifs(slow_gpu, degrade_link, cfg, cluster, nodes, mode):
    """The checked --slow-gpu / --degrade-link values (:mod:`merak_sim.whatif`)."""
    from merak_sim.resolve import resolve_cluster
    from merak_sim.whatif import WhatIfError, parse_what_ifs

    if not (slow_gpu or degrade_link):
        return parse_what_ifs((), (), world_size=1, gpus_per_node=1, mode=mode)
    try:
        return parse_what_ifs(slow_gpu, degrade_link, world_size=cfg.world_size,
                              gpus_per_node=resolve_cluster(cluster, nodes).gpus_per_node,
                              mode=mode)
    except WhatIfError as e:
        raise click.UsageError(str(e)) from None


def _cost_model(pipeline_send, profile_file, trace_file):
    """The cost model the options ask for: None (the calibrated default), the calibrated
    model with another pipeline send or a calibrate profile, or the trace-driven one."""
    from merak_sim.costs.calibrated import calibrated_cost_model

    profile = load_profile(profile_file)
    if profile is not None and trace_file:
        raise click.UsageError("--profile prices from the analytic model, --trace from a "
                               "profiled trace: give one of them")
    if not trace_file:
        return (None if pipeline_send is None and profile is None
                else calibrated_cost_model(pipeline_send, profile))
    try:
        from merak_sim.costs.trace_model import TraceCostModel
    except ImportError:
        raise click.UsageError("--trace needs the trace-driven cost model "
                               "(merak_sim.costs.trace_model), not available in this "
                               "build") from None
    from merak_sim.costs.analytic import AnalyticCostModel

    return TraceCostModel(trace_file, fallback=None if pipeline_send is None
                          else AnalyticCostModel(pipeline_send=pipeline_send))


def _zero3_table(cfg, model, cluster, nodes, cost_model):
    """The cost table of a ZeRO-3 run, priced here so its all-gathers and
    reduce-scatters can be reported on their own lines (:mod:`merak_sim.zero_comm`);
    None below ZeRO 3 (the simulator prices its own)."""
    if cfg.zero != 3:
        return None
    from merak_sim.costs.calibrated import CalibratedCostModel
    from merak_sim.resolve import resolve_cluster, resolve_model

    cm = cost_model if cost_model is not None else CalibratedCostModel()
    return cm.cost_table(resolve_model(model), resolve_cluster(cluster, nodes), cfg)


def _print_summary(res, zc, cfg, cluster, written) -> None:
    """The readable summary (ZeRO-3 communication in a column of its own), the kernel
    "auto" resolved to and the memory kept free (as costs and plan print them), and
    the ``(what, path)`` files written."""
    from merak_sim.costs.attention_choice import attention_label
    from merak_sim.resolve import resolve_cluster
    from merak_sim.runtime_memory import reserve_note
    from merak_sim.zero_comm import summary_with

    click.echo(res.summary() if zc is None else summary_with(res, zc))
    gpu = resolve_cluster(cluster).gpu
    click.echo(f"note: attention={attention_label(cfg, gpu.name)}")
    click.echo(f"note: {reserve_note(gpu)}")
    for what, path in written:
        if path:
            click.echo(f"wrote {what}: {path}")


def _write_trace(res, table, zc, path) -> None:
    """The Chrome trace, with a ZeRO-3 track when the run has one."""
    if zc is None:
        res.write_chrome_trace(path)
        return
    from merak_sim import timeline
    from merak_sim.zero_comm import zero_events

    ev = res.events()
    timeline.write_chrome_trace(
        timeline.event_rows(ev) + zero_events(ev, res, table), path,
        {"iteration_time_s": res.iteration_time_s, "mode": res.mode, "engine": res.engine})


_SHRINK = ("use a smaller global batch size (the iteration time scales linearly with the "
           "micro-batches once the pipeline is full)")


def _check_bounds(cfg, mode: str, engine: str) -> str:
    """Refuse a run beyond its engine's work bound (:mod:`merak_sim.progress`) in one
    line naming an engine or mode that can do it; else the progress mode for the run
    ("off" where it ends within seconds)."""
    import sys

    from merak_sim.progress import EVALUATOR_BOUND, LINE_AFTER_S, SIMPY_BOUND

    one = cfg.pp * cfg.virtual_stages * cfg.num_microbatches
    what = "pp x virtual stages x micro-batches"
    if engine == "evaluator":
        check_work(one, what, _SHRINK, EVALUATOR_BOUND)
        return "off"
    if mode == "full":
        passes, what = one * cfg.dp * cfg.tp, what + " x dp x tp (full mode)"
        alt = ("--mode representative (one pipeline, the replicas folded by symmetry)"
               if SIMPY_BOUND.admits(one) else
               "--mode representative --engine evaluator" if EVALUATOR_BOUND.admits(one)
               else "")
    else:
        # Beyond every engine: name the furthest one's limit.
        check_work(one, what, _SHRINK, EVALUATOR_BOUND)
        passes, alt = one, None
    check_work(passes, what, _SHRINK, SIMPY_BOUND, alt)
    if passes * SIMPY_BOUND.s_per_pass < LINE_AFTER_S / 2:
        return "off"
    return "bar" if sys.stderr.isatty() else "lines"


#: simulate's engine, contention and what-if options.
_ENGINE_OPTS = stacked(
    click.option("--mode", type=click.Choice(["representative", "full"]),
                 default="representative", show_default=True),
    click.option("--engine", type=click.Choice(["simpy", "evaluator"]), default="simpy",
                 show_default=True, help="Discrete events, or the exact contention-free "
                                         "critical path."),
    click.option("--contention/--no-contention", default=None,
                 help="Share link bandwidth between concurrent transfers (default: on for "
                      "simpy)."),
    click.option("--overlap-dp", is_flag=True,
                 help="Bucketed gradient reduction overlapped with the last backwards."),
    click.option("--sub-cluster", is_flag=True,
                 help="Allow dp*tp*pp below the cluster's GPU count."),
    click.option("--slow-gpu", multiple=True, metavar="RANK:FACTOR",
                 help="Full mode: GPU RANK computes FACTOR times slower (repeatable, each "
                      "GPU once)."),
    click.option("--degrade-link", multiple=True, metavar="LINK:FACTOR",
                 help="Full mode: scale a link's capacity, e.g. node0.nic.out:0.5 "
                      "(gpu<R>.out|in, node<N>.nic.out|in; repeatable, each link once)."),
)


#: simulate's outputs.
_OUTPUT_OPTS = stacked(
    json_options,
    click.option("--chrome-trace", type=click.Path(dir_okay=False), default=None,
                 help="Write a Chrome trace (open in Perfetto)."),
    click.option("--gantt", "--plot", "plot", cls=AliasOption, type=click.Path(dir_okay=False),
                 default=None,
                 help="Write a Gantt chart (and FILE-memory.png with memory over time)."),
)


#: simulate's pricing: pipeline sends, a cost profile or trace, the precision.
_COST_OPTS = stacked(
    click.option("--pipeline-send", type=click.Choice(PIPELINE_SENDS), default=None,
                 help=PIPELINE_SEND_HELP),
    profile_option,
    config_options("precision", defaults=dict(dtype="bf16")),
    click.option("--trace", "trace_file", type=click.Path(dir_okay=False), default=None,
                 help="Profiled trace (merak-trace/1) for trace-driven costs."),
)


@click.command("simulate")
@click.option("--model", "--model-json", "model", cls=AliasOption, default=None,
              help="Model preset name or JSON file.")
@click.option("--cluster", "--cluster-json", "cluster", cls=AliasOption, default=None,
              help="Cluster preset name or JSON file.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Re-simulate a merak-plan/1 file (its model, cluster and "
                   "configuration).")
@click.option("--nodes", type=POSITIVE, default=None, help="Nodes of the cluster.")
@config_options("degrees", "batch", "schedule", "memory", "overlap",
                defaults=dict(zero=0, zero_group=0, tp_overlap="none", tp_overlap_parts=2,
                              attention="auto"))
@_COST_OPTS
@_ENGINE_OPTS
@_OUTPUT_OPTS
def simulate_command(model, cluster, plan_file, nodes, pipeline_send, trace_file, mode,
                     engine, contention, overlap_dp, sub_cluster, slow_gpu, degrade_link,
                     as_json, json_out, chrome_trace, plot, profile_file, **given):
    """Simulate one training iteration: time, breakdown, FLOP/s and memory."""
    from pathlib import Path

    from merak_sim.sim import simulate

    memory_png = None
    if plot:
        p = Path(plot)
        memory_png = p.with_name(f"{p.stem}-memory{p.suffix or '.png'}")
    check_writable(("--chrome-trace", chrome_trace), ("--gantt", plot),
                   ("--gantt", memory_png and str(memory_png)), ("--json-out", json_out))
    if plan_file:
        if model is not None or cluster is not None:
            raise click.UsageError("--plan names its model and cluster: drop --model / "
                                   "--cluster")
        model, cluster, cfg = _from_plan(plan_file)
    else:
        if model is None or cluster is None:
            raise click.UsageError("give --model and --cluster (preset names or JSON "
                                   "files), or --plan FILE")
        cfg = _config(given)
    what_ifs = _what_ifs(slow_gpu, degrade_link, cfg, cluster, nodes, mode)
    progress = _check_bounds(cfg, mode, engine)
    cost_model = _cost_model(pipeline_send, profile_file, trace_file)
    table = _zero3_table(cfg, model, cluster, nodes, cost_model)
    res = simulate(
        model, cluster, cfg, nodes=nodes, cost_model=cost_model, cost_table=table,
        mode=mode, engine=engine,
        contention=contention, overlap_dp=overlap_dp, sub_cluster=sub_cluster,
        slowdown=what_ifs.slowdown or None, degraded_links=what_ifs.degraded_links or None,
        keep_trace=bool(chrome_trace or plot), progress=progress)
    zc = None
    if table is not None:
        from merak_sim.zero_comm import zero_comm

        zc = zero_comm(res, table)
    if chrome_trace:
        _write_trace(res, table, zc, chrome_trace)
    if plot:
        res.plot_gantt(plot)
        res.plot_memory(memory_png)
    emit_json({**res.to_dict(), **({"zero3_comm": zc.to_dict()} if zc else {})}, as_json,
              json_out)
    if not as_json:
        _print_summary(res, zc, cfg, cluster, (("Chrome trace", chrome_trace),
                                               ("Gantt chart", plot), ("JSON", json_out)))
    if cfg.pp * cfg.virtual_stages * cfg.num_microbatches >= TEARDOWN_AFTER:
        exit_without_teardown(0)  # everything is written; freeing the run is wasted time


command = simulate_command
