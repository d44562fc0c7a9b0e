"""Planner speed and quality, and the Merak reproduction table: printed figures and
markdown reports, never asserted in tests.

    .venv/bin/python benchmarks/bench_planner.py [--repeat 3] [--skip-175b]
        [--skip-quality] [--skip-reproduce]

Speed (targets, on a 2-core machine): a full search for GPT-8.3B on 64 GPUs
(paper-3090, global batch 128) under 10 s; GPT-3 175B on 1024 GPUs (dgx-a100-80g x 128
nodes, global batch 1536) under 60 s. Each run is a fresh Python process (cold caches,
imports included in neither: the figure is the time inside ``search``), median of
``--repeat`` runs, with the candidates considered, pruned, bounded, evaluated and
simulated.

Quality: on the four paper models (global batch 128), the planner's best plan per system
against every hand-written configuration of notebook 02
(:func:`merak_sim.experiments.merak.hand_configs`), both simulated with SimPy.

Writes benchmarks/results/planner.md and benchmarks/results/reproduce_merak.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from merak_sim.io import atomic_write_text

CASES = {
    "gpt-8.3b / 64 GPUs": ("gpt-8.3b", "paper-3090", None, 128, 10.0),
    "gpt3-175b / 1024 GPUs": ("gpt3-175b", "dgx-a100-80g", 128, 1536, 60.0),
}

_CHILD = """
import json, sys, time
from merak_sim.planner import search
m, c, n, g = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
r = search(m, c, g, nodes=None if n == "None" else int(n))
dt = time.perf_counter() - t
b = r.best_config
print(json.dumps({"seconds": dt, "counts": r.counts,
                  "best": f"dp{b.dp} tp{b.tp} pp{b.pp} v{b.virtual_stages} "
                          f"mbs{b.micro_batch_size} {b.schedule} {b.recompute} "
                          f"sp={b.sequence_parallel} overlap={b.tp_overlap} zero={b.zero}",
                  "time_s": r.best_result.iteration_time_s, "mfu": r.best_result.mfu}))
"""


def speed(repeat: int, skip_175b: bool) -> list[str]:
    """Median search time per case in fresh processes; markdown lines."""
    lines = ["## Search speed (median of fresh-process runs)", "",
             "| case | target | median s | runs s | considered | pruned (rule / memory) "
             "| bounded | evaluated | SimPy | cost tables | schedules | best plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (m, c, n, g, target) in CASES.items():
        if skip_175b and "175b" in m:
            continue
        runs = []
        last = None
        for _ in range(repeat):
            out = subprocess.run([sys.executable, "-c", _CHILD, m, c, str(n), str(g)],
                                 capture_output=True, text=True, cwd=ROOT, timeout=900,
                                 check=True)
            last = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append(last["seconds"])
        med = statistics.median(runs)
        k = last["counts"]
        each = ", ".join(f"{x:.2f}" for x in runs)
        print(f"{name}: median {med:.2f} s over {repeat} runs ({each}); target < "
              f"{target:.0f} s; {k}")
        print(f"  best: {last['best']}: {last['time_s']:.3f} s/iteration, MFU "
              f"{last['mfu']:.1%}")
        lines.append(
            f"| {name} | < {target:.0f} s | {med:.2f} | {', '.join(f'{x:.2f}' for x in runs)} "
            f"| {k['considered']} | {k['pruned_rule']} / {k['pruned_memory']} | "
            f"{k['bounded']} | {k['evaluated']} | {k['simulated']} | {k['cost_tables']} | "
            f"{k['schedules']} | {last['best']}: {last['time_s']:.3f} s, MFU "
            f"{last['mfu']:.1%} |")
    return lines


def quality(rep) -> list[str]:
    """Planner best vs hand-written configurations; markdown lines."""
    from merak_sim.experiments.merak import describe, hand_configs
    from merak_sim.sim import simulate

    lines = ["## Planner quality: best plan vs hand-written configurations", "",
             "| model | system | planner s | hand-written (fit / total) | fastest hand s "
             "| ratio hand / planner | fastest hand config |", "|---|---|---|---|---|---|---|"]
    worst = float("inf")
    for m in rep.models:
        for system, cfgs in hand_configs(m.model, rep.global_batch_size).items():
            res = [(simulate(m.model, rep.cluster, c, keep_trace=False), c) for c in cfgs]
            fit = [(r.iteration_time_s, c) for r, c in res if r.fits_in_memory]
            p = m.runs[system].time_s
            if fit:
                t, c = min(fit, key=lambda x: x[0])
                worst = min(worst, t / p)
                lines.append(f"| {m.model} | {system} | {p:.3f} | {len(fit)} / {len(cfgs)} | "
                             f"{t:.3f} | {t / p:.3f} | {describe(c)} |")
            else:
                lines.append(f"| {m.model} | {system} | {p:.3f} | 0 / {len(cfgs)} | - | - | - |")
    verdict = ("holds" if worst >= 1 - 1e-9 else "FAILS")
    lines += ["", f"Smallest hand / planner ratio: {worst:.3f} (>= 1 means the planner is at "
                  f"least as fast as every hand-written configuration): {verdict}."]
    print(lines[-1])
    return lines


def main() -> None:
    """Run the benchmarks and write the reports."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-175b", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-reproduce", action="store_true")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results"
    lines = ["# Planner benchmark", "",
             "Command: `.venv/bin/python benchmarks/bench_planner.py --repeat "
             f"{args.repeat}` on the shared 2-core machine.", ""]
    lines += speed(args.repeat, args.skip_175b)
    rep = None
    if not (args.skip_quality and args.skip_reproduce):
        from merak_sim.experiments.merak import reproduce_merak

        rep = reproduce_merak(log=print)
    if not args.skip_quality:
        lines += [""] + quality(rep)
    atomic_write_text(out / "planner.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'planner.md'}")
    if not args.skip_reproduce:
        from merak_sim.experiments.merak_report import report_markdown
        from merak_sim.experiments.regimes import cpu_tp_overlap, explain_regimes, regime_map

        reg = regime_map(log=print)
        atomic_write_text(out / "reproduce_merak.md", report_markdown(
            rep, reg, explain_regimes(reg), cpu_tp_overlap()))
        print(f"wrote {out / 'reproduce_merak.md'}")


if __name__ == "__main__":
    main()
