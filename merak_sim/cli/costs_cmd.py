"""``merak-sim costs``: per-layer and per-stage time and memory breakdown of one config.

Example (the paper's 8.3B GPT on the assumed 16 x 4 RTX 3090 cluster)::

    merak-sim costs --model gpt-8.3b --cluster paper-3090 --tp 4 --micro-batch-size 2
    merak-sim costs --model gpt-8.3b --cluster paper-3090 --tp 4 --pp 4 --dp 4 \\
        --micro-batch-size 2 --recompute full --json
    merak-sim costs --model traces/cpu-gpt-tiny.json ... --trace traces/cpu-gpt-tiny.json
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.attention_choice import attention_label
from merak_sim.costs.comm import PIPELINE_SENDS
from merak_sim.hardware import get_cluster
from merak_sim.layout import DEFAULT_ORDER
from merak_sim.memory import peak_memory
from merak_sim.model import ModelSpec, get_model
from merak_sim.sim.from_config import schedule_for

from .options import (
    POSITIVE,
    AliasOption,
    check_work,
    check_writable,
    emit_json,
    json_options,
)
from .profile_option import load_profile, profile_option
from .vocab import config_from_options, config_options

MiB = 2**20
GiB = 2**30


def _model_arg(text: str) -> ModelSpec:
    if text.endswith(".json"):
        # A trace file also names its model: accept it as a model description.
        try:
            d = json.loads(open(text, encoding="utf-8").read())
        except (OSError, json.JSONDecodeError):
            return get_model(text)
        if isinstance(d, dict) and str(d.get("format", "")).startswith("merak-trace/"):
            return ModelSpec.from_json(d["model"])
    return get_model(text)


def _short(source: str) -> str:
    if source.startswith("trace ("):
        how = source[len("trace ("):].split()[0]
        return f"trace:{how}"
    return source


def _ms(x: float) -> str:
    return f"{x * 1e3:9.3f}"


def _table(headers: list[str], rows: list[list[str]], width: int = 10**6) -> str:
    """Right-aligned columns; when the line would pass ``width``, the columns are
    split into blocks that fit, each repeating the first (key) column."""
    w = [max(len(h), *(len(r[i].strip()) for r in rows)) for i, h in enumerate(headers)]
    blocks, cur, used = [], [], w[0]
    for i in range(1, len(headers)):
        if cur and used + 2 + w[i] > width:
            blocks.append(cur)
            cur, used = [], w[0]
        cur.append(i)
        used += 2 + w[i]
    blocks.append(cur)
    out = []
    for cols in blocks:
        idx = [0, *cols]
        line = "  ".join(headers[i].rjust(w[i]) for i in idx)
        if out:
            out.append("")
        out += [line, "-" * len(line)]
        out += ["  ".join(r[i].strip().rjust(w[i]) for i in idx) for r in rows]
    return "\n".join(out)


def _wrapped(text: str, width: int) -> str:
    import textwrap

    return textwrap.fill(text, width=width, subsequent_indent="#   " if
                         text.startswith("#") else "  ", break_on_hyphens=False)


@click.command("costs")
@click.option("--model", "--model-json", "model_name", cls=AliasOption, required=True,
              help="Model preset name or JSON file (a trace file names its model too).")
@click.option("--cluster", "--cluster-json", "cluster_name", cls=AliasOption,
              required=True, help="Cluster preset or JSON file.")
@click.option("--nodes", type=POSITIVE, default=None, help="Nodes (default: the preset's).")
@config_options("degrees", "batch", "schedule", "memory",
                defaults=dict(dp=1, tp=1, pp=1, cp=1, virtual_stages=1, order=DEFAULT_ORDER,
                              micro_batch_size=1, schedule="1f1b", recompute="none", zero=0,
                              zero_group=0))
@config_options("overlap", defaults=dict(tp_overlap="none", tp_overlap_parts=2,
                                         attention="auto"), skip=("overlap_param_gather",))
@click.option("--pipeline-send", type=click.Choice(PIPELINE_SENDS), default="full",
              show_default=True, help="How activations cross a pipeline boundary (see "
                                      "simulate --pipeline-send).")
@profile_option
@config_options("precision", defaults=dict(dtype="bf16"))
@click.option("--partition", "partition_method",
              type=click.Choice(["uniform", "parameters", "time"]), default="uniform",
              show_default=True, help="Layers -> stages.")
@click.option("--trace", "traces", multiple=True, type=click.Path(dir_okay=False),
              help="merak-trace/1 file(s): trace-driven costs (analytic where absent).")
@json_options
def costs_command(model_name, cluster_name, nodes, pipeline_send, partition_method, traces,
                  as_json, json_out, profile_file, **given):
    """Print the per-layer time and memory breakdown (and per-stage totals with peak
    memory from the schedule) that the cost model charges for one configuration."""
    check_writable(("--json-out", json_out))
    model = _model_arg(model_name)
    cluster = get_cluster(cluster_name, nodes=nodes)
    if given["global_batch_size"] is None:  # 2 * pp micro-batches
        given["global_batch_size"] = given["dp"] * given["micro_batch_size"] * 2 * given["pp"]
    config = config_from_options(given)
    check_work(config.pp * config.virtual_stages * config.num_microbatches,
               "pp x virtual stages x micro-batches", "use a smaller global batch size")
    cm = _cost_model(profile_file, cluster, partition_method, pipeline_send, traces)
    table = cm.cost_table(model, cluster, config)
    layers = cm.layer_breakdown(model, cluster, config)
    peaks = peak_memory(table, config, schedule_for(config))
    if as_json or json_out:
        emit_json(_as_json(model, cluster, config, layers, table, peaks), as_json, json_out,
                  indent=1, default=str)
    if not as_json:
        _print_costs(model, cluster, config, layers, table, peaks, given["recompute"])


def _cost_model(profile_file, cluster, partition_method, pipeline_send, traces):
    """The analytic model (with a calibrate profile's efficiency), or the trace-driven
    one on top of it when traces are given."""
    profile = load_profile(profile_file)
    eff, kernels = (None, None) if profile is None else profile.efficiency_for(cluster.gpu.name)
    analytic = AnalyticCostModel(efficiency=eff, kernels=kernels,
                                 partition_method=partition_method,
                                 pipeline_send=pipeline_send)
    if not traces:
        return analytic
    from merak_sim.costs.trace_model import TraceCostModel

    return TraceCostModel(list(traces), fallback=analytic)


def _as_json(model, cluster, config, layers, table, peaks) -> dict:
    """The --json object: inputs, per-layer and per-stage costs, per-rank peaks."""
    return {
        "model": model.to_dict(), "cluster": cluster.to_dict(),
        "config": config.to_dict(), "layers": layers,
        "stages": [{**asdict(s), "peak_memory_bytes": p.total_bytes,
                    "peak_activation_bytes": p.activation_peak_bytes,
                    "peak_in_flight": p.peak_in_flight}
                   for s, p in zip(table.stages, list(peaks) * config.virtual_stages,
                                   strict=True)],
        "ranks": [asdict(p) | {"total_bytes": p.total_bytes} for p in peaks],
        "memory_capacity_bytes": table.memory_capacity_bytes,
        "peak_flops": table.peak_flops, "notes": list(table.notes),
        "meta": {k: (list(v) if isinstance(v, tuple) else v) for k, v in table.meta.items()},
    }


def _print_costs(model, cluster, config, layers, table, peaks, recompute: str) -> None:
    """The readable tables, wrapped to the terminal's width ($COLUMNS or 80 off one)."""
    from rich.console import Console

    width = Console().width

    def echo(text: str = "") -> None:
        click.echo("\n".join(_wrapped(line, width) if len(line) > width else line
                              for line in text.split("\n")))

    c, g, dtype = config, cluster.gpu, config.dtype
    echo(f"# model {model.name}: {model.family} L={model.layers} h={model.hidden} "
         f"heads={model.heads} kv={model.kv_heads} ffn={model.ffn_hidden} "
         f"s={model.seq_len} V={model.vocab}, {model.total_params() / 1e9:.3f}B params")
    echo(f"# cluster {cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} {g.name} "
         f"({g.memory_bytes / 1e9:.0f} GB, {g.peak(dtype) / 1e12:.3g} TFLOP/s {dtype}); "
         f"intra {cluster.intra.bandwidth_Bps / 1e9:.1f} GB/s, inter "
         f"{cluster.inter.bandwidth_Bps / 1e9:.1f} GB/s per node")
    echo(f"# config dp={c.dp} tp={c.tp} pp={c.pp} v={c.virtual_stages} "
         f"mbs={c.micro_batch_size} micro-batches={c.num_microbatches} "
         f"schedule={c.schedule} recompute={recompute} sp={c.sequence_parallel} "
         f"tp_overlap={c.tp_overlap} zero={c.zero} cp={c.cp} "
         f"attention={attention_label(c, g.name)} dtype={dtype}; cost model: "
         f"{table.meta.get('source')}")
    echo("")
    echo(_layer_table(layers, width))
    echo("")
    echo(_stage_table(table, peaks, c.pp, width))
    if any(s.fsdp_comm_fwd_s or s.fsdp_comm_bwd_s for s in table.stages):
        echo(_fsdp_table(table, width))
    cap = table.memory_capacity_bytes
    worst = max(p.total_bytes for p in peaks)
    echo(f"\npeak memory (state + activations in flight per the {c.schedule} schedule): "
         f"{worst / GiB:.2f} GiB of {cap / GiB:.2f} GiB"
         + ("  ** exceeds GPU memory **" if worst > cap else ""))
    for n in table.notes:
        echo(f"note: {n}")


def _layer_table(layers: dict, width: int) -> str:
    hdr = ["kind", "fwd", "bwd-in", "bwd-w", "recomp", "tp-fwd", "tp-bwd", "TFLOP/s",
           "act MiB", "ckpt MiB", "params M", "source"]
    rows = [[kind, _ms(r["forward_s"]), _ms(r["backward_input_s"]),
             _ms(r["backward_weight_s"]), _ms(r["recompute_s"]), _ms(r["tp_comm_fwd_s"]),
             _ms(r["tp_comm_bwd_s"]), f"{r['achieved_flops'] / 1e12:.1f}",
             f"{r['activation_bytes'] / MiB:.1f}", f"{r['checkpoint_bytes'] / MiB:.1f}",
             f"{r['params'] / 1e6:.1f}", _short(str(r["source"]))]
            for kind, r in layers.items()]
    return ("Per layer, one micro-batch, one GPU (ms; MiB; tp-fwd/tp-bwd = exposed TP "
            "communication; TFLOP/s = achieved by the compute):\n" + _table(hdr, rows, width))


def _stage_table(table, peaks, pp: int, width: int) -> str:
    hdr = ["stage", "layers", "F", "B", "R", "send", "grad-AR", "opt", "act/mb", "ckpt/mb",
           "state", "peak", "in-flight"]
    rows = []
    for i, s in enumerate(table.stages):
        p = peaks[i % pp]
        rows.append([str(i), str(s.layers), _ms(s.forward_s), _ms(s.backward_s),
                     _ms(s.recompute_s), _ms(s.send_activation_s), _ms(s.grad_allreduce_s),
                     _ms(s.optimizer_s), f"{s.activation_bytes / GiB:.2f}",
                     f"{s.checkpoint_bytes / GiB:.2f}", f"{s.state_bytes / GiB:.2f}",
                     f"{p.total_bytes / GiB:.2f}" if i < pp else "(rank)",
                     str(p.peak_in_flight)])
    return ("Per model stage, one micro-batch (ms), memory per GPU (GiB):\n"
            + _table(hdr, rows, width))


def _fsdp_table(table, width: int) -> str:
    hdr = ["stage", "fwd all", "fwd exposed", "bwd all", "bwd exposed", "GiB sent"]
    rows = [[str(i), _ms(s.fsdp_comm_fwd_s), _ms(s.fsdp_exposed_fwd_s), _ms(s.fsdp_comm_bwd_s),
             _ms(s.fsdp_exposed_bwd_s), f"{(s.fsdp_bytes_fwd + s.fsdp_bytes_bwd) / GiB:.2f}"]
            for i, s in enumerate(table.stages)]
    return ("\nZeRO-3 all-gathers and reduce-scatters per model stage, one micro-batch "
            "(ms; priced alone, and the exposed part, inside F and B above; GiB sent per "
            "GPU):\n" + _table(hdr, rows, width))


command = costs_command
