"""``merak-sim simulate``: one configuration through the discrete-event simulator.

A stable contract for scripts: without ``--json`` a readable summary table; with
``--json`` exactly one JSON object on stdout (keys listed in
:meth:`merak_sim.sim.result.SimResult.to_dict`). Bad input is a one-line error with
exit status 2; a configuration that does not fit in memory is a result
(``fits_in_memory: false`` and the overflow), exit status 0.
"""

from __future__ import annotations

import json

import click

from merak_sim.config import ATTENTIONS, DTYPES, TP_OVERLAPS
from merak_sim.schedule import SCHEDULES


def _pairs(values: tuple[str, ...], what: str, key_type=int) -> dict:
    out = {}
    for v in values:
        key, sep, factor = v.rpartition(":")
        if not sep:
            raise click.UsageError(f"{what} takes KEY:FACTOR, got {v!r}")
        try:
            out[key_type(key)] = float(factor)
        except ValueError:
            raise click.UsageError(f"{what} takes KEY:FACTOR, got {v!r}") from None
    return out


@click.command("simulate")
@click.option("--model", "model", default=None, help="Model preset name.")
@click.option("--model-json", type=click.Path(dir_okay=False), default=None,
              help="Model from a JSON file instead of a preset.")
@click.option("--cluster", "cluster", default=None, help="Cluster preset name.")
@click.option("--cluster-json", type=click.Path(dir_okay=False), default=None,
              help="Cluster from a JSON file instead of a preset.")
@click.option("--nodes", type=int, default=None, help="Nodes of the cluster.")
@click.option("--dp", type=int, required=True, help="Data-parallel degree.")
@click.option("--tp", type=int, required=True, help="Tensor-parallel degree.")
@click.option("--pp", type=int, required=True, help="Pipeline-parallel degree.")
@click.option("--virtual-stages", type=int, default=1, show_default=True,
              help="Model chunks per pipeline rank (interleaved-1f1b).")
@click.option("--micro-batch-size", type=int, required=True, help="Samples per micro-batch.")
@click.option("--global-batch-size", type=int, required=True, help="Samples per iteration.")
@click.option("--schedule", type=click.Choice(list(SCHEDULES)), required=True,
              help="Pipeline schedule.")
@click.option("--recompute", required=True,
              help="none | full | selective | stage-aware | stage-aware:C0 | "
                   "stage-aware:c0,c1,... (explicit per-stage fractions).")
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism.")
@click.option("--tp-overlap", type=click.Choice(list(TP_OVERLAPS)), default="none",
              show_default=True, help="Merak's sub-pipelined TP overlap.")
@click.option("--tp-overlap-parts", type=int, default=2, show_default=True,
              help="Parts a micro-batch is split into for sub-pipelined TP.")
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True,
              help="ZeRO stage (3 = FSDP).")
@click.option("--zero-group", "--hsdp", "zero_group", type=int, default=0, show_default=True,
              help="HSDP: shard inside groups of N data-parallel ranks, replicate across "
                   "(0: shard over all).")
@click.option("--cp", type=int, default=1, show_default=True,
              help="Context-parallel degree (ring attention).")
@click.option("--attention", type=click.Choice(list(ATTENTIONS)), default="auto",
              show_default=True, help="Attention kernel (auto: unfused on GPU presets, the "
                                      "measured profile on CPU).")
@click.option("--overlap-param-gather", is_flag=True,
              help="Overlap the DP gradient reduction and the ZeRO 1/2 parameter "
                   "all-gather with compute (implies --overlap-dp).")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True)
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False), default=None,
              help="Profiled trace (merak-trace/1) for trace-driven costs.")
@click.option("--mode", type=click.Choice(["representative", "full"]),
              default="representative", show_default=True)
@click.option("--engine", type=click.Choice(["simpy", "evaluator"]), default="simpy",
              show_default=True, help="Discrete events, or the exact contention-free "
                                      "critical path.")
@click.option("--contention/--no-contention", default=None,
              help="Share link bandwidth between concurrent transfers (default: on for "
                   "simpy).")
@click.option("--overlap-dp", is_flag=True,
              help="Bucketed gradient reduction overlapped with the last backwards.")
@click.option("--sub-cluster", is_flag=True,
              help="Allow dp*tp*pp below the cluster's GPU count.")
@click.option("--slow-gpu", multiple=True, metavar="RANK:FACTOR",
              help="Full mode: GPU RANK computes FACTOR times slower (repeatable).")
@click.option("--degrade-link", multiple=True, metavar="LINK:FACTOR",
              help="Full mode: scale a link's capacity, e.g. node0.nic.out:0.5.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--chrome-trace", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome trace (open in Perfetto).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart (and FILE-memory.png with memory over time).")
def simulate_command(model, model_json, cluster, cluster_json, nodes, dp, tp, pp,
                     virtual_stages, micro_batch_size, global_batch_size, schedule,
                     recompute, sequence_parallel, tp_overlap, tp_overlap_parts, zero,
                     zero_group, cp, attention, overlap_param_gather, dtype, trace_file, mode,
                     engine, contention, overlap_dp, sub_cluster,
                     slow_gpu, degrade_link, as_json, chrome_trace, plot):
    """Simulate one training iteration: time, breakdown, FLOP/s and memory."""
    from pathlib import Path

    from merak_sim.config import ParallelConfig
    from merak_sim.sim import simulate

    if (model is None) == (model_json is None):
        raise click.UsageError("give exactly one of --model NAME or --model-json FILE")
    if (cluster is None) == (cluster_json is None):
        raise click.UsageError("give exactly one of --cluster NAME or --cluster-json FILE")
    policy, _, arg = recompute.partition(":")
    c0, fractions = 0.75, None
    if arg:
        if policy != "stage-aware":
            raise click.UsageError(f"only stage-aware takes a value, got {recompute!r}")
        try:
            vals = tuple(float(x) for x in arg.split(","))
        except ValueError:
            raise click.UsageError(f"bad recompute fractions in {recompute!r}") from None
        if len(vals) == 1:
            c0 = vals[0]
        else:
            fractions = vals
    cfg = ParallelConfig(
        dp=dp, tp=tp, pp=pp, virtual_stages=virtual_stages,
        micro_batch_size=micro_batch_size, global_batch_size=global_batch_size,
        schedule=schedule, recompute=policy, recompute_c0=c0,
        recompute_fractions=fractions, sequence_parallel=sequence_parallel,
        tp_overlap=tp_overlap, tp_overlap_parts=tp_overlap_parts, zero=zero,
        zero_group=zero_group, cp=cp, attention=attention,
        overlap_param_gather=overlap_param_gather,
        dtype=dtype)
    cost_model = None
    if trace_file:
        try:
            from merak_sim.costs.trace_model import TraceCostModel
        except ImportError:
            raise click.UsageError("--trace needs the trace-driven cost model "
                                   "(merak_sim.costs.trace_model), not available in this "
                                   "build") from None
        cost_model = TraceCostModel(trace_file)
    res = simulate(
        model_json if model_json else model,
        cluster_json if cluster_json else cluster,
        cfg, nodes=nodes, cost_model=cost_model, mode=mode, engine=engine,
        contention=contention, overlap_dp=overlap_dp, sub_cluster=sub_cluster,
        slowdown=_pairs(slow_gpu, "--slow-gpu") or None,
        degraded_links=_pairs(degrade_link, "--degrade-link", str) or None,
        keep_trace=bool(chrome_trace or plot))
    if chrome_trace:
        res.write_chrome_trace(chrome_trace)
    if plot:
        res.plot_gantt(plot)
        p = Path(plot)
        res.plot_memory(p.with_name(f"{p.stem}-memory{p.suffix or '.png'}"))
    if as_json:
        click.echo(json.dumps(res.to_dict()))
    else:
        click.echo(res.summary())
        for what, path in (("Chrome trace", chrome_trace), ("Gantt chart", plot)):
            if path:
                click.echo(f"wrote {what}: {path}")


command = simulate_command
