"""Planner speed and quality, and the Merak reproduction table: printed figures and
markdown reports, never asserted in tests.

    .venv/bin/python benchmarks/bench_planner.py [--repeat 3] [--skip-175b]
        [--skip-quality] [--skip-reproduce] [--only TEXT]

``--only TEXT`` times only the cases whose name contains TEXT (for example ``405b``),
prints them and writes nothing.

Speed (targets, on a 2-core machine): a full search for GPT-8.3B on 64 GPUs
(paper-3090, global batch 128) under 10 s; GPT-3 175B on 1024 GPUs (dgx-a100-80g x 128
nodes, global batch 1536) under 60 s; a 405B-class LLaMA on 16,384 H100 (dgx-h100 x
2048 nodes, global batch 2048) over the full space (cp 1-8, ZeRO 0-3, every schedule
and recompute policy, flash and unfused attention, DP overlap on and off) under 10 s.
Each run is a fresh Python process (cold caches, imports included in neither: the
figure is the time inside ``search``), median of ``--repeat`` runs (one run for the
405B space), wall and CPU seconds (the CPU figure is what a shared machine's load
does not inflate), with the candidates considered, pruned, bounded, evaluated and
simulated. Where the exhaustive search (every candidate priced and evaluated) runs in
reasonable time, small full spaces, its time and the ratio; both must find the same
best plan. The 405B space also prints why its best plan won, per knob.

Quality: on the four paper models (global batch 128), the planner's best plan per system
against every hand-written configuration of notebook 02
(:func:`merak_sim.reproduce.merak.hand_configs`), both simulated with SimPy.

Writes benchmarks/results/planner.md and benchmarks/results/reproduce_merak.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from merak_sim.io import atomic_write_text

#: name -> (model, cluster, nodes, global batch, target s, search-space changes,
#: whether the exhaustive search also runs for the ratio column).
FULL_405B = {"cp": [1, 2, 4, 8], "zero": [0, 1, 2, 3], "attention": ["flash", "unfused"],
             "overlap_param_gather": [False, True]}
SMALL_FULL = {"cp": [1, 2], "zero": [0, 1, 2, 3], "attention": ["flash", "unfused"],
              "overlap_param_gather": [False, True], "micro_batch_sizes": [1, 2],
              "virtual_stages": [2]}
CASES = {
    "gpt-8.3b / 64 GPUs": ("gpt-8.3b", "paper-3090", None, 128, 10.0, {}, False),
    "gpt3-175b / 1024 A100": ("gpt3-175b", "dgx-a100-80g", 128, 1536, 60.0, {}, False),
    "llama3-405b-like / 16384 H100, full space": (
        "llama3-405b-like", "dgx-h100", 2048, 2048, 10.0, FULL_405B, False),
    "llama2-7b / 16 H100, full space": (
        "llama2-7b", "dgx-h100", 2, 32, 10.0, SMALL_FULL, True),
    "gpt-2.5b / 8 RTX 3090, full space": (
        "gpt-2.5b", "paper-3090", 2, 16, 10.0, SMALL_FULL, True),
}
#: The exhaustive 405B search is not rerun (about 20 minutes): its time before the
#: relaxed bounds, on the same machine, for the ratio column.
EXHAUSTIVE_405B_S = 1242.0

_CHILD = """
import json, sys, time
import pandas  # the table's library: an import, outside the timed search like the rest
from merak_sim.costs.attention_choice import attention_label
from merak_sim.planner import SearchSpace, search
m, c, n, g, sp, ex = sys.argv[1:7]
space = SearchSpace(**{k: tuple(v) for k, v in json.loads(sp).items()})
t, cpu = time.perf_counter(), time.process_time()
r = search(m, c, int(g), nodes=None if n == "None" else int(n), space=space,
           exhaustive=ex == "1")
dt, dcpu = time.perf_counter() - t, time.process_time() - cpu
b = r.best_config
print(json.dumps({"seconds": dt, "cpu_seconds": dcpu, "counts": r.counts,
                  "best": f"dp{b.dp} tp{b.tp} pp{b.pp} v{b.virtual_stages} "
                          f"mbs{b.micro_batch_size} {b.schedule} {b.recompute} "
                          f"sp={b.sequence_parallel} overlap={b.tp_overlap} zero={b.zero}"
                          + (f" cp={b.cp}" if b.cp > 1 else "")
                          + f" attention={attention_label(b, r.cluster.gpu.name)}"
                          + (" overlap-param-gather" if b.overlap_param_gather else ""),
                  "time_s": r.best_result.iteration_time_s, "mfu": r.best_result.mfu,
                  "explanation": r.explanation() if ex != "1" else []}))
"""


def _run(m, c, n, g, space, exhaustive: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, m, c, str(n), str(g),
                          json.dumps(space), "1" if exhaustive else "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=3600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def speed(repeat: int, skip_175b: bool, only: str | None = None
          ) -> tuple[list[str], list[str]]:
    """Median search time per case in fresh processes, with the exhaustive search's
    time where it runs; markdown lines of the table and of the 405B explanation.
    ``only``: the cases whose name contains it (every case when None)."""
    lines = ["## Search speed (median of fresh-process runs)", "",
             "| case | target | median s | CPU s | runs s | exhaustive s | ratio | "
             "considered | pruned (rule / memory) | bounded | evaluated | SimPy | "
             "cost tables | schedules | best plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    why = []
    for name, (m, c, n, g, target, space, exhaustive) in CASES.items():
        if (skip_175b and "175b" in m) or (only is not None and only not in name):
            continue
        # One run where a run takes long (the 405B space), else the median; every
        # case gets the median when it is the only one timed.
        reps = 1 if "405b" in m and only is None else repeat
        res = [_run(m, c, n, g, space, False) for _ in range(reps)]
        runs = [r["seconds"] for r in res]
        last = res[-1]
        med = statistics.median(runs)
        cpu = statistics.median(r["cpu_seconds"] for r in res)
        if exhaustive:
            full = _run(m, c, n, g, space, True)
            ex_s, ratio = f"{full['seconds']:.2f}", f"{full['seconds'] / med:.1f}x"
            if abs(full["time_s"] - last["time_s"]) > 1e-9 * full["time_s"]:
                ratio += " (best differs!)"
        elif "405b" in m:
            ex_s, ratio = f"{EXHAUSTIVE_405B_S:.0f} (before)", \
                f"{EXHAUSTIVE_405B_S / med:.0f}x"
        else:
            ex_s, ratio = "-", "-"
        k = last["counts"]
        each = ", ".join(f"{x:.2f}" for x in runs)
        print(f"{name}: median {med:.2f} s ({cpu:.2f} s CPU) over {reps} runs ({each}); "
              f"target < {target:.0f} s; exhaustive {ex_s} s; {k}")
        print(f"  best: {last['best']}: {last['time_s']:.3f} s/iteration, MFU "
              f"{last['mfu']:.1%}")
        lines.append(
            f"| {name} | < {target:.0f} s | {med:.2f} | {cpu:.2f} | {each} | {ex_s} | "
            f"{ratio} | {k['considered']} | {k['pruned_rule']} / {k['pruned_memory']} | "
            f"{k['bounded']} | {k['evaluated']} | {k['simulated']} | {k['cost_tables']} | "
            f"{k['schedules']} | {last['best']}: {last['time_s']:.3f} s, MFU "
            f"{last['mfu']:.1%} |")
        if "405b" in m:
            why = ["## Why the 405B plan won", "",
                   f"Best: {last['best']}: {last['time_s']:.3f} s/iteration, MFU "
                   f"{last['mfu']:.1%}. Per knob, the closest other value and what "
                   "stopped it (`merak-sim plan` prints the same):", ""]
            why += [f"- {line}" for line in last["explanation"]]
            print("\n".join(why))
    return lines, why


def quality(rep) -> list[str]:
    """Planner best vs hand-written configurations; markdown lines."""
    from merak_sim.reproduce.merak import describe, hand_configs
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


def _previous_quality(path: Path) -> list[str]:
    """The quality section of the last report, kept when ``--skip-quality``."""
    if not path.exists():
        return []
    text = path.read_text()
    head = "## Planner quality"
    if head not in text:
        return []
    sec = text[text.index(head):].rstrip("\n").splitlines()
    mark = " (from the previous full run)"
    # The title is marked once, however many skipping runs keep the section.
    return ["", sec[0].replace(mark, "") + mark] + sec[1:]


def main() -> None:
    """Run the benchmarks and write the reports."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-175b", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-reproduce", action="store_true")
    ap.add_argument("--only", default=None,
                    help="time only the cases whose name contains this; write nothing")
    args = ap.parse_args()
    if args.only is not None:
        print(f"load average {os.getloadavg()[0]:.1f}")
        speed(args.repeat, args.skip_175b, args.only)
        return
    out = ROOT / "benchmarks" / "results"
    flags = " ".join(a for a in sys.argv[1:])
    load = os.getloadavg()[0]
    lines = ["# Planner benchmark", "",
             f"Command: `.venv/bin/python benchmarks/bench_planner.py {flags}` on the shared "
             f"2-core machine (load average {load:.1f} at the start: wall seconds grow "
             "with the load, the CPU column is the comparable figure).", ""]
    table, why = speed(args.repeat, args.skip_175b)
    lines += table + [""] + why
    rep = None
    if not (args.skip_quality and args.skip_reproduce):
        from merak_sim.reproduce.merak import reproduce_merak

        rep = reproduce_merak(log=print)
    if not args.skip_quality:
        lines += [""] + quality(rep)
    else:
        lines += _previous_quality(out / "planner.md")
    atomic_write_text(out / "planner.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'planner.md'}")
    if not args.skip_reproduce:
        from merak_sim.reproduce.regimes import cpu_tp_overlap, explain_regimes, regime_map
        from merak_sim.reproduce.report import report_markdown

        reg = regime_map(log=print)
        atomic_write_text(out / "reproduce_merak.md", report_markdown(
            rep, reg, explain_regimes(reg), cpu_tp_overlap()))
        print(f"wrote {out / 'reproduce_merak.md'}")


if __name__ == "__main__":
    main()
