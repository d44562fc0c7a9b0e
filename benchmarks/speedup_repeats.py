"""Is the simulated speed-up of Merak's techniques biased, or only noisy? Repeat it.

    .venv/bin/python benchmarks/speedup_repeats.py [--repeats 8] [--out benchmarks/results]
        [--steps 12] [--blocks 3] [--profile-repeats 9] [--no-measure]

The validation suite (``benchmarks/cpu_validation.py``) compares one measured
speed-up of shifted critical path + stage-aware recompute over 1F1B + full recompute
(pp2, the suite's small GPT) with the simulated one. On this shared 2-core machine a
single measured speed-up strays by several points from run to run, so one suite run
cannot tell a bias of the simulation from the machine's drift. This script measures
the pair ``--repeats`` times, each time in a fresh pair of gloo processes (profiled,
trained for real in ``--blocks`` blocks between profiles, simulated from its own
profiles, exactly as in the suite), and appends each repeat to
``speedup_repeats.jsonl`` under ``--out``: measured and simulated iterations, their
errors, the speed-ups and their gap, and the lowest CPU share of the repeat's
iterations (:func:`merak_sim.validation.measured.cpu_shares`).

Prints each repeat and, over every repeat recorded in the file (earlier invocations
included), the mean gap with its standard error: a mean gap within a few standard
errors of zero is no bias; and writes ``speedup_repeats.md`` (``--no-measure``: only
that, from the recorded repeats). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from merak_exec.profiling.cases import MeasureError
from merak_exec.profiling.cpu_suite import BASELINE, MERAK, SPEEDUP_GAP_POINTS, suite
from merak_exec.profiling.measure import measure_cases
from merak_sim.io import atomic_write_text
from merak_sim.validation.compare import compare_run
from merak_sim.validation.history import append_history, read_history, spread
from merak_sim.validation.suite import summarize

ROOT = Path(__file__).resolve().parents[1]

HISTORY = "speedup_repeats.jsonl"


def measure_once(runs: Path, steps: int, blocks: int, repeats: int) -> dict:
    """Measure, simulate and compare the baseline / Merak pair once (fresh processes)."""
    cases = [c for c in suite() if c.name in (BASELINE, MERAK)]
    t = time.perf_counter()
    measure_cases(cases, runs, steps=steps, blocks=blocks, repeats=repeats,
                  timeout_s=900 * max(1.0, steps / 12, repeats / 9))
    secs = time.perf_counter() - t
    reps = {c.name: compare_run(runs / c.name) for c in cases}
    s = summarize(list(reps.values()), (BASELINE, MERAK))
    entry = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             "seconds": round(secs, 1)}
    sums = {name: r.summary() for name, r in reps.items()}
    for name, r in reps.items():
        rs = sums[name]
        entry[name] = {"measured_ms": round(r.measured_iteration_s * 1e3, 3),
                       "predicted_ms": round(r.predicted_iteration_s * 1e3, 3),
                       "error": round(r.iteration_error, 4),
                       "replay_error": round(rs["replay_error"], 4),
                       "contract_error": round(rs["contract_error"], 4),
                       "actions": {k: round(v, 4) for k, v in r.kind_errors().items()},
                       "cpu_share_median": round(rs["cpu_share_median"], 4),
                       "profile_cpu_share": round(rs["profile_cpu_share"], 4)}
    # both runs come from one measurement (one profiler): priced the same way
    entry["backward_pricing"] = sums[BASELINE]["backward_pricing"]
    # how many times the posting probe ran (before every round of blocks since 09:18)
    entry["post_probe_runs"] = int(reps[BASELINE].run.profile.get("machine", {}).get(
        "p2p_post_probe", {}).get("runs", 1))
    entry.update({"speedup_measured": round(s["speedup_measured"], 4),
                  "speedup_predicted": round(s["speedup_predicted"], 4),
                  "gap_points": round(s["speedup_gap_points"], 3),
                  "cpu_share_min": round(s.get("cpu_share_min", float("nan")), 4)})
    return entry


def pooled_text(entries: list[dict]) -> list[str]:
    """Markdown: one row per recorded repeat, then the means with standard errors."""
    lines = [f"| repeat (UTC) | {BASELINE} meas / pred ms | {MERAK} meas / pred ms | "
             "speed-up measured | simulated | gap points | lowest CPU share |",
             "|---|---|---|---|---|---|---|"]
    for e in entries:
        b, m = e[BASELINE], e[MERAK]
        lines.append(f"| {e['date']} | {b['measured_ms']:.1f} / {b['predicted_ms']:.1f} | "
                     f"{m['measured_ms']:.1f} / {m['predicted_ms']:.1f} | "
                     f"{e['speedup_measured'] * 100:+.1f} % | "
                     f"{e['speedup_predicted'] * 100:+.1f} % | {e['gap_points']:+.1f} | "
                     f"{e.get('cpu_share_min', float('nan')):.3f} |")
    if len(entries) < 2:
        return lines
    gaps = [e["gap_points"] for e in entries]
    gap, gap_sd, gap_se = spread(gaps)
    within = sum(abs(g) <= SPEEDUP_GAP_POINTS for g in gaps)
    meas = spread([100 * e["speedup_measured"] for e in entries])
    eb = spread([100 * e[BASELINE]["error"] for e in entries])
    em = spread([100 * e[MERAK]["error"] for e in entries])
    lines += ["", f"Over {len(entries)} repeats: measured speed-up {meas[0]:+.1f} % "
              f"(standard deviation {meas[1]:.1f} points); iteration error {BASELINE} "
              f"{eb[0]:+.1f} % (standard error {eb[2]:.1f}), {MERAK} {em[0]:+.1f} % "
              f"(standard error {em[2]:.1f}); speed-up gap {gap:+.1f} points on average, "
              f"standard error {gap_se:.1f}, one repeat's standard deviation {gap_sd:.1f}, "
              f"median {statistics.median(gaps):+.1f}; within the {SPEEDUP_GAP_POINTS}-point "
              f"limit in {within} of {len(gaps)} repeats."]
    return lines


#: How the backwards were priced in a repeat (recorded since the profile also times
#: them adding into existing gradients; older repeats priced every backward fresh;
#: "accumulating": 10 repeats of 2026-12-01 07:57-08:09, whose profiles timed that state
#: on its own, within the noise of the fresh figures; "paired-delta" since).
PRICING = {"fresh": "every backward priced with fresh gradients",
           "accumulating": "a rank's backwards after its first of the step priced from a "
                           "separate profile of backwards adding into existing gradients",
           "paired-delta": "a rank's backwards after its first of the step priced with the "
                           "profiled extra cost of adding into existing gradients (paired "
                           "differences)"}


def decomposition_text(entries: list[dict]) -> list[str]:
    """Markdown: where each run's iteration error comes from, pooled over the repeats
    that recorded it, one section per way the backwards were priced (:data:`PRICING`).
    The replay error (every compute action at its measured duration in the run) is
    what the schedule, communication and posting model get wrong; each action kind's
    error is the profile's (action times measured between the blocks against the same
    actions inside the run). A mean several standard errors from zero is a bias; one
    within about two is the machine's noise."""
    rec = [e for e in entries if "actions" in e[BASELINE] and "actions" in e[MERAK]]
    groups: dict[tuple[str, bool], list[dict]] = {}
    for e in rec:
        groups.setdefault((e.get("backward_pricing", "fresh"), e.get("post_probe_runs", 1) > 1),
                          []).append(e)

    def cell(xs):
        m, _, se = spread([100 * x for x in xs])
        return f"{m:+.1f} % ({se:.1f})"

    lines: list[str] = []
    for (pricing, probed), grp in groups.items():
        if len(grp) < 2:
            continue
        gap, _, gap_se = spread([e["gap_points"] for e in grp])
        how = PRICING[pricing] + ("; posting probed before every round of blocks" if probed
                                  else "")
        lines += ["", f"Where the iteration error comes from, {how} ({len(grp)} "
                  f"repeats; mean, with its standard error in brackets; speed-up gap "
                  f"{gap:+.1f} points ({gap_se:.1f})):", "",
                  "| run | iteration error | replay error (schedule + communication model) | "
                  "contract-only error |", "|---|---|---|---|"]
        for name in (BASELINE, MERAK):
            lines.append(f"| {name} | {cell([e[name]['error'] for e in grp])} | "
                         f"{cell([e[name]['replay_error'] for e in grp])} | "
                         f"{cell([e[name]['contract_error'] for e in grp])} |")
        lines += ["", "| run | stage and action kind | profiled against in-run duration | "
                  "repeats |", "|---|---|---|---|"]
        for name in (BASELINE, MERAK):
            keys = dict.fromkeys(k for e in grp for k in e[name]["actions"])
            for k in keys:
                xs = [e[name]["actions"][k] for e in grp if k in e[name]["actions"]]
                if len(xs) >= 2:
                    lines.append(f"| {name} | {k} | {cell(xs)} | {len(xs)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure the pair ``--repeats`` times and report them with the earlier ones."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--repeats", type=int, default=8, help="independent measurements")
    ap.add_argument("--steps", type=int, default=12, help="timed iterations per case")
    ap.add_argument("--blocks", type=int, default=3, help="blocks between profiles")
    ap.add_argument("--profile-repeats", type=int, default=9,
                    help="profiler repeats per action in each profile")
    ap.add_argument("--no-measure", action="store_true",
                    help="only rewrite the report from the recorded repeats")
    a = ap.parse_args(argv)
    if min(a.repeats, a.steps, a.blocks, a.profile_repeats) < 1 or a.steps < a.blocks:
        ap.error("--repeats, --steps, --blocks and --profile-repeats must be positive "
                 "and --steps at least --blocks")
    out = Path(a.out)
    hist = out / HISTORY
    if a.no_measure and not hist.exists():
        print(f"speedup_repeats.py: error: {hist} does not exist; measure first (drop "
              "--no-measure)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for i in range(0 if a.no_measure else a.repeats):
        try:
            e = measure_once(out / "speedup_repeat_runs", a.steps, a.blocks,
                             a.profile_repeats)
        except MeasureError as err:
            print(f"speedup_repeats.py: error: {err}", file=sys.stderr)
            return 2
        e["command"] = "python benchmarks/speedup_repeats.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        append_history(hist, e)
        print(f"repeat {i + 1}/{a.repeats}: {BASELINE} error {e[BASELINE]['error'] * 100:+5.1f} "
              f"%, {MERAK} error {e[MERAK]['error'] * 100:+5.1f} %, speed-up measured "
              f"{e['speedup_measured'] * 100:+5.1f} % simulated "
              f"{e['speedup_predicted'] * 100:+5.1f} %, gap {e['gap_points']:+5.1f} points",
              flush=True)
    entries = read_history(hist)
    pooled = pooled_text(entries)
    text = pooled + decomposition_text(entries)
    atomic_write_text(out / "speedup_repeats.md", "\n".join(
        ["# Speed-up repeated: simulated against measured", "",
         "Commands: " + ", ".join(f"`{c.strip()}`" for c in dict.fromkeys(
             e.get("command", "") for e in entries))
         + f" (each row one repeat in fresh processes; {len(entries)} recorded in "
         f"`{HISTORY}`).", "", *text, ""]))
    print(pooled[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
