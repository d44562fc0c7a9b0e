"""Our schedules versus torch.distributed.pipelining's, on the same (S, M).

torch's orders come through :mod:`merak_exec.torch_orders` (built without a process
group, converted into the IR and lowered by our pass); ours from
:data:`merak_sim.schedule.SCHEDULES` (a row for every counterpart name registered).
For each schedule it prints:

- unit: makespan of :func:`merak_sim.schedule.replay` at F = I = W = 1
  (``f=1, b=2, w=1``; a chunk of a two-chunk schedule costs half);
- ms: iteration time from the exact evaluator (``simulate(..., engine="evaluator")``)
  with the calibrated cost model, GPT-8.3B on one DGX A100 80 GB node, tp = dp = 1,
  micro-batch 1 (a cost-aware schedule of ours built from that cost table, so its
  ms and GiB are that build's while unit and act are the unit-cost build's);
- act: peak activations held on a rank, in stage micro-batches (the liveness walk;
  a chunk's micro-batch counts 1/v);
- GiB: the simulated peak memory of the busiest rank (weights, optimizer state and
  activations);

and, on our rows, each figure over torch's (ours / torch; below 1 is better). Every
schedule is first proven by :func:`merak_sim.schedule.validate` (complete,
deadlock-free, NCCL posting rule). It writes the table to
benchmarks/results/torch_schedules.md (atomically)::

    .venv/bin/python benchmarks/bench_torch_schedules.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import merak_sim
from merak_exec.torch_orders import TORCH_SCHEDULES, torch_schedule
from merak_sim.io import atomic_write_text
from merak_sim.schedule import SCHEDULES, ScheduleError, generate, liveness, replay, validate
from merak_sim.schedule.liveness import ItemSizes

SIZES = ((4, 8), (8, 16), (4, 4))
#: torch class -> our counterparts (rows appear for those registered).
PAIRS = {
    "ScheduleGPipe": ("gpipe",),
    "Schedule1F1B": ("1f1b",),
    "ScheduleInterleaved1F1B": ("interleaved-1f1b",),
    "ScheduleInterleavedZeroBubble": ("zb-interleaved", "zb-h1", "zb-h2", "zb-auto"),
    "ScheduleZBVZeroBubble": ("zb-v",),
    "ScheduleDualPipeV": ("dualpipev",),
}
MODEL, CLUSTER = "gpt-8.3b", "dgx-a100-80g"
OUT = Path(__file__).resolve().parent / "results" / "torch_schedules.md"
HEAD = ("| S | M | torch class | schedule | unit | ms | act | GiB "
        "| unit ratio | ms ratio | act ratio | GiB ratio |")


def _config_schedule(sched, prefer: str) -> str:
    """A registered name whose placement and requirements fit ``sched`` (the
    configuration's schedule sets the placement the cost model prices)."""
    S, M, v = sched.num_stages, sched.num_microbatches, sched.virtual_stages
    for name in (prefer, *SCHEDULES):
        spec = SCHEDULES.get(name)
        if spec is not None and spec.placement == sched.placement \
                and not spec.violation(S, M, v):
            return name
    raise ScheduleError(f"no registered schedule has placement {sched.placement!r} for "
                        f"S={S}, M={M}, v={v}")


def measure(sched, prefer: str, from_costs: bool = False) -> dict:
    """The figures of one schedule (module docstring). With ``from_costs`` the
    configuration builds ``prefer`` from the cost table for the evaluator (a
    cost-aware schedule adapts its order to the profiled times); the unit figures
    stay those of ``sched``."""
    validate(sched)
    S, M, v = sched.num_stages, sched.num_microbatches, sched.virtual_stages
    chunk = ItemSizes(1 / v, 1 / v, 1 / v)
    act = max(liveness(sched, r).peak(chunk) for r in range(S))
    try:
        res = merak_sim.simulate(
            MODEL, CLUSTER, dp=1, tp=1, pp=S, micro_batch_size=1, global_batch_size=M,
            virtual_stages=v, schedule=prefer if from_costs else _config_schedule(sched, prefer),
            custom_schedule=None if from_costs else sched, engine="evaluator",
            sub_cluster=True)
        ms, gib = res.iteration_time_s * 1e3, max(res.peak_memory_bytes) / 2**30
    except ScheduleError:
        ms = gib = float("nan")
    return {"unit": replay(sched, f=1, b=2, w=1).makespan, "ms": ms, "act": act,
            "GiB": gib}


def _ours(name: str, S: int, M: int, v: int):
    spec = SCHEDULES[name]
    for vv in ((v, 1) if v > 1 else (1,)):
        if not spec.violation(S, M, vv):
            return generate(name, S, M, vv)
    return None


def rows(sizes=SIZES) -> list[dict]:
    """One dict per schedule: S, M, torch class, schedule, figures, and on our rows
    the ratios to torch's (``None`` where a side does not exist for the size)."""
    out = []
    for S, M in sizes:
        for cls, ours in PAIRS.items():
            try:
                t = measure(torch_schedule(cls, S, M), ours[0])
            except ScheduleError as e:
                out.append({"S": S, "M": M, "cls": cls, "schedule": "torch",
                            "note": str(e).split(":")[-1].strip()})
                continue
            out.append({"S": S, "M": M, "cls": cls, "schedule": "torch", **t})
            for name in ours:
                sched = _ours(name, S, M, TORCH_SCHEDULES[cls].local_stages) \
                    if name in SCHEDULES else None
                if sched is None:
                    continue
                o = measure(sched, name, getattr(SCHEDULES[name], "cost_aware", False))
                ratios = {f"{k} ratio": o[k] / t[k] if t[k] else float("nan")
                          for k in ("unit", "ms", "act", "GiB")}
                out.append({"S": S, "M": M, "cls": cls, "schedule": name, **o, **ratios})
    return out


def _fmt(x, nd: int) -> str:
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    return "n/a" if x != x else f"{x:.{nd}f}"


def table(rs: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for r in rs:
        if "note" in r:
            lines.append(f"| {r['S']} | {r['M']} | {r['cls']} | torch | refused: {r['note']} "
                         "| | | | | | | |")
            continue
        cells = [r["S"], r["M"], r["cls"], r["schedule"], _fmt(r["unit"], 1),
                 _fmt(r["ms"], 1), _fmt(r["act"], 2), _fmt(r["GiB"], 1),
                 *(_fmt(r.get(f"{k} ratio"), 3) for k in ("unit", "ms", "act", "GiB"))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    text = (f"Ours vs torch.distributed.pipelining (torch orders converted by "
            f"merak_exec.torch_orders). unit: makespan at F = I = W = 1; ms: exact "
            f"evaluator, {MODEL} on {CLUSTER}, tp = dp = 1, micro-batch 1; act: peak "
            f"stage micro-batches held per rank; GiB: simulated peak memory; ratios "
            f"ours / torch.\n\n{table(rows())}\n")
    print(text)
    atomic_write_text(OUT, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
