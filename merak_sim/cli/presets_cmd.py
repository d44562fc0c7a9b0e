"""``merak-sim presets``: the model and cluster presets every ``--model`` and
``--cluster`` accepts, with the facts that decide a plan (shape and parameters;
GPU, memory, peak FLOP/s per precision, link bandwidths). Within 80 columns; the
sources of every figure are in ``--json``.
"""

from __future__ import annotations

import click

from .options import emit_json, json_options

GiB = float(2**30)


def _models() -> list[dict]:
    from merak_sim.model import MODEL_PRESETS

    return [{"name": k, "family": m.family, "layers": m.layers, "hidden": m.hidden,
             "heads": m.heads, "kv_heads": m.kv_heads, "seq_len": m.seq_len,
             "vocab": m.vocab, "params": m.total_params(), "source": m.source}
            for k, m in MODEL_PRESETS.items()]


def _clusters() -> list[dict]:
    from merak_sim.hardware import CLUSTER_PRESETS, get_cluster

    out = []
    for k in CLUSTER_PRESETS:
        c = get_cluster(k)
        out.append({"name": k, "gpu": c.gpu.name, "nodes": c.nodes,
                    "gpus_per_node": c.gpus_per_node, "memory_bytes": c.gpu.memory_bytes,
                    "peak_flops": dict(c.gpu.peak_flops),
                    "intra": c.intra.name, "intra_Bps": c.intra.bandwidth_Bps,
                    "inter": c.inter.name, "inter_Bps": c.inter.bandwidth_Bps,
                    "source": c.gpu.source, "notes": list(c.notes)})
    return out


def _model_lines(rows: list[dict]) -> list[str]:
    head = f"{'model':<17} {'family':<6} {'layers':>6} {'hidden':>6} {'heads':>8} " \
           f"{'seq':>5} {'vocab':>7} {'params':>8}"
    lines = [head]
    for r in rows:
        heads = str(r["heads"]) + (f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else "")
        lines.append(f"{r['name']:<17} {r['family']:<6} {r['layers']:>6} {r['hidden']:>6} "
                     f"{heads:>8} {r['seq_len']:>5} {r['vocab']:>7} "
                     f"{r['params'] / 1e9:>7.2f}B")
    return lines + ["heads: attention heads / key-value heads where they differ"]


def _cluster_lines(rows: list[dict]) -> list[str]:
    head = (f"{'cluster':<13} {'GPU':<11} {'shape':>6} {'GiB':>6} {'bf16 TF':>8} "
            f"{'fp8':>4} {'intra GB/s':>10} {'inter GB/s':>10}")
    lines = [head]
    for r in rows:
        bf16 = r["peak_flops"].get("bf16", r["peak_flops"].get("fp16", 0.0))
        shape = f"{r['nodes']}x{r['gpus_per_node']}"
        lines.append(f"{r['name']:<13} {r['gpu']:<11} {shape:>6} "
                     f"{r['memory_bytes'] / GiB:>6.1f} {bf16 / 1e12:>8.4g} "
                     f"{'yes' if 'fp8' in r['peak_flops'] else 'no':>4} "
                     f"{r['intra_Bps'] / 1e9:>10.1f} {r['inter_Bps'] / 1e9:>10.1f}")
    return lines + ["shape: default nodes x GPUs per node (--nodes sets the nodes); GiB: GPU "
                    "memory",
                    "bf16 TF: dense peak TFLOP/s; GB/s: achievable, per direction, of one "
                    "GPU's port",
                    "in its node (intra) and of one node's network adapters (inter)"]


@click.command("presets")
@json_options
def presets_command(as_json, json_out):
    """List the model and cluster presets with their key facts."""
    from .options import check_writable

    check_writable(("--json-out", json_out))
    models, clusters = _models(), _clusters()
    emit_json({"models": models, "clusters": clusters}, as_json, json_out)
    if as_json:
        return
    click.echo("\n".join(_model_lines(models)))
    click.echo("")
    click.echo("\n".join(_cluster_lines(clusters)))
    click.echo("")
    click.echo("sources: merak-sim presets --json; --model and --cluster also take a "
               "JSON file")


command = presets_command
