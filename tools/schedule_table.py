"""Every registered pipeline schedule with its requirements and unit-cost figures.

One markdown row per name in :data:`merak_sim.schedule.SCHEDULES`: what its spec
requires (the spec's fields that differ from the defaults) and, at S=4 M=8 and
S=8 M=16 (virtual stages 2 for the interleaved and V-placed ones, 1 otherwise; "-"
where the spec refuses):

- unit-cost makespan of :func:`merak_sim.schedule.replay` with F = I = W = 1
  (``f=1, b=2, w=1``) and no recomputation, then with full recomputation (``r=1``);
- peak in-flight micro-batches: the most activations a rank holds at once, in stage
  micro-batches (the liveness walk; a chunk's micro-batch counts 1/v).

Every schedule is validated first. docs/schedules.md holds the printed table::

    .venv/bin/python tools/schedule_table.py
"""

from __future__ import annotations

import dataclasses
import sys

from merak_sim.schedule import SCHEDULES, ScheduleSpec, generate, liveness, replay, validate
from merak_sim.schedule.liveness import ItemSizes

SIZES = ((4, 8), (8, 16))
#: Spec fields that describe how a schedule is built, not what it needs (``period``: the
#: steady-state period the exact evaluator extends).
_NOT_REQUIREMENTS = {"name", "order", "stage_fractions", "period"}


def virtual_stages(spec: ScheduleSpec) -> int:
    """Chunks per rank the table runs ``spec`` with."""
    return 2 if spec.interleaved or spec.placement == "v" else 1


def requirements(spec: ScheduleSpec) -> str:
    """The spec's fields that differ from a plain ScheduleSpec's, as ``name=value``
    (a true flag as its name alone)."""
    out = []
    for f in dataclasses.fields(spec):
        if f.name in _NOT_REQUIREMENTS:
            continue
        val = getattr(spec, f.name)
        if val == f.default:
            continue
        out.append(f.name if val is True else f"{f.name}={val}")
    return ", ".join(out) or "none"


def figures(name: str, S: int, M: int) -> dict | None:
    """Unit makespans and peak in-flight micro-batches at (S, M), None if refused."""
    spec = SCHEDULES[name]
    v = virtual_stages(spec)
    if spec.violation(S, M, v):
        return None
    sched = generate(name, S, M, v)
    validate(sched)
    chunk = ItemSizes(1 / v, 1 / v, 1 / v)
    return {"unit": replay(sched, f=1, b=2, w=1).makespan,
            "unit_recompute": replay(sched, f=1, b=2, w=1, recompute=1.0).makespan,
            "peak": max(liveness(sched, r).peak(chunk) for r in range(S))}


def table() -> str:
    """The markdown table (module docstring)."""
    head = ["schedule", "requires", "v"]
    for S, M in SIZES:
        head += [f"unit {S}x{M}", f"unit+r {S}x{M}", f"peak {S}x{M}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, spec in SCHEDULES.items():
        cells = [f"`{name}`", requirements(spec), str(virtual_stages(spec))]
        for S, M in SIZES:
            fig = figures(name, S, M)
            cells += (["-"] * 3 if fig is None else
                      [f"{fig['unit']:g}", f"{fig['unit_recompute']:g}", f"{fig['peak']:g}"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
