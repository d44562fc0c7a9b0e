"""Build notebooks 01-03 and 05 from the cell sources below (run: ``python
notebooks/build_notebooks.py``), then ``make notebooks`` executes them and stores their
outputs (figures included) in the committed .ipynb files; tests/test_notebooks.py
executes every notebook in this folder and checks each shows at least one figure.

Convention for every notebook here (tests rely on it): its cells ``assert`` on what
they compute, and its metadata (``merak.result``, which a reader does not see) holds a
Python expression of the headline numbers. ``make notebooks`` and the tests evaluate
it in the notebook's kernel after the last cell, in a cell that is never saved
(``run_notebooks.execute``); ``make notebooks`` stores the value in
``merak.result_value``. A notebook whose full setting takes minutes (02, 04) reads
``MERAK_NOTEBOOK_QUICK=1`` (the tests set it) to run the same cells on a smaller one and
says so in its numbers (``"quick": true``); ``make notebooks`` runs the full setting.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import json, tempfile, dataclasses
import numpy as np
import pandas as pd
%matplotlib inline
import matplotlib.pyplot as plt
pd.set_option("display.width", 160)
OUT = tempfile.mkdtemp(prefix="merak-nb-")"""

NB01 = [
    new_markdown_cell("""\
# 01 What-if study: pipeline schedules, a straggler GPU, a slower network

**What it answers:** how the bubble and peak memory of each pipeline schedule move
with the pipeline depth and the number of micro-batches, and how much one slow GPU or a
slower network costs a small job.

Small settings so it runs in well under a minute. Everything is simulated with
`merak_sim.simulate` (the exact fast evaluator for the sweeps, the SimPy engine with
link contention for the what-ifs, which need every GPU simulated: `mode="full"`).

Model: GPT-2.5B (an assumption of the Merak reproduction, L=54, h=1920) on the
`paper-3090` preset (RTX 3090, 4 per node, PCIe inside a node, 100 Gb/s between nodes;
also an assumption)."""),
    new_code_cell(SETUP + """
from merak_sim.sim import simulate
from merak_sim.config import ParallelConfig
MODEL, CLUSTER = "gpt-2.5b", "paper-3090\""""),
    new_markdown_cell("""\
## Bubble and memory versus pp, micro-batches and schedule

One pipeline (dp=1, tp=1) on `pp` GPUs, micro-batch size 1, full recompute for 1F1B-style
schedules, stage-aware recompute (c0=0.75) for Merak's shifted critical path. The bubble
fraction is the mean idle share of a GPU; peak memory is the largest over stages."""),
    new_code_cell("""\
rows = []
for pp in (2, 4, 8):
    for M in (8, 16, 32):
        for sched, rc in (("gpipe", "full"), ("1f1b", "full"), ("interleaved-1f1b", "full"),
                          ("zb-h1", "full"), ("shifted-critical-path", "stage-aware")):
            v = 2 if sched == "interleaved-1f1b" else 1
            cfg = ParallelConfig(dp=1, tp=1, pp=pp, virtual_stages=v, micro_batch_size=1,
                                 global_batch_size=M, schedule=sched, recompute=rc)
            r = simulate(MODEL, CLUSTER, cfg, nodes=pp // 4 or 1, sub_cluster=True,
                         engine="evaluator", keep_trace=False)
            rows.append(dict(pp=pp, M=M, schedule=sched, time_s=r.iteration_time_s,
                             bubble=r.bubble_fraction,
                             peak_gib=max(r.peak_memory_bytes) / 2**30))
sweep = pd.DataFrame(rows)
sweep.pivot_table(index=["pp", "M"], columns="schedule", values="bubble").round(3)"""),
    new_code_cell("""\
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for sched, g in sweep[sweep.M == 16].groupby("schedule"):
    axes[0].plot(g.pp, g.bubble, marker="o", label=sched)
    axes[1].plot(g.pp, g.peak_gib, marker="o", label=sched)
axes[0].set(xlabel="pp", ylabel="bubble fraction", title="M = 16 micro-batches")
axes[1].set(xlabel="pp", ylabel="peak memory GiB", title="M = 16 micro-batches")
axes[0].legend(fontsize=8)
plt.show()
# More micro-batches shrink the 1F1B bubble; GPipe holds every micro-batch, 1F1B at most pp.
one = sweep[(sweep.schedule == "1f1b") & (sweep.pp == 8)].set_index("M")
assert one.bubble[32] < one.bubble[8]
g8 = sweep[(sweep.pp == 4) & (sweep.M == 32)].set_index("schedule")
assert g8.peak_gib["gpipe"] > g8.peak_gib["1f1b"]
assert g8.time_s["shifted-critical-path"] < g8.time_s["1f1b"]"""),
    new_markdown_cell("""\
## Every schedule side by side at unit costs

Each registered schedule (`merak_sim.schedule.SCHEDULES`) at S = 4, M = 8 with
F = I = W = 1 (`replay(s, f=1, b=2, w=1)`; a chunk of a two-chunk schedule costs half)
and free communication: the makespan without and with full recomputation, the bubble
and the peak activations a rank holds, in stage micro-batches (a chunk's micro-batch
counts 1/v). The Gantt charts colour I (input gradient) and W (weight gradient)
apart: the zero-bubble schedules move W into the slots where 1F1B idles. Merak's
schedules place their re-forwards (R) into waits, so they pay off with
recomputation. docs/schedules.md has the same figures at S = 8, M = 16 and the
comparison with torch.distributed.pipelining's schedules."""),
    new_code_cell("""\
from merak_sim.schedule import SCHEDULES, generate, liveness, replay
from merak_sim.schedule.liveness import ItemSizes
from merak_sim.schedule.render import plot_gantt
S, M = 4, 8
runs, unit = {}, {}
for name, spec in SCHEDULES.items():
    v = 2 if spec.interleaved or spec.placement == "v" else 1
    if spec.violation(S, M, v):
        continue
    s = generate(name, S, M, v)
    runs[name] = replay(s, f=1, b=2, w=1)
    chunk = ItemSizes(1 / v, 1 / v, 1 / v)
    unit[name] = dict(v=v, makespan=runs[name].makespan,
                      makespan_recompute=replay(s, f=1, b=2, w=1, recompute=1.0).makespan,
                      bubble=round(runs[name].bubble_fraction, 3),
                      peak_in_flight=max(liveness(s, r).peak(chunk) for r in range(S)))
units = pd.DataFrame(unit).T
units"""),
    new_code_cell("""\
fig, axes = plt.subplots(len(runs), 1, figsize=(12, 1.9 * len(runs)), sharex=True)
for ax, (name, res) in zip(axes, runs.items()):
    plot_gantt(res.execution, ax=ax, title=f"{name}: makespan {res.makespan:g}")
fig.tight_layout()
plt.show()
# Interleaving and zero bubble shorten 1F1B's makespan; 1F1B holds S micro-batches.
assert units.peak_in_flight["1f1b"] == S
for name in ("interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev"):
    if name in units.index:
        assert units.makespan[name] < units.makespan["1f1b"], name
for name in ("zb-v",):  # the V halves the warm-up at 1F1B's activation memory
    if name in units.index:
        assert units.peak_in_flight[name] <= units.peak_in_flight["1f1b"]"""),
    new_markdown_cell("""\
## A straggler GPU

8 GPUs (2 nodes): dp=2 x pp=4. GPU 5 (stage 2 of the second replica) runs 1.5x slower.
Every GPU is simulated (`mode="full"`): the slow replica delays the data-parallel
all-reduce, so the whole job waits for it."""),
    new_code_cell("""\
cfg = ParallelConfig(dp=2, tp=1, pp=4, micro_batch_size=1, global_batch_size=32,
                     schedule="1f1b", recompute="full")
base = simulate(MODEL, CLUSTER, cfg, nodes=2, mode="full", keep_trace=False)
slow = simulate(MODEL, CLUSTER, cfg, nodes=2, mode="full", slowdown={5: 1.5},
                keep_trace=False)
straggler = slow.iteration_time_s / base.iteration_time_s
print(f"healthy {base.iteration_time_s:.3f} s, with a 1.5x straggler "
      f"{slow.iteration_time_s:.3f} s ({straggler:.2f}x)")
assert 1.0 < straggler <= 1.5 + 1e-9"""),
    new_markdown_cell("""\
## A slower network

The same 8 GPUs with the inter-node network scaled from 100 % down to 12.5 % of 100 Gb/s,
for a data-parallel-heavy plan (dp=8) and a pipeline-heavy one (pp=8). Pipelines send
only activations between nodes; data parallelism all-reduces every gradient."""),
    new_code_cell("""\
from merak_sim.hardware import get_cluster
plans = {"dp=8": dict(dp=8, tp=1, pp=1), "dp=2 pp=4": dict(dp=2, tp=1, pp=4),
         "pp=8": dict(dp=1, tp=1, pp=8)}
rows = []
for frac in (1.0, 0.5, 0.25, 0.125):
    c = get_cluster(CLUSTER, nodes=2)
    c = dataclasses.replace(c, inter=dataclasses.replace(
        c.inter, bandwidth_Bps=c.inter.bandwidth_Bps * frac))
    for name, deg in plans.items():
        cfg = ParallelConfig(**deg, micro_batch_size=1, global_batch_size=32,
                             schedule="1f1b", recompute="full", zero=1 if deg["dp"] > 1 else 0)
        r = simulate(MODEL, c, cfg, keep_trace=False)
        rows.append(dict(network=frac, plan=name, time_s=r.iteration_time_s,
                         fits=r.fits_in_memory))
net = pd.DataFrame(rows)
tab = net.pivot(index="network", columns="plan", values="time_s")
print(tab.round(3))
tab.plot(marker="o", logx=True, ylabel="iteration s", xlabel="share of 100 Gb/s")
plt.show()
slowdown = tab.loc[0.125] / tab.loc[1.0]
assert slowdown["dp=8"] > slowdown["pp=8"]"""),
]
RESULT01 = """{
    "straggler_slowdown": straggler,
    "dp8_network_slowdown": float(slowdown["dp=8"]),
    "pp8_network_slowdown": float(slowdown["pp=8"]),
    "bubble_1f1b_pp8_M8": float(one.bubble[8]),
    "unit_makespan_S4_M8": {n: float(x) for n, x in units.makespan.items()}}"""

NB02 = [
    new_markdown_cell("""\
# 02 Merak's speed-ups, reproduced in simulation

**What it answers:** how much faster Merak is than Megatron-LM-like and DeepSpeed-like
baselines in simulation, against baselines run as the paper ran them (full
recompute) and against the same systems free to choose their own recompute, and where
(which memory pressure) each of Merak's techniques pays.

`merak_sim.reproduce.merak.reproduce_merak` runs each system at its own best
configuration (found by the planner in the system's search space) on the four paper
models on 64 simulated RTX 3090s: Megatron-LM-like (1F1B, full recompute, synchronous TP),
DeepSpeed-like (+ ZeRO-1) and Merak (shifted critical path + stage-aware recompute +
sub-pipelined TP), plus an ablation adding one technique at a time. The same as
`merak-sim reproduce merak`. Every assumption is printed first."""),
    new_code_cell(SETUP + """
import os
from merak_sim.reproduce.merak import PAPER_MODELS, reproduce_merak, hand_configs, describe
from merak_sim.reproduce.figures import plot_reproduction
# MERAK_NOTEBOOK_QUICK=1 (the tests set it) runs the same cells on two of the models
# and maps the regimes of one; the stored outputs are the full run (make notebooks).
QUICK = os.environ.get("MERAK_NOTEBOOK_QUICK") == "1"
rep = reproduce_merak(("gpt-1.5b", "gpt-8.3b") if QUICK else PAPER_MODELS)
for a in rep.assumptions:
    print("-", a)"""),
    new_code_cell("""\
t = rep.table()
t[["model", "megatron_time_s", "deepspeed_time_s", "merak_time_s", "speedup_vs_megatron",
   "speedup_vs_deepspeed", "paper_speedup", "deviation"]].round(3)"""),
    new_code_cell("""\
rep.ablation_table().pivot(index="model", columns="step", values="speedup")[
    ["baseline", "+T1", "+T2", "merak"]].round(3)"""),
    new_code_cell("""\
fig = plot_reproduction(rep)
plt.show()
for name, text in rep.explanations().items():
    print(text, end="\\n\\n")
# Merak is never slower than the baselines it extends.
assert (t.speedup_vs_megatron >= 1.0).all() and (t.speedup_vs_deepspeed >= 1.0).all()"""),
    new_markdown_cell("""\
## Where the time goes: baseline versus Merak on GPT-8.3B

Per-stage compute, recompute, exposed communication and bubble (seconds) from the SimPy
results of both best plans."""),
    new_code_cell("""\
m = {x.model: x for x in rep.models}["gpt-8.3b"]
parts = []
for s in ("baseline", "merak"):
    for r in m.runs[s].result.ranks:
        parts.append(dict(system=s, stage=r.stage, compute=r.compute_s,
                          recompute=r.recompute_s, comm=r.exposed_comm_s, bubble=r.bubble_s))
br = pd.DataFrame(parts)
fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
for ax, (s, g) in zip(axes, br.groupby("system")):
    g.set_index("stage")[["compute", "recompute", "comm", "bubble"]].plot.bar(
        stacked=True, ax=ax, title=f"{s}: {describe(m.runs[s].config)}", fontsize=7)
plt.show()
assert br[br.system == "merak"].recompute.sum() < br[br.system == "baseline"].recompute.sum()"""),
    new_markdown_cell("""\
## The planner against hand-written configurations

For every model and system, a handful of configurations a user might write by hand
(`hand_configs`), simulated with the same SimPy engine. The planner's best must be at
least as fast as each of them that fits."""),
    new_code_cell("""\
from merak_sim.sim import simulate
rows = []
for mr in rep.models:
    for system, cfgs in hand_configs(mr.model, rep.global_batch_size).items():
        for cfg in cfgs:
            r = simulate(mr.model, rep.cluster, cfg, keep_trace=False)
            rows.append(dict(model=mr.model, system=system, config=describe(cfg),
                             hand_s=r.iteration_time_s, fits=r.fits_in_memory,
                             planner_s=mr.runs[system].time_s))
hand = pd.DataFrame(rows)
fit = hand[hand.fits]
worst = (fit.hand_s / fit.planner_s).min()
print(f"{len(hand)} hand-written configurations, {len(fit)} fit; the closest runs at "
      f"{worst:.3f}x the planner's time")
assert (fit.planner_s <= fit.hand_s * (1 + 1e-9)).all()
fit.groupby(["model", "system"]).apply(lambda g: (g.hand_s / g.planner_s).min()).round(3)"""),
    new_markdown_cell("""\
## Both baseline families, and where the techniques pay

The paper-like baselines are forced into full recompute; the free ones choose none,
selective or full. The regime map lowers the GPU memory (24 GB, then 8 GB) and adds
T1, T2, T3 one at a time over the free baseline (fast evaluator), for the two largest
models (`merak-sim reproduce merak` maps all four at 24 / 16 / 12 / 8 GB)."""),
    new_code_cell("""\
from merak_sim.reproduce.regimes import regime_map, explain_regimes
from merak_sim.reproduce.figures import plot_regimes
display(t[["model", "speedup_up_to", "speedup_vs_free_baselines",
           "megatron_free_config"]].round(3))
regs = regime_map(("gpt-8.3b",) if QUICK else ("gpt-8.3b", "gpt-20b"), levels=(24, 8))
fig = plot_regimes(regs)
plt.show()
for line in explain_regimes(regs):
    print(line)
# A step that fits nowhere at a memory level has no factor there.
assert all(r.factor(s) >= 1 - 1e-9 for r in regs for s in ("+T1", "+T2", "+T3")
           if r.factor(s) is not None)
assert (t.speedup_vs_free_baselines < t.speedup_up_to).all()"""),
]
RESULT02 = """{
    "speedups": {r.model: r.speedup for r in rep.models},
    "free": {r.model: r.speedup_vs_free_baselines for r in rep.models},
    "paper": {r.model: r.paper for r in rep.models},
    "hand_configs": int(len(hand)), "hand_min_ratio": float(worst), "quick": QUICK}"""

NB03 = [
    new_markdown_cell("""\
# 03 Planner walk-through: GPT-3 175B on 1024 GPUs

**What it answers:** which parallel configuration trains GPT-3 175B fastest on 1024
A100s, why every other candidate lost, and what restricting the search to a
Megatron-LM-like system costs.

128 DGX A100 80 GB nodes (8 GPUs on NVSwitch, 8 x 200 Gb/s InfiniBand per node), global
batch 1536 sequences of 2048 tokens (GPT-3's 3.2M-token batch). The planner searches
dp x tp x pp (tp within a node), virtual stages, micro-batch size, schedule, recompute
policy (with per-stage fractions chosen from the memory model), sequence parallelism,
TP overlap and ZeRO-1."""),
    new_code_cell(SETUP + """
from merak_sim.planner import search, SearchSpace, SYSTEMS
res = search("gpt3-175b", "dgx-a100-80g", 1536, nodes=128, top_k=3)
print(res.counts_line())
res.top(8)[["status", "time_s", "mfu", "peak_memory_gib", "dp", "tp", "pp",
            "virtual_stages", "micro_batch_size", "schedule", "recompute",
            "sequence_parallel", "tp_overlap", "zero", "reason"]]"""),
    new_markdown_cell("""\
## Why the others lost

Every candidate has a status and a reason: pruned by a divisibility rule, pruned by
memory (the schedule's live micro-batches walked per stage), bounded out (its busiest
rank alone already needs more than the top-K cut, so no schedule could save it), or
evaluated and slower."""),
    new_code_cell("""\
df = res.table
df.status.value_counts()"""),
    new_code_cell("""\
df["why"] = df.reason.str.split(":").str[0].str.replace(r"\\d.*", "", regex=True)
print(df.groupby(["status", "why"]).size().sort_values(ascending=False).head(8))
mem = df[df.reason.str.startswith("memory")].sort_values("shortfall_gib")
mem[["dp", "tp", "pp", "micro_batch_size", "schedule", "recompute", "reason"]].head(5)"""),
    new_markdown_cell("""\
## The best plan: memory per stage, plan file, dispatch

The plan file (`merak-plan/1`) is what `merak-sim dispatch` and the real backend read."""),
    new_code_cell("""\
from merak_sim.plan import Plan
from merak_sim.dispatch import write_launch
best = res.best_result
print(best.summary().split("\\n\\n")[0])
path = f"{OUT}/plan.json"
res.save(path)
plan = Plan.load(path)
files = write_launch(plan, "slurm", nodes=128, gpus_per_node=8, out_dir=f"{OUT}/dispatch",
                     force=True)  # a simulated plan: it may use options merak-exec lacks
print(open(files.launcher).read()[:600].replace(OUT, "OUT"))  # OUT: the scratch folder
assert plan.parallel == res.best_config and plan.parallel.world_size == 1024
assert res.best_result.fits_in_memory"""),
    new_code_cell("""\
plt.bar(range(len(best.peak_memory_bytes)), [b / 2**30 for b in best.peak_memory_bytes])
plt.axhline(best.memory_capacity_bytes / 2**30, color="r", label="capacity")
plt.xlabel("pipeline stage"); plt.ylabel("peak GiB"); plt.legend(); plt.show()"""),
    new_markdown_cell("""\
## What the restrictions cost

The same search restricted to the Megatron-LM-like system (1F1B, full recompute,
synchronous TP, no sequence parallelism). The paper reproduction's system pins unfused
attention, as the paper's runs had it; here it keeps the full search's attention
(flash, the GPU default), so the gap is what the system's restrictions above cost,
not a difference of attention kernel."""),
    new_code_cell("""\
meg = search("gpt3-175b", "dgx-a100-80g", 1536, nodes=128, top_k=1,
             space=SYSTEMS["megatron"].with_(attention=("auto",)))
gain = meg.best_result.iteration_time_s / res.best_result.iteration_time_s
print(f"Megatron-like best {meg.best_result.iteration_time_s:.2f} s, full search "
      f"{res.best_result.iteration_time_s:.2f} s: {gain:.2f}x")
assert gain >= 1.0 - 1e-9"""),
]
RESULT03 = """{
    "best_time_s": res.best_result.iteration_time_s, "mfu": res.best_result.mfu,
    "counts": res.counts, "gain_over_megatron_like": gain,
    "best": res.best_config.to_dict()}"""

NB05 = [
    new_markdown_cell("""\
# 05 What-if on a 64-GPU run: a straggler, a degraded link, a mixed-GPU cluster

**What it answers:** how much a 64-GPU GPT-1.5B job (16 nodes x 4 RTX 3090 of the
`paper-3090` preset, dp=16 x pp=4, global batch 128) slows down when one GPU runs
slower, when one node's network link loses bandwidth, and what replacing half the GPUs
with faster ones buys. Every GPU is simulated (`mode="full"`, SimPy with link
contention): what-ifs break the symmetry the representative mode relies on."""),
    new_code_cell(SETUP + """
from merak_sim.sim import simulate
from merak_sim.config import ParallelConfig
CFG = ParallelConfig(dp=16, tp=1, pp=4, micro_batch_size=1, global_batch_size=128,
                     schedule="1f1b", recompute="none", zero=1)
def run(**what_if):
    return simulate("gpt-1.5b", "paper-3090", CFG, mode="full", keep_trace=False,
                    **what_if).iteration_time_s
base = run()
print(f"healthy 64-GPU iteration {base:.3f} s")"""),
    new_markdown_cell("""\
## A straggler GPU

GPU 5 (the first pipeline stage of data-parallel replica 5: ranks run data-parallel
first) runs 1.1x to 2x slower. Its pipeline slows, and the data-parallel all-reduce
makes every replica wait for it."""),
    new_code_cell("""\
factors = (1.0, 1.1, 1.25, 1.5, 2.0)
strag = pd.Series({f: run(slowdown={5: f}) / base for f in factors}, name="slowdown")
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(strag.index, strag.values, marker="o", label="one straggler GPU")
ax.plot(factors, factors, ls="--", color="grey", label="whole job as slow as the GPU")
ax.set(xlabel="straggler compute slowdown", ylabel="iteration slowdown")
ax.legend()
plt.show()
assert strag[1.0] == 1.0 and strag[2.0] > strag[1.1] > 1.0 and strag[2.0] <= 2.0 + 1e-9"""),
    new_markdown_cell("""\
The timeline of GPUs 0-7 (the first pipeline stage of replicas 0-7) with the 2x
straggler on GPU 5: its bars stretch, and the healthy GPUs wait for it inside the
gradient all-reduce (legend: one colour per action kind, idle time as the
background)."""),
    new_code_cell("""\
from merak_sim.timeline import plot_gantt
slow = simulate("gpt-1.5b", "paper-3090", CFG, mode="full", slowdown={5: 2.0})
fig = plot_gantt(slow.events(), max_ranks=8, title="2x straggler on GPU 5",
                 figsize=(11, 3.5))
plt.show()"""),
    new_markdown_cell("""\
## A degraded link

Node 3's network link (in and out) at 50 %, 25 % and 10 % of its 100 Gb/s. The
gradient all-reduce rings pass through it, so the whole job waits."""),
    new_code_cell("""\
link = pd.Series({f: run(degraded_links={"node3.nic.in": f, "node3.nic.out": f}) / base
                  for f in (1.0, 0.5, 0.25, 0.1)}, name="slowdown")
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.bar([f"{f:.0%}" for f in link.index], link.values, label="node 3 link degraded")
ax.set(xlabel="link capacity left", ylabel="iteration slowdown")
ax.legend()
plt.show()
assert link[0.1] > link[0.5] > 1.0"""),
    new_markdown_cell("""\
## A mixed-GPU cluster

The first k nodes' GPUs replaced with A100 80 GB (priced by the ratio of peak FLOP/s).
A pipeline is as fast as its slowest stage and data parallelism as its slowest
replica: the gain only comes once every GPU of a replica's critical path is faster."""),
    new_code_cell("""\
mixed = {}
for nodes in (0, 4, 8, 12, 16):
    types = {r: "A100-80GB" for r in range(4 * nodes)}
    mixed[f"{nodes} of 16 nodes"] = base / run(gpu_types=types) if nodes else 1.0
mixed = pd.Series(mixed, name="speed-up")
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.bar(mixed.index, mixed.values, color="tab:green", label="A100 nodes replacing RTX 3090")
ax.set(ylabel="speed-up over all RTX 3090")
ax.legend()
plt.show()
assert mixed.iloc[-1] > mixed.iloc[1] >= 1.0 - 1e-9"""),
]
RESULT05 = """{
    "base_s": base, "straggler_2x": float(strag[2.0]), "link_10pct": float(link[0.1]),
    "all_a100_speedup": float(mixed.iloc[-1])}"""

#: notebook -> (cells, the expression of its headline numbers: metadata, not a cell).
NOTEBOOKS = {
    "01_what_if_schedules.ipynb": (NB01, RESULT01),
    "02_paper_reproduction.ipynb": (NB02, RESULT02),
    "03_planner_175b.ipynb": (NB03, RESULT03),
    "05_what_if_64gpu.ipynb": (NB05, RESULT05),
}


def build(out_dir: Path = HERE) -> list[Path]:
    """Write every notebook (no outputs) and return their paths."""
    paths = []
    for name, (cells, result) in NOTEBOOKS.items():
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        nb.metadata["merak"] = {"result": result}
        p = out_dir / name
        text = nbformat.writes(nb) + "\n"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(p)  # atomic: merak_sim.io is not needed for a dev script
        paths.append(p)
    return paths


if __name__ == "__main__":
    if sys.argv[1:]:
        print("build_notebooks.py takes no arguments; run it as `python "
              "notebooks/build_notebooks.py` (make notebooks also executes them)",
              file=sys.stderr)
        sys.exit(2)
    for p in build():
        print(f"wrote {p.relative_to(HERE.parent)}")
