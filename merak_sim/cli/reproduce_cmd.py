"""``merak-sim reproduce merak``: Merak's headline speed-ups on the paper models.

Prints every assumption, the speed-up table next to the paper's figures, the ablation
(one technique at a time), an explanation for every model whose reproduced speed-up is
more than 15 % off the paper's, and writes a bar chart plus CSV tables under ``--out``
(atomically). See :mod:`merak_sim.experiments.merak` for the recipe.
"""

from __future__ import annotations

import json

import click


@click.command("reproduce")
@click.argument("paper", type=click.Choice(["merak"]))
@click.option("--out", type=click.Path(file_okay=False), default="out/reproduce",
              show_default=True, help="Directory for the chart and tables.")
@click.option("--models", default=None,
              help="Comma-separated subset of gpt-1.5b,gpt-2.5b,gpt-8.3b,gpt-20b.")
@click.option("--cluster", default="paper-3090", show_default=True,
              help="Cluster preset (the paper's is an assumption).")
@click.option("--global-batch-size", type=int, default=None,
              help="Sequences per iteration (default: the documented assumption).")
@click.option("--top", "top_k", type=int, default=2, show_default=True,
              help="Candidates per system confirmed with SimPy.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def reproduce_command(paper, out, models, cluster, global_batch_size, top_k, as_json):
    """Reproduce a paper's headline result in simulation (only: merak)."""
    import sys

    from merak_sim.experiments.merak import (
        DEFAULT_GLOBAL_BATCH,
        PAPER_MODELS,
        reproduce_merak,
        write_outputs,
    )

    names = PAPER_MODELS if models is None else tuple(
        m.strip() for m in models.split(",") if m.strip())
    gbs = global_batch_size or DEFAULT_GLOBAL_BATCH
    log = None if as_json else (lambda line: click.echo(f"  {line}", err=True))
    rep = reproduce_merak(names, cluster=cluster, global_batch_size=gbs, top_k=top_k,
                          progress=not as_json and sys.stderr.isatty(), log=log)
    paths = write_outputs(rep, out)
    expl = rep.explanations()
    if as_json:
        click.echo(json.dumps({
            "speedups": rep.table().to_dict(orient="records"),
            "ablation": rep.ablation_table().to_dict(orient="records"),
            "assumptions": list(rep.assumptions), "explanations": expl,
            "files": {k: str(v) for k, v in paths.items()}, "seconds": rep.seconds}))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 150)
    con.print("[bold]Assumptions[/bold] (the paper states neither cluster nor shapes):")
    for a in rep.assumptions:
        con.print(f"  - {a}", markup=False)
    t = Table(title=f"Merak speed-ups, simulated on {rep.cluster} "
                    f"(global batch {rep.global_batch_size})")
    for col in ("model", "Megatron-like s", "DeepSpeed-like s", "Merak s",
                "vs Megatron", "vs DeepSpeed", "paper (up to)", "diff", "Merak plan"):
        t.add_column(col)
    for m in rep.models:
        t.add_row(m.model, f"{m.runs['megatron'].time_s:.3f}",
                  f"{m.runs['deepspeed'].time_s:.3f}", f"{m.runs['merak'].time_s:.3f}",
                  f"{m.speedup_vs['megatron']:.2f}x", f"{m.speedup_vs['deepspeed']:.2f}x",
                  f"{m.paper:.2f}x", f"{m.deviation:+.0%}",
                  _short(m.runs["merak"].config))
    con.print(t)
    a = Table(title="Ablation: one technique at a time (speed-up over the better baseline)")
    a.add_column("model")
    for _s, label, _t, _x in rep.models[0].ablation:
        a.add_column(label)
    for m in rep.models:
        a.add_row(m.model, *[f"{t:.3f} s ({x:.2f}x)" for _s, _l, t, x in m.ablation])
    con.print(a)
    if expl:
        con.print("[bold]Where the differences over 15 % come from[/bold]:")
        for _name, text in expl.items():
            con.print(f"  {text}", markup=False)
    else:
        con.print("Every reproduced speed-up is within 15 % of the paper's.")
    for k, v in paths.items():
        con.print(f"wrote {k}: {v}", markup=False)
    con.print(f"({rep.seconds:.1f} s)")


def _short(cfg) -> str:
    from merak_sim.experiments.merak import describe

    return describe(cfg)


command = reproduce_command
