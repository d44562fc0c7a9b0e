"""Simulator speed at scale (issue 34): micro-batch passes per second of the exact
evaluator and of the SimPy engine, and the published runs end to end through the CLI,
each side by side with a previous release in the same run.

    git worktree add /tmp/prev <commit before the change>   # once
    .venv/bin/python benchmarks/bench_scale.py --prev /tmp/prev [--repeat 5] [--quick]

Printed, never asserted (timings depend on the machine's load, shown first):

1. Passes per second over pp 8-64, micro-batches 8-4,096, virtual stages 1-4
   (1F1B for v = 1, interleaved 1F1B above; the two trees in turn, shape by shape),
   each a fresh, cold evaluation
   (:func:`merak_sim.sim.api.forget_schedules` first), median of ``--repeat`` CPU
   times (this process's CPU, which other processes on a shared machine disturb less
   than the wall clock): ``evaluator`` as ``simulate`` runs it (the periodic shortcut
   where it applies), ``full`` the same evaluated in full (``keep_trace=True``), and
   ``simpy`` the discrete-event engine (``engine="simpy"``: SimPy itself before
   issue 34, its own event loop with SimPy's order after) with link contention on (up
   to 65,536 passes; one run).
   The costs are Megatron-LM's 1T model's stages (first, middle, last) on DGX A100,
   repeated to pp x v stages, so every shape prices the same work per stage.
2. The two published runs through ``merak-sim simulate --engine evaluator --json``,
   each a fresh process (interpreter start, imports, simulation, exit), median of
   ``--repeat`` wall times: Megatron-LM's 1T model (Narayanan et al. 2021, Table 1:
   tp 8, pp 64, v 2, 3,072 GPUs, batch 3,072: 65,536 passes) and the 530B model of
   the selective-recompute paper (Korthikanti et al. 2022, Table 5: tp 8, pp 35,
   v 3, 280 GPUs: 29,400 passes). A release that refuses them on the command line
   runs the same command with its work limit lifted in the process.
3. Every row of Megatron-LM 2021's Table 1 through the same command (this tree only):
   each must exit 0 (the held-out check of issue 34).

Targets (issue 34): 1T <= 1.0 s and 530B <= 0.5 s through the CLI; full evaluation
<= 2 us per pass; SimPy <= 20 us per pass with contention.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Megatron-LM 2021, Table 1 (Narayanan et al., SC'21): name -> (heads, hidden,
#: layers, tp, pp, GPUs, global batch); micro-batch size 1, full recompute,
#: interleaved 1F1B with the fewest chunks (2 or 3) that split the layers evenly where
#: there are any (:func:`_chunks`), 1F1B elsewhere.
MEGATRON_TABLE1 = {
    "1.7B": (24, 2304, 24, 1, 1, 32, 512), "3.6B": (32, 3072, 30, 2, 1, 64, 512),
    "7.5B": (32, 4096, 36, 4, 1, 128, 512), "18B": (48, 6144, 40, 8, 1, 256, 1024),
    "39B": (64, 8192, 48, 8, 2, 512, 1536), "76B": (80, 10240, 60, 8, 4, 1024, 1792),
    "145B": (96, 12288, 80, 8, 8, 1536, 2304), "310B": (128, 16384, 96, 8, 16, 1920, 2160),
    "530B": (128, 20480, 105, 8, 35, 2520, 2520), "1T": (160, 25600, 128, 8, 64, 3072, 3072),
}


def _chunks(layers: int, pp: int) -> int:
    """Virtual stages for a Table 1 row: 2 or 3 where they split the layers evenly
    (Megatron's interleaving needs pp > 2), else 1."""
    return next((v for v in (2, 3) if pp > 2 and layers % (pp * v) == 0), 1)


def _model(name: str, heads: int, hidden: int, layers: int) -> str:
    return json.dumps(dict(name=name, family="gpt", layers=layers, hidden=hidden,
                           heads=heads, seq_len=2048, vocab=51200))


def _simulate_argv(model: str, tp: int, pp: int, v: int, gpus: int, batch: int,
                   recompute: str, extra: tuple[str, ...] = ()) -> list[str]:
    dp = gpus // (tp * pp)
    return ["simulate", "--model", model, "--cluster", "dgx-a100-80g", "--nodes",
            str(gpus // 8), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
            "--virtual-stages", str(v), "--micro-batch-size", "1",
            "--global-batch-size", str(batch),
            "--schedule", "interleaved-1f1b" if v > 1 else "1f1b",
            "--recompute", recompute, "--engine", "evaluator", "--json", *extra]


#: name -> (argv, micro-batch passes)
PUBLISHED = {
    "Megatron 1T (tp8 pp64 v2, 3,072 GPUs)": (
        _simulate_argv(_model("megatron-1t", 160, 25600, 128), 8, 64, 2, 3072, 3072,
                       "full"), 64 * 2 * 512),
    "530B selective (tp8 pp35 v3, 280 GPUs)": (
        _simulate_argv(_model("mt-nlg-530b", 128, 20480, 105), 8, 35, 3, 280, 280,
                       "selective", ("--sequence-parallel",)), 35 * 3 * 280),
}

#: (pp, micro-batches, virtual stages) of the passes-per-second grid.
GRID = [(pp, M, v) for pp in (8, 16, 32, 64) for M in (8, 64, 512, 4096) for v in (1, 2, 4)
        if M >= pp and (v == 1 or M % pp == 0) and pp * M * v <= 1 << 20]
QUICK = [(8, 64, 1), (8, 512, 2), (16, 4096, 1), (32, 512, 4), (64, 512, 2)]
SIMPY_MOST = 1 << 16


# -- the child: one tree's timings -------------------------------------------------------

_CHILD = r"""
import gc, json, statistics, sys, time
from dataclasses import replace
from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable
from merak_sim.costs.calibrated import CalibratedCostModel
from merak_sim.resolve import resolve_cluster, resolve_model
from merak_sim.sim.api import forget_schedules, simulate

grid, repeat, simpy_most = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
spec = resolve_model(dict(name="megatron-1t", family="gpt", layers=128, hidden=25600,
                          heads=160, seq_len=2048, vocab=51200))
big = resolve_cluster("dgx-a100-80g", 384)
base = CalibratedCostModel().cost_table(spec, big, ParallelConfig(
    dp=6, tp=8, pp=64, virtual_stages=2, micro_batch_size=1, global_batch_size=3072,
    schedule="interleaved-1f1b", recompute="full"))
first, mid, last = base.stages[0], base.stages[len(base.stages) // 2], base.stages[-1]

def table(n):
    stages = (first,) + (mid,) * (n - 2) + (last,) if n > 1 else (first,)
    return replace(base, stages=stages)

def timed(fn):
    forget_schedules()
    gc.collect()
    t = time.process_time()
    fn()
    return time.process_time() - t

out = []
for pp, M, v in grid:
    cfg = ParallelConfig(dp=1, tp=8, pp=pp, virtual_stages=v, micro_batch_size=1,
                         global_batch_size=M, recompute="full",
                         schedule="interleaved-1f1b" if v > 1 else "1f1b")
    tab = table(pp * v)
    nodes = max(1, pp)  # tp 8 fills a node: one stage per node
    run = lambda engine, keep, **kw: simulate(
        cluster="dgx-a100-80g", nodes=nodes, config=cfg, cost_table=tab, engine=engine,
        keep_trace=keep, sub_cluster=True, **kw)
    row = {"pp": pp, "M": M, "v": v, "passes": pp * M * v}
    row["evaluator"] = statistics.median(timed(lambda: run("evaluator", False))
                                         for _ in range(repeat))
    row["full"] = statistics.median(timed(lambda: run("evaluator", True))
                                    for _ in range(repeat))
    if pp * M * v <= simpy_most:
        row["simpy"] = timed(lambda: run("simpy", False, contention=True))
    out.append(row)
print(json.dumps(out))
"""


def _tree_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def _grid_times(tree: Path, grid: list, repeat: int) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(grid), str(repeat),
                          str(SIMPY_MOST)], cwd=tree, env=_tree_env(tree),
                         capture_output=True, text=True, timeout=7200, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: The command line of a release whose CLI refuses beyond a work limit: the same
#: command, with the limit lifted in the process (imports and exit included).
_LIFTED = ("import sys\nimport merak_sim.cli.options as o\no.WORK_LIMIT = 1 << 40\n"
           "from merak_sim.cli import main\nsys.exit(main(sys.argv[1:]))")


def _cli_wall(tree: Path, argv: list[str], repeat: int) -> tuple[float, str]:
    """Median wall seconds of ``argv`` in fresh processes of ``tree``'s merak-sim, and
    how it ran ("" as a user runs it, "limit lifted" where it refuses)."""
    how = ""
    cmd = [sys.executable, "-m", "merak_sim.cli", *argv]
    probe = subprocess.run(cmd, cwd=tree, env=_tree_env(tree), capture_output=True,
                           text=True, timeout=600)
    if probe.returncode != 0:
        cmd, how = [sys.executable, "-c", _LIFTED, *argv], "limit lifted"
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=tree, env=_tree_env(tree), capture_output=True, text=True,
                       timeout=600, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times), how


def _revision(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--",
                            "merak_sim"], capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" + working tree" if dirty else "")


def _us(seconds: float, passes: int) -> str:
    return f"{seconds / passes * 1e6:7.2f}"


def print_grid(now: list[dict], prev: list[dict] | None) -> None:
    """Section 1: microseconds per pass (and passes per second of the full evaluation),
    with the previous release's and the ratios."""
    print("\n## 1. Cold simulate(): us per micro-batch pass (CPU, median)")
    head = f"{'pp':>3} {'M':>5} {'v':>2} {'passes':>8} | {'eval':>7} {'full':>7} {'simpy':>7}"
    if prev:
        head += (f" | {'prev eval':>9} {'full':>7} {'simpy':>7} | {'x eval':>6} {'x full':>6} "
                 f"{'x simpy':>7}")
    print(head + f" | {'full passes/s':>13}")
    for i, r in enumerate(now):
        n = r["passes"]
        line = (f"{r['pp']:>3} {r['M']:>5} {r['v']:>2} {n:>8,} | {_us(r['evaluator'], n)} "
                f"{_us(r['full'], n)} "
                f"{_us(r['simpy'], n) if 'simpy' in r else '      -'}")
        if prev:
            p = prev[i]
            line += (f" | {_us(p['evaluator'], n):>9} {_us(p['full'], n)} "
                     f"{_us(p['simpy'], n) if 'simpy' in p else '      -'} | "
                     f"{p['evaluator'] / r['evaluator']:5.1f}x {p['full'] / r['full']:5.1f}x "
                     + (f"{p['simpy'] / r['simpy']:6.1f}x" if 'simpy' in r and 'simpy' in p
                        else "      -"))
        print(line + f" | {n / r['full']:>13,.0f}")


def main() -> None:
    """Run the three sections (module docstring) and print them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prev", type=Path, default=None,
                    help="A git worktree of the previous release, timed side by side.")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="Five shapes of the grid only.")
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-table1", action="store_true")
    a = ap.parse_args()
    print(f"# bench_scale: this tree {_revision(ROOT)}"
          + (f", previous release {_revision(a.prev)}" if a.prev else "")
          + f"; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if not a.skip_grid:
        grid = QUICK if a.quick else GRID
        # Shape by shape, the two trees in turn: a shared machine's load drifts, and
        # alternating spreads the drift over both columns instead of one.
        now, prev = [], [] if a.prev else None
        for shape in grid:
            now += _grid_times(ROOT, [shape], a.repeat)
            if a.prev:
                prev += _grid_times(a.prev, [shape], a.repeat)
        print_grid(now, prev)
    print("\n## 2. Published runs through merak-sim simulate --engine evaluator "
          f"(wall, fresh process, median of {a.repeat})")
    for name, (argv, passes) in PUBLISHED.items():
        t, _ = _cli_wall(ROOT, argv, a.repeat)
        line = f"{name}: {passes:,} passes: {t:.2f} s"
        if a.prev:
            tp, how = _cli_wall(a.prev, argv, a.repeat)
            line += f"; previous {tp:.2f} s{f' ({how})' if how else ''}; {tp / t:.2f}x"
        print(line)
    if not a.skip_table1:
        print("\n## 3. Megatron-LM 2021 Table 1 through merak-sim simulate --engine evaluator")
        for name, (heads, hidden, layers, tp, pp, gpus, batch) in MEGATRON_TABLE1.items():
            v = _chunks(layers, pp)
            argv = _simulate_argv(_model(f"megatron-{name}", heads, hidden, layers), tp, pp,
                                  v, gpus, batch, "full")
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "merak_sim.cli", *argv], cwd=ROOT,
                                 capture_output=True, text=True, timeout=600)
            dt = time.perf_counter() - t
            passes = pp * v * batch // (gpus // (tp * pp))
            if out.returncode == 0:
                d = json.loads(out.stdout)
                print(f"{name:>5}: tp{tp} pp{pp} v{v}  {passes:>7,} passes  {dt:5.2f} s  MFU "
                      f"{d['mfu']:.1%}  fits {d['fits_in_memory']}")
            else:
                print(f"{name:>5}: {passes:>7,} passes  exit {out.returncode}: "
                      f"{out.stderr.strip()[:200]}")


if __name__ == "__main__":
    main()
