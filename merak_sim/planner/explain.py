"""Why the best plan won: per knob, the closest alternative value and what stopped it.

For each knob of the winning row (cp, ZeRO stage, schedule, recompute, attention, tp,
pp, micro-batch size, sequence parallelism, TP overlap, overlap of the DP
synchronisation) the other value that came closest (by time or lower bound, then
memory shortfall, then rules) is named in one line, with how its best candidate lost:
its time when it ran ("3.2 % slower"), its lower bound when branch and bound skipped
it ("at least 12 % slower"), the smallest memory shortfall when none fits ("does not
fit: stage 0 needs 96.1 GiB > 80.0 GiB"), or the rule it breaks. Where the same plan
with only that knob changed was priced and ended otherwise, its outcome comes too,
which names the constraint or cost behind the choice (memory of the attention scores,
the exposed ZeRO-3 gathers, the pipeline bubble ...); the count of the other values
tried ends the line. Nothing is said twice.
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


def _outcome(cols: _Columns, idx: np.ndarray, best_t: float) -> tuple[tuple, str]:
    """How the best of rows ``idx`` (all with one alternative value) lost, and a key
    that orders alternatives from closest to furthest (ran, bounded, out of memory,
    broke a rule; a lower bound ranks with the times it bounds)."""
    ran = idx[cols.ran[idx]]
    if len(ran):
        r = cols.df.iloc[int(ran[np.nanargmin(cols.time[ran])])]
        return (0, float(r.time_s), 0), (f"{(r.time_s / best_t - 1) * 100:.1f} % slower "
                                      f"({r.time_s:.3f} s, peak {r.peak_memory_gib:.1f} GiB)")
    bd = idx[cols.bounded[idx]]
    if len(bd):
        b = float(np.nanmin(cols.bound[bd]))
        return (0, b, 1), (f"at least {(b / best_t - 1) * 100:.1f} % slower (bound {b:.3f} s; "
                        "not simulated)")
    mem = idx[~np.isnan(cols.short[idx])]
    if len(mem):
        j = int(mem[np.argmin(cols.short[mem])])
        return (2, float(cols.short[j]), 0), f"does not fit ({cols.df.iloc[j].reason})"
    text = str(cols.df.iloc[int(idx[0])].reason) if len(idx) else "not in the space"
    return (3, 0.0, 0), text


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
        return f"{r.time_s:.3f} s, peak {r.peak_memory_gib:.1f} GiB"
    if r.status == "bounded":
        return f"bound {r.bound_s:.3f} s"
    return str(r.reason)


def explain(table) -> list[str]:
    """One short line per knob of the best row of ``table`` (the planner's ranked
    table): ``knob=best over knob=closest: how the closest alternative lost``, then,
    when it says something else, the winning plan with only that knob changed, and how
    many further values were tried."""
    best = table.iloc[0]
    bt = float(best.time_s)
    priced = table[table.schedule != "-"]  # rows with a whole configuration
    arrays = _Columns(priced, best)
    lines = []
    for label, cols in KNOBS:
        me = tuple(best[c] for c in cols)
        alts = []
        groups = priced.groupby(list(cols), sort=True).indices
        for val, idx in groups.items():
            if (val if isinstance(val, tuple) else (val,)) == me:
                continue
            idx = np.asarray(idx)
            key, text = _outcome(arrays, idx, bt)
            alts.append((key, _value(cols, priced.iloc[int(idx[0])]), text, idx))
        if not alts:
            continue
        key, alt, text, idx = min(alts, key=lambda a: a[0])
        line = f"{label}={_value(cols, best)} over {label}={alt}: {text}"
        same = _neighbour(arrays, cols, idx)
        if same and same not in text:
            line += f"; the same plan with {label}={alt}: {same}"
        if len(alts) > 1:
            line += f" ({len(alts) - 1} other value{'s' if len(alts) > 2 else ''} tried)"
        lines.append(line)
    return lines
