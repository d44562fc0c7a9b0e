"""Run merak-sim on bad or unusual inputs and print a markdown table of what each
does: exit status, seconds, and the first line it prints (stderr first).

    python benchmarks/bad_inputs.py > docs/bad_inputs.md

Every input must answer within the time limit and without a traceback; the script
exits 1 otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LIMIT_S = 60
M = ["--model", "gpt-1.5b", "--cluster", "paper-3090"]
SIM = ["simulate", *M, "--dp", "16", "--tp", "1", "--pp", "4", "--micro-batch-size", "1",
       "--global-batch-size", "128", "--schedule", "1f1b", "--recompute", "full"]
SCH = ["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]
PLAN = ["plan", *M, "--global-batch-size", "32", "--tp", "1", "--pp", "4", "--schedules",
        "1f1b", "--micro-batch-sizes", "1", "--top", "1", "--no-confirm"]
COSTS = ["costs", *M]


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def cases(tmp: Path) -> list[list[str]]:
    """The inputs tried, each an argv after ``merak-sim``."""
    bad_json = tmp / "bad.json"
    bad_json.write_text("{not json")
    empty = tmp / "empty.json"
    empty.write_text("{}")
    plan = tmp / "plan.json"
    return [
        [], ["--version"], ["-h"], ["bogus"], ["simulate"], ["schedule", "-h"],
        # schedule
        _set(SCH, "--pp", "100000"), _set(SCH, "--microbatches", "10000000"),
        _set(SCH, "--pp", "0"), _set(SCH, "--pp", "-3"), _set(SCH, "--pp", "x"),
        _set(SCH, "--microbatches", "0"), [*SCH, "--recompute", "-1"],
        [*SCH, "--recompute", "2.5"], [*SCH, "--recompute", "nan"],
        [*SCH, "--recompute", "stage-aware:1.5"], [*SCH, "--recompute", "stage-aware:0.5"],
        [*SCH, "--recompute", "stage-aware:0.5,0.2"], [*SCH, "--recompute", "selective"],
        [*SCH, "--recompute", "full:0.5"], [*SCH, "--virtual-stages", "0"],
        _set(SCH, "--schedule", "bogus"),
        ["schedule", "--schedule", "shifted-critical-path", "--pp", "8", "--microbatches",
         "4"],
        ["schedule", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6",
         "--virtual-stages", "2"],
        # V-shaped schedules need two chunks, two ranks and (dualpipev) M >= 2 pp
        _set(SCH, "--schedule", "zb-v"), [*_set(SCH, "--schedule", "zb-v"), "--virtual-stages",
                                          "3"],
        [*_set(_set(SCH, "--schedule", "dualpipev"), "--microbatches", "6"),
         "--virtual-stages", "2"],
        [*_set(_set(SCH, "--schedule", "zb-v"), "--pp", "1"), "--virtual-stages", "2"],
        [*SCH, "--gantt", "/proc/nope/g.png"], [*SCH, "--csv", "/proc/nope/s.csv"],
        [*SCH, "--json-out", "/proc/nope/s.json"], [*SCH, "--csv", str(tmp)],
        [*SCH, "--json"],
        # simulate
        _set(SIM, "--global-batch-size", "20000000"),
        [*SIM, "--mode", "full", "--global-batch-size", "16384"],
        _set(SIM, "--global-batch-size", "0"), _set(SIM, "--global-batch-size", "100"),
        _set(SIM, "--micro-batch-size", "0"), _set(SIM, "--dp", "0"),
        _set(SIM, "--dp", "1000"), _set(SIM, "--tp", "3"), _set(SIM, "--pp", "1000"),
        _set(SIM, "--recompute", "stage-aware:2"), _set(SIM, "--recompute", "bogus"),
        _set(SIM, "--recompute", "stage-aware:0.1,0.2"),
        _set(SIM, "--model", "gpt-9b"), _set(SIM, "--cluster", "moon"),
        _set(SIM, "--model", str(bad_json)), _set(SIM, "--model", str(empty)),
        _set(SIM, "--model", str(tmp / "missing.json")),
        [*SIM, "--chrome-trace", "/proc/nope/t.json"], [*SIM, "--gantt", "/proc/nope/g.png"],
        [*SIM, "--json-out", "/proc/nope/r.json"], [*SIM, "--trace", str(tmp / "no.json")],
        [*SIM, "--slow-gpu", "3"], [*SIM, "--slow-gpu", "x:y"], [*SIM, "--nodes", "0"],
        [*SIM, "--zero", "5"], [*SIM, "--tp-overlap-parts", "0"],
        _set(SIM, "--schedule", "zb-v"), [*_set(SIM, "--schedule", "dualpipev"),
                                          "--virtual-stages", "4"],
        ["simulate", "--plan", str(tmp / "missing.json")], ["simulate", "--plan",
                                                            str(bad_json)],
        ["simulate", "--plan", str(empty)], ["simulate", *M, "--dp", "16"],
        # costs
        _set([*COSTS, "--tp", "1"], "--tp", "3"), [*COSTS, "--pp", "80", "--nodes", "20"],
        [*COSTS, "--micro-batch-size", "0"], [*COSTS, "--recompute", "stage-aware:1.5"],
        [*COSTS, "--global-batch-size", "20000000", "--pp", "4"],
        [*COSTS, "--json-out", "/proc/nope/c.json"], [*COSTS, "--zero", "-1"],
        [*COSTS, "--trace", str(bad_json)],
        # plan
        [*PLAN, "--memory-margin", "1.5"], [*PLAN, "--memory-margin", "-0.5"],
        [*PLAN, "--memory-margin", "1"], [*PLAN, "--out", "/proc/nope/p.json"],
        [*PLAN, "--out", str(plan), "--csv", "/proc/nope/c.csv"],
        [*PLAN, "--json-out", "/proc/nope/j.json"], [*PLAN, "--out", str(tmp)],
        _set(PLAN, "--global-batch-size", "0"), _set(PLAN, "--global-batch-size", "7"),
        _set(PLAN, "--tp", "0"), _set(PLAN, "--tp", "a,b"), _set(PLAN, "--top", "0"),
        _set(PLAN, "--schedules", "bogus"),
        ["plan", *M, "--global-batch-size", "20000000", "--out", str(plan)],
        ["plan", "--model", "gpt-20b", "--cluster", "paper-3090", "--nodes", "1",
         "--global-batch-size", "8", "--out", str(plan)],
        [*PLAN, "--memory-margin", "0.8", "--out", str(plan)],
        # what-ifs, hardware and the planner's answers
        [*SIM, "--mode", "full", "--degrade-link", "node99.nic.out:0.1"],
        [*SIM, "--mode", "full", "--degrade-link", "gpu999.out:0.5"],
        [*SIM, "--mode", "full", "--slow-gpu", "5:2", "--slow-gpu", "5:3"],
        [*SIM, "--degrade-link", "node0.nic.out:0.5"], [*SIM, "--ep", "2"],
        [*SIM, "--dtype", "nvfp4"], [*SIM, "--cp", "2", "--cp-comm", "bogus"],
        [*SIM, "--tp-overlap", "te-chunked"], [*PLAN, "--dtype", "fp8"],
        ["plan", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--global-batch-size", "64",
         "--no-confirm", "--out", str(plan)],
        ["dispatch", str(plan), "--launcher", "slurm", "--script", "train.py --steps 100",
         "--out", str(tmp / "job")],
        # demo, dispatch, validate
        ["demo", "--pp", "0"], ["demo", "--out", "/proc/nope"],
        ["demo", "--pp", "100000", "--out", str(tmp / "demo")],
        ["validate", "--run", str(tmp), "--gantt", "/proc/nope/g.png"],
        ["dispatch", str(tmp / "missing.json"), "--nodes", "1", "--gpus-per-node", "1"],
        ["validate", "--run", str(tmp / "missing")],
    ]


def run_one(argv: list[str], env: dict) -> tuple[int | str, float, str]:
    """(exit status or "timeout", seconds, first line printed)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "merak_sim.cli", *argv],
                           capture_output=True, text=True, timeout=LIMIT_S, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    dt = time.perf_counter() - t0
    if "Traceback" in p.stderr:
        return "traceback", dt, p.stderr.strip().splitlines()[-1]
    text = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return p.returncode, dt, text[0].strip() if text else ""


def main() -> int:
    """Run every case, print the table; 1 if any hung or printed a traceback."""
    env = dict(os.environ, COLUMNS="80")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        todo = cases(tmp)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda a: run_one(a, env), todo))
    print("# merak-sim: bad and unusual inputs\n")
    print(f"{len(todo)} inputs, each run as `merak-sim ARGS` (output piped, COLUMNS=80); "
          "TMP is a scratch folder. Written by `python benchmarks/bad_inputs.py`.\n")
    print("| # | arguments | exit | s | first line printed |")
    print("|---|---|---|---|---|")
    bad = 0
    for i, (argv, (rc, dt, line)) in enumerate(zip(todo, results, strict=True), 1):
        bad += rc in ("timeout", "traceback")
        args = " ".join(argv).replace(str(tmp), "TMP") or "(none)"
        line = line.replace(str(tmp), "TMP").replace("|", "\\|")
        print(f"| {i} | `{args}` | {rc} | {dt:.1f} | {line} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
