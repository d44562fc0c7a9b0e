"""CPU validation suite: profile, run for real, simulate, compare.

    .venv/bin/python benchmarks/cpu_validation.py [--out benchmarks/results] [--quick]
        [--steps 12] [--blocks 6] [--repeats 8] [--pairs 3] [--no-measure]

On this machine (cluster preset "local-cpu": gloo over loopback, 2 processes with one
torch thread each on 2 cores) and a small built-in GPT (8 layers, hidden 128, 4
heads, vocab 512, sequence 128, micro-batch 2, 4 micro-batches per pipeline), every
configuration below is profiled (the profiler step of
:mod:`merak_exec.profiling.measure`), trained for real (12 timed iterations in 6
blocks, each between two profiles, the cases taking turns block by block),
simulated from its profiles and compared (:mod:`merak_sim.validation`):

- pp2 with 1f1b, gpipe, 1f1b-split (case pp2-zbh1-none; no recompute) and
  shifted-critical-path with stage-aware recompute;
- pp2 1f1b with recompute full and stage-aware (and none above);
- tp2 without and with sub-pipelined TP;
- dp2;
- ``--pairs`` - 1 repeats of the 1F1B + full recompute / shifted critical path +
  stage-aware pair (``~1``, ``~2``, ...), for the speed-up (median over the pairs) and
  the repeatability table.

Writes ``cpu_validation.md`` (error tables and targets) and ``cpu_validation.csv``
(one row per configuration) under ``--out``, appends the run's targets to
``cpu_validation_history.jsonl`` there (how often they hold across runs), and writes
the run directories under ``--out/cpu_validation_runs/`` (each can be re-validated
with ``merak-sim validate --run DIR``) with the side-by-side Gantt charts next to them.
Figures are printed; nothing is asserted (the tests check structure only).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

from merak_exec.profiling.cases import MeasureError
from merak_exec.profiling.cpu_suite import (
    BASELINE,
    MERAK,
    SPEEDUP_GAP_POINTS,
    TARGETS,
    suite,
)
from merak_exec.profiling.measure import measure_cases
from merak_sim.io import atomic_write_text
from merak_sim.validation.compare import compare_run
from merak_sim.validation.history import append_history, pooled, read_history, spread
from merak_sim.validation.pricing import ValidationError
from merak_sim.validation.rundir import RunDirError
from merak_sim.validation.suite import repeat_pairs, summarize

ROOT = Path(__file__).resolve().parents[1]


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _targets(summary: dict) -> list[str]:
    """The targets table. The last column is the measurement's own noise (one
    standard error, when :func:`add_noise` put it in ``summary``): the worst run's
    from its blocks, the speed-up's from its rounds; a miss by less than about twice
    that is as likely the machine's drift as the model's error."""
    med_se = summary.get("iteration_median_se", float("nan"))
    worst_se = summary.get("iteration_worst_se", float("nan"))
    se = {"iteration_median_abs_error": f"{med_se * 100:.1f} % (median over the runs)"
          if med_se == med_se else "-",
          "iteration_worst_abs_error": f"{worst_se * 100:.1f} % ({summary['iteration_worst_run']})"
          if worst_se == worst_se else "-"}
    lines = ["| target | value | limit | met | noise (1 standard error) |",
             "|---|---|---|---|---|"]
    held = _held(summary)
    for k, lim in TARGETS.items():
        lines.append(f"| {k} | {summary[k] * 100:.1f} % | {lim * 100:.0f} % | "
                     f"{'yes' if held[k] else 'NO'} | {se.get(k, '-')} |")
    if "speedup_measured" in summary:
        gap = summary["speedup_gap_points"]
        sp = summary.get("speedup_se_points", float("nan"))
        lines.append(f"| speed-up {MERAK} over {BASELINE} (median of "
                     f"{summary['speedup_pairs']} back-to-back pairs) | measured "
                     f"{summary['speedup_measured'] * 100:+.1f} %, simulated "
                     f"{summary['speedup_predicted'] * 100:+.1f} % (gap {gap:+.1f} points) | "
                     f"{SPEEDUP_GAP_POINTS} points | {'yes' if held['speedup'] else 'NO'} | "
                     + (f"{sp:.1f} points |" if sp == sp else "- |"))
    return lines


def _held(summary: dict) -> dict[str, bool]:
    """Whether each target holds (the speed-up's holds when the suite did not measure
    it)."""
    out = {k: summary[k] <= lim for k, lim in TARGETS.items()}
    out["speedup"] = abs(summary.get("speedup_gap_points", 0.0)) <= SPEEDUP_GAP_POINTS
    return out


def record_history(path: Path, summary: dict, when: str, command: str, seconds: float,
                   errors: dict[str, float] | None = None,
                   backward_pricing: str | None = None) -> dict:
    """Append this run's targets and each configuration's iteration error (``errors``,
    by run name) to ``path`` (JSON lines, rewritten atomically): on a noisy machine
    how often the targets hold is itself a figure, and errors pooled over runs
    (:func:`pooled`) separate the model's bias from the machine's drift.
    ``backward_pricing``: "paired-delta" when the profiles also measured the extra
    cost of a backward adding into existing gradients (added to every backward but a
    rank's first), "fresh" before that. Returns the entry."""
    entry = {"date": when, "command": command, "seconds": round(seconds),
             **{k: round(v, 4) if v == v else None  # JSON has no NaN
                for k, v in summary.items() if isinstance(v, float)},
             "speedup_pairs": summary.get("speedup_pairs", 0),
             "iteration_worst_run": summary["iteration_worst_run"],
             "all_met": all(_held(summary).values()),
             "errors": {k: round(v, 4) for k, v in (errors or {}).items()}}
    if backward_pricing:
        entry["backward_pricing"] = backward_pricing
    append_history(path, entry)
    return entry


def pooled_text(p: dict, history: list[dict] = ()) -> list[str]:
    """The pooled-errors section of the report (nothing without errors); ``history``:
    the entries pooled, to say how their backwards were priced."""
    if not p["configurations"]:
        return []
    acc = sum(e.get("backward_pricing", "fresh") != "fresh" for e in history)
    how = (f"{acc} of them with every backward after a rank's first priced adding into "
           "existing gradients, the others with fresh gradients throughout; " if acc else "")
    lines = [f"Pooled over the {p['runs']} suite runs recorded in "
             f"`cpu_validation_history.jsonl` ({how}a configuration's repeats within a run "
             "averaged first: they share the run's machine state): "
             "a mean error several standard errors from zero is a bias of the model or "
             "the profile; a single run's error within a few standard deviations of the "
             "mean is the machine's drift.", "",
             "| configuration | runs (measurements) | mean error | standard deviation "
             "| standard error |", "|---|---|---|---|---|"]
    for name, r in p["configurations"].items():
        lines.append(f"| {name} | {r['n']} ({r['measurements']}) | {r['mean'] * 100:+.1f} % "
                     f"| {r['sd'] * 100:.1f} % | {r['se'] * 100:.1f} % |")
    lines += ["", f"Pooled: median absolute mean error {p['median_abs_mean_error'] * 100:.1f} %, "
              f"worst {p['worst_abs_mean_error'] * 100:.1f} %"
              + (f"; speed-up gap {p['speedup_gap_mean_points']:+.1f} points on average "
                 f"(standard error {p['speedup_gap_se_points']:.1f})"
                 if "speedup_gap_mean_points" in p else "") + "."]
    return lines


def _probe(machine: dict) -> str:
    p = machine.get("p2p_post_probe", {})
    runs = f"{p['runs']} runs spread over the measurement, " if p.get("runs", 1) > 1 else ""
    return (f"{runs}{p.get('blocked', 0)} of {p.get('blocked', 0) + p.get('plain', 0)} "
            "postings blocked")


def _repeatability(reports) -> list[str]:
    """The measurement's own noise: configurations measured more than once (``name``,
    ``name~1``, ...) and how far apart their measured iterations are; no prediction
    can be expected to agree with every one of them more closely than half that."""
    groups: dict[str, list] = {}
    for r in reports:
        groups.setdefault(r.name.split("~")[0], []).append(r)
    lines = ["Repeatability (identical configurations measured in the same suite):", "",
             "| configuration | measured ms | spread (max-min)/median | predicted ms |",
             "|---|---|---|---|"]
    for name, rs in groups.items():
        if len(rs) < 2:
            continue
        ms = sorted(x.measured_iteration_s * 1e3 for x in rs)
        med = ms[len(ms) // 2]
        ps = ", ".join(f"{x.predicted_iteration_s * 1e3:.1f}" for x in rs)
        lines.append(f"| {name} | {', '.join(f'{m:.1f}' for m in ms)} | "
                     f"{(ms[-1] - ms[0]) / med * 100:.1f} % | {ps} |")
    return lines


def _blocks(s: dict) -> str:
    """Per block errors of one run, min / median / max ("-" without blocks)."""
    if not s.get("blocks"):
        return "-"
    return " / ".join(f"{s[k] * 100:+.0f}" for k in ("block_error_min", "block_error_median",
                                                     "block_error_max")) + " %"


def speedup_rounds(reports, pairs) -> dict | None:
    """The speed-up round by round: block b of the baseline against block b of Merak
    (in each pair measured seconds apart), each side also predicted from the profiler
    steps bracketing its block. Returns the measured and simulated speed-ups and the
    gaps (points) per round, the standard deviation of a measured round and the
    standard error of their mean (points); None without blocks."""
    by = {r.name: r for r in reports}
    meas, pred = [], []
    for b, n in pairs:
        if b not in by or n not in by or by[b].blocks.empty or by[n].blocks.empty:
            continue
        xb, xn = by[b].blocks.set_index("block"), by[n].blocks.set_index("block")
        for k in xb.index.intersection(xn.index):
            meas.append(xb.loc[k, "measured_s"] / xn.loc[k, "measured_s"] - 1)
            pred.append(xb.loc[k, "predicted_s"] / xn.loc[k, "predicted_s"] - 1)
    if not meas:
        return None
    _, sd, se = spread([100 * m for m in meas])
    return {"measured": meas, "predicted": pred,
            "gaps": [100 * (p - m) for m, p in zip(meas, pred, strict=True)],
            "sd_points": sd, "se_points": se}


def add_noise(summary: dict, reports, pairs) -> dict:
    """``summary`` with the measurement's noise: ``iteration_median_se`` (the median
    over the distinct runs of each one's standard error over its blocks),
    ``iteration_worst_se`` (the worst run's) and ``speedup_se_points`` (of the speed-up
    over its rounds), where the runs recorded blocks."""
    se = {r.name: r.summary()["block_error_se"] for r in reports}
    out = dict(summary)
    known = [v for k, v in se.items() if "~" not in k and v == v]  # NaN: no blocks
    out["iteration_median_se"] = statistics.median(known) if known else float("nan")
    out["iteration_worst_se"] = se[summary["iteration_worst_run"]]
    rounds = speedup_rounds(reports, pairs)
    if rounds is not None:
        out["speedup_se_points"] = rounds["se_points"]
    return out


def _rounds_text(r: dict | None) -> list[str]:
    """One paragraph on :func:`speedup_rounds` (nothing without rounds)."""
    if r is None:
        return []
    meas, pred, med = r["measured"], r["predicted"], statistics.median
    return [f"Speed-up round by round ({len(meas)} rounds: block b of a baseline run "
            "against block b of its Merak pair, each predicted from the profiler steps "
            f"bracketing its block): measured {min(meas) * 100:+.1f} to "
            f"{max(meas) * 100:+.1f} % (median {med(meas) * 100:+.1f} %), simulated "
            f"{min(pred) * 100:+.1f} to {max(pred) * 100:+.1f} % (median "
            f"{med(pred) * 100:+.1f} %), gap median {med(r['gaps']):+.1f} points; standard "
            f"deviation of a measured round {r['sd_points']:.1f} points, so the standard "
            f"error of a speed-up averaged over them is about {r['se_points']:.1f} points."]


def report(reports, summary: dict, machine: dict, seconds: float, command: str,
           load: list[float] | None = None, low=None, low_summary=None,
           when: str = "", pairs=(), history: list[dict] = ()) -> str:
    """The markdown report: suite table, targets, per-run details."""
    pct = lambda x: f"{x * 100:+.1f} %"  # noqa: E731
    lines = ["# CPU validation: prediction versus measurement", "",
             f"Command: `{command}` ({seconds:.0f} s, "
             f"{when}; 1-minute load average "
             f"{' -> '.join(f'{x:.1f}' for x in (load or []))} on 2 cores).", "",
             "Machine parameters measured by the profiler step: gloo p2p one-way "
             f"alpha {machine.get('p2p_alpha_s', 0) * 1e6:.0f} us, "
             f"{machine.get('p2p_s_per_byte', 0) * 1e9:.3f} ns/byte; contention factor "
             f"(matmul loop, all ranks busy / one rank) {machine.get('contention_factor', 1):.2f}; "
             f"posting through the runtime (1F1B probe, {_probe(machine)}): "
             f"{machine.get('p2p_post_s', 0) * 1e3:.3f} ms per operation, a receive against "
             "a pending send of a computing peer "
             f"{machine.get('p2p_post_blocked_s', machine.get('p2p_post_s', 0)) * 1e3:.3f} ms "
             "(mean).",
             "", "Runs named `~1`, `~2` are repeats of the baseline / Merak pair (every case "
             "takes turns with the others, block by block), used for the speed-up and the "
             "repeatability table only; the targets are computed over the distinct "
             "configurations.", "",
             "Statistic: the profile's mean action times against the median timed iteration "
             "and each action's mean duration in the run (`merak-sim validate` default). "
             "*Replay* re-runs the same simulation with every compute action at its mean "
             "duration measured in the run: its error is what the schedule, communication "
             "and posting model alone get wrong; the rest of the error comes from the "
             "profile (action times measured outside the run). *Per block*: each block "
             "of timed iterations against the prediction from the two profiler steps "
             "bracketing it (min / median / max over the blocks): their spread is the "
             "machine's drift, a bias shared by every block is the model's or the "
             "profile's.", "",
             "| run | measured ms (min-max) | predicted ms | error | replay error | "
             "contract-only error | per block error | action median abs error | "
             "activation worst error | bubble err ms | comm err ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        s = r.summary()
        lines.append(f"| {s['run']} | {s['measured_ms']:.1f} ({s['measured_min_ms']:.0f}-"
                     f"{s['measured_max_ms']:.0f}) | {s['predicted_ms']:.1f} | "
                     f"{pct(s['error'])} | {pct(s['replay_error'])} | "
                     f"{pct(s['contract_error'])} | {_blocks(s)} | "
                     f"{s['action_median_abs_error'] * 100:.1f} % | "
                     f"{s['activation_max_abs_error'] * 100:.1f} % | {s['bubble_error_ms']:+.1f} | "
                     f"{s['comm_error_ms']:+.1f} |")
    if "cpu_share_min" in summary:
        lines += ["", "CPU share (each rank's main-thread CPU seconds over its busy compute "
                  "seconds, per timed iteration, every run without tensor parallelism): median "
                  f"{summary['cpu_share_median']:.3f}, lowest {summary['cpu_share_min']:.3f}. "
                  "Near 1, no other process took a rank's core while it computed: a slow "
                  "iteration with a share near 1 ran slower on the CPU itself (memory and "
                  "caches shared with the other rank and the host), not descheduled."]
    lines += ["", *_targets(summary), "", *_repeatability(reports), "",
              *_rounds_text(speedup_rounds(reports, pairs))]
    if history:
        lines += ["", *pooled_text(pooled(history), history)]
    if low:
        lines += ["", "Lower envelope (`--statistic min`: the fastest profile samples against "
                  "the fastest timed iteration and the fastest occurrence of each action):", "",
                  "| run | fastest measured ms | predicted ms | error | action median abs "
                  "error |", "|---|---|---|---|---|"]
        for r in low:
            s = r.summary()
            lines.append(f"| {s['run']} | {s['measured_ms']:.1f} | {s['predicted_ms']:.1f} | "
                         f"{pct(s['error'])} | {s['action_median_abs_error'] * 100:.1f} % |")
        lines += ["", *_targets(low_summary)]
    lines.append("")
    for r in reports:
        lines.append(r.to_markdown())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the suite and write the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--quick", action="store_true", help="small GPT, 3 cases")
    ap.add_argument("--steps", type=int, default=12, help="timed iterations per case")
    ap.add_argument("--blocks", type=int, default=6,
                    help="blocks of timed iterations, with a profile before and after each")
    ap.add_argument("--repeats", type=int, default=8,
                    help="profiler repeats per action in each profile")
    ap.add_argument("--pairs", type=int, default=3,
                    help="baseline / Merak pairs for the speed-up (more: a tighter median)")
    ap.add_argument("--no-measure", action="store_true",
                    help="re-validate the existing run directories only")
    a = ap.parse_args(argv)
    if min(a.steps, a.blocks, a.repeats, a.pairs) < 1 or a.steps < a.blocks:
        ap.error("--steps, --blocks, --repeats and --pairs must be positive and "
                 "--steps at least --blocks")
    try:
        return _run(a, argv)
    except (RunDirError, ValidationError, MeasureError) as e:
        # e.g. --no-measure where no suite was measured: one line, nothing written
        print(f"cpu_validation.py: error: {e}", file=sys.stderr)
        return 2


def recorded_command(argv: list[str]) -> str:
    """The command as the report and the history record it: a path outside the
    repository (a scratch ``--out``) is written ``DIR``, so the committed record names
    nothing beyond the repository."""
    root = Path(__file__).resolve().parent.parent

    def shown(arg: str) -> str:
        p = Path(arg)
        if p.is_absolute() and not p.resolve().is_relative_to(root):
            return "DIR"
        return arg
    return " ".join(["python benchmarks/cpu_validation.py", *map(shown, argv)]).strip()


def _run(a: argparse.Namespace, argv: list[str] | None) -> int:
    """Measure (unless ``--no-measure``), validate and write the report."""
    out = Path(a.out)
    runs = out / "cpu_validation_runs"
    cases = suite(a.quick, a.pairs)
    t = time.perf_counter()
    load = [os.getloadavg()[0]]  # other work on this shared 2-core machine, for the record
    if not a.no_measure:
        # The default suite takes 10-13 min here; the limit grows with the work asked.
        work = len(cases) / 13 * max(a.blocks / 6, a.steps / 12, a.repeats / 8)
        measure_cases(cases, runs, steps=a.steps, blocks=a.blocks, repeats=a.repeats,
                      timeout_s=1800 * max(1.0, work))
    secs = time.perf_counter() - t
    load.append(os.getloadavg()[0])
    cmd = recorded_command(argv if argv is not None else sys.argv[1:])
    # Where the measurement was taken: kept with the runs, so re-validating them
    # (--no-measure) reports the measuring command, its time and the machine's load.
    record = runs / "suite.json"
    if a.no_measure and record.exists():
        m = json.loads(record.read_text())
        cmd, secs, load, when = m["command"], m["seconds"], m["load"], m["date"]
    else:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        if not a.no_measure:
            atomic_write_text(record, json.dumps({"command": cmd.strip(), "seconds": secs,
                                                  "load": load, "date": when}))
    reports = [compare_run(runs / c.name) for c in cases]
    for r in reports:
        r.plot(runs / f"{r.name}.png")
    # The lower envelope: fastest samples on both sides (other work on this shared
    # machine can only lengthen a measurement), a secondary view of the same runs.
    low = [compare_run(runs / c.name, statistic="min") for c in cases]
    pairs = repeat_pairs([c.name for c in cases], BASELINE, MERAK)
    distinct = [r for r in reports if "~" not in r.name]
    summary = summarize(distinct, pairs)
    summary.update({k: v for k, v in summarize(reports, pairs).items()
                    if k.startswith("speedup")})
    summary = add_noise(summary, reports, pairs)
    machine = reports[0].run.profile.get("machine", {})
    low_summary = summarize([r for r in low if "~" not in r.name])
    low_summary.update({k: v for k, v in summarize(low, pairs).items()
                        if k.startswith("speedup")})
    history = out / "cpu_validation_history.jsonl"
    sums = [r.summary() for r in reports]
    if not a.no_measure:
        # one measurement, one profiler: every run was priced the same way
        record_history(history, summary, when, cmd.strip(), secs,
                       {r.name: r.iteration_error for r in reports},
                       sums[0]["backward_pricing"])
    atomic_write_text(out / "cpu_validation.md", report(reports, summary, machine, secs,
                                                        cmd.strip(), load, low, low_summary,
                                                        when, pairs, read_history(history)))
    atomic_write_text(out / "cpu_validation.csv", _csv(sums))
    for s in sums:
        print(f"{s['run']:24s} measured {s['measured_ms']:8.1f} ms  predicted "
              f"{s['predicted_ms']:8.1f} ms  error {s['error'] * 100:+6.1f} %  replay "
              f"{s['replay_error'] * 100:+6.1f} %  blocks {_blocks(s):18s}  actions "
              f"{s['action_median_abs_error'] * 100:5.1f} %  activation "
              f"{s['activation_max_abs_error'] * 100:4.1f} %")
    for k, v in summary.items():
        print(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
