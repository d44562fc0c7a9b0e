"""Why the best plan won: per knob, the best alternative value and what stopped it.

For each knob of the winning row (cp, ZeRO stage, schedule, recompute, attention, tp,
pp, micro-batch size, sequence parallelism, TP overlap, overlap of the DP
synchronisation) and each other value the search tried, the best candidate with that
value says how it lost: its time when it ran ("3.2 % slower"), its lower bound when
branch and bound skipped it ("at least 12 % slower"), the smallest memory shortfall
when none fits ("does not fit: stage 0 needs 96.1 GiB > 80.0 GiB"), or the rule it
breaks. Where the same plan with only that knob changed was priced, its outcome and
peak memory come too, which names the constraint or cost behind the choice (memory of
the attention scores, the exposed ZeRO-3 gathers, the pipeline bubble ...).
"""

from __future__ import annotations

import numpy as np

__all__ = ["explain", "KNOBS"]

#: (label, table columns) of each knob; schedule and its virtual stages go together.
KNOBS = (
    ("cp", ("cp",)), ("zero", ("zero", "zero_group")),
    ("schedule", ("schedule", "virtual_stages")), ("recompute", ("recompute",)),
    ("attention", ("attention",)), ("tp", ("tp",)), ("pp", ("pp",)),
    ("micro-batch", ("micro_batch_size",)), ("sequence parallel", ("sequence_parallel",)),
    ("tp overlap", ("tp_overlap",)), ("overlap-param-gather", ("overlap_param_gather",)),
)
_FIELDS = ("tp", "pp", "cp", "virtual_stages", "micro_batch_size", "schedule", "recompute",
           "sequence_parallel", "tp_overlap", "zero", "zero_group", "attention",
           "overlap_param_gather")
_RAN = ("best", "confirmed", "evaluated")


def _value(cols: tuple[str, ...], r) -> str:
    if cols == ("schedule", "virtual_stages"):
        return r["schedule"] + (f" v={r['virtual_stages']}" if r["virtual_stages"] > 1 else "")
    if cols == ("zero", "zero_group"):
        return str(r["zero"]) + (f" hsdp={r['zero_group']}" if r["zero_group"] else "")
    return str(r[cols[0]])


class _Columns:
    """The table's columns as numpy arrays, read once for every knob (a full space
    has a million rows)."""

    def __init__(self, priced, best) -> None:
        self.df = priced
        status = priced.status.to_numpy(dtype=object)
        self.ran = np.isin(status, _RAN)
        self.bounded = status == "bounded"
        self.time = priced.time_s.to_numpy(dtype=float)
        self.bound = priced.bound_s.to_numpy(dtype=float)
        self.short = priced.shortfall_gib.to_numpy(dtype=float)
        # Whether each row agrees with the best row, per field.
        self.same = {f: (priced[f] == best[f]).to_numpy() for f in _FIELDS}


def _outcome(cols: _Columns, idx: np.ndarray, best_t: float) -> str:
    """How the best of rows ``idx`` (all with one alternative value) lost."""
    ran = idx[cols.ran[idx]]
    if len(ran):
        r = cols.df.iloc[int(ran[np.nanargmin(cols.time[ran])])]
        return (f"{(r.time_s / best_t - 1) * 100:.1f} % slower ({r.time_s:.3f} s, peak "
                f"{r.peak_memory_gib:.1f} GiB)")
    bd = idx[cols.bounded[idx]]
    if len(bd):
        b = np.nanmin(cols.bound[bd])
        return f"at least {(b / best_t - 1) * 100:.1f} % slower (bound {b:.3f} s; not simulated)"
    mem = idx[~np.isnan(cols.short[idx])]
    if len(mem):
        r = cols.df.iloc[int(mem[np.argmin(cols.short[mem])])]
        return f"does not fit ({r.reason})"
    return str(cols.df.iloc[int(idx[0])].reason) if len(idx) else "not in the space"


def _neighbour(cols: _Columns, knob: tuple[str, ...], idx: np.ndarray) -> str:
    """The outcome of the winning plan with only this knob changed, if it was priced."""
    same = np.ones(len(idx), dtype=bool)
    for f in _FIELDS:
        if f not in knob:
            same &= cols.same[f][idx]
    hit = idx[same]
    if not len(hit):
        return ""
    r = cols.df.iloc[int(hit[0])]
    if r.status in _RAN:
        return f"; same plan otherwise: {r.time_s:.3f} s, peak {r.peak_memory_gib:.1f} GiB"
    if r.status == "bounded":
        return f"; same plan otherwise: bound {r.bound_s:.3f} s"
    return f"; same plan otherwise: {r.reason}"


def explain(table) -> list[str]:
    """One line per knob of the best row of ``table`` (the planner's ranked table)."""
    best = table.iloc[0]
    bt = float(best.time_s)
    priced = table[table.schedule != "-"]  # rows with a whole configuration
    arrays = _Columns(priced, best)
    lines = []
    for label, cols in KNOBS:
        me = tuple(best[c] for c in cols)
        others = []
        groups = priced.groupby(list(cols), sort=True).indices
        for val in sorted(groups, key=lambda v: v if isinstance(v, tuple) else (v,)):
            idx = np.asarray(groups[val])
            val = val if isinstance(val, tuple) else (val,)
            if tuple(val) == me:
                continue
            alt = _value(cols, priced.iloc[int(idx[0])])
            others.append(f"{label}={alt}: {_outcome(arrays, idx, bt)}"
                          + _neighbour(arrays, cols, idx))
        if others:
            lines.append(f"{label}={_value(cols, best)} over " + "; ".join(others))
    return lines
