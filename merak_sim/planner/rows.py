"""The planner's rows: one per candidate, kept in the order the search decided them.

A full space has a million candidates and most of them end in bulk (pruned by a rule
or by memory, bounded out), so :class:`RowBook` keeps those as columnar chunks (block
index, variant position, status, reason, bound, shortfall) and only the few candidates
that are priced or evaluated as dict rows (:func:`row`), which the search may still
update (confirmation, the winner's reason). :func:`ranked_table` turns either into the
one pandas DataFrame of the report.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from .space import Block, Candidate

__all__ = ["ROW_KEYS", "RowBook", "row", "ranked_table"]

#: Columns of the planner's table, in order.
ROW_KEYS = ("status", "time_s", "samples_per_s", "tokens_per_s", "mfu", "peak_memory_gib",
            "dp", "tp", "pp", "virtual_stages", "micro_batch_size", "microbatches",
            "schedule", "recompute", "recompute_fractions", "sequence_parallel",
            "tp_overlap", "zero", "cp", "zero_group", "attention", "overlap_param_gather",
            "bound_s", "engine", "reason", "shortfall_gib")
_STATUS_ORDER = {"best": 0, "confirmed": 1, "evaluated": 2, "bounded": 3, "pruned": 4}
#: Columns a chunk takes from its block and from its variant (the rest are constant).
_BLOCK_COLS = ("dp", "tp", "pp", "virtual_stages", "micro_batch_size", "microbatches",
               "schedule", "cp")
_VARIANT_COLS = ("recompute", "sequence_parallel", "tp_overlap", "zero", "zero_group",
                 "attention", "overlap_param_gather")
_INT_COLS = {"dp", "tp", "pp", "virtual_stages", "micro_batch_size", "microbatches", "zero",
             "cp", "zero_group"}
_BOOL_COLS = {"sequence_parallel", "overlap_param_gather"}
_FLOAT_COLS = {"time_s", "samples_per_s", "tokens_per_s", "mfu", "peak_memory_gib",
               "bound_s", "shortfall_gib"}


def row(c: Candidate, status: str, reason: str, **values: Any) -> dict:
    """One table row for candidate ``c`` (unknown figures NaN)."""
    nan = np.nan
    # zip over fixed keys: the cheapest way to a dict in that key order.
    d = dict(zip(ROW_KEYS, (
        status, nan, nan, nan, nan, nan, c.dp, c.tp, c.pp, c.virtual_stages,
        c.micro_batch_size, c.microbatches, c.schedule, c.recompute, None,
        c.sequence_parallel, c.tp_overlap, c.zero, c.cp, c.zero_group, c.attention,
        c.overlap_param_gather, nan, "", reason, nan)))
    if values:
        d.update(values)
    return d


def _objects(values) -> np.ndarray:
    # Element by element: a list of equal-length tuples must stay a 1-D object array.
    out = np.empty(len(values), dtype=object)
    for i, x in enumerate(values):
        out[i] = x
    return out


class RowBook:
    """Rows in decision order: dict rows and columnar chunks of block candidates.

    ``len`` counts every row; ``book[i]`` is the dict row at position ``i`` (only dict
    rows are addressable); iteration yields the dict rows. Blocks are registered once
    (:meth:`block_id`) and chunks refer to them by index.
    """

    def __init__(self) -> None:
        self._segments: list[Any] = []
        self._by_index: dict[int, dict] = {}
        self._n = 0
        self._blocks: list[Block] = []
        self._block_ids: dict[int, int] = {}
        self._variant_sets: dict[int, tuple[int, tuple]] = {}
        self._variant_offset = 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> dict:
        return self._by_index[i]

    def __iter__(self):
        return iter(self._by_index.values())

    def append(self, d: dict) -> None:
        """Add one dict row."""
        if not self._segments or not isinstance(self._segments[-1], list):
            self._segments.append([])
        self._segments[-1].append(d)
        self._by_index[self._n] = d
        self._n += 1

    def block_id(self, block: Block) -> int:
        """The index of ``block`` in this book (registered on first use)."""
        i = self._block_ids.get(id(block))
        if i is None:
            i = self._block_ids[id(block)] = len(self._blocks)
            self._blocks.append(block)
            vs = block.variants
            if id(vs) not in self._variant_sets:
                self._variant_sets[id(vs)] = (self._variant_offset, vs)
                self._variant_offset += len(vs)
        return i

    def block(self, i: int) -> Block:
        """The block registered as ``i``."""
        return self._blocks[i]

    def extend(self, block_ids: np.ndarray, positions: np.ndarray, status: str,
               reasons: np.ndarray, bounds: np.ndarray | None = None,
               shortfalls: np.ndarray | None = None) -> None:
        """Add a chunk: candidate ``positions[j]`` of block ``block_ids[j]``, all with
        ``status``, reason ``reasons[j]``, bound and shortfall (NaN when None)."""
        n = len(positions)
        if n == 0:
            return
        nan = np.full(n, np.nan)
        self._segments.append((np.asarray(block_ids, dtype=np.int64),
                               np.asarray(positions, dtype=np.int64), status,
                               np.asarray(reasons, dtype=object),
                               nan if bounds is None else np.asarray(bounds, dtype=float),
                               nan if shortfalls is None else np.asarray(shortfalls,
                                                                          dtype=float)))
        self._n += n

    def dicts(self):
        """Every row as a dict, in order (chunks materialised: the slow path)."""
        for seg in self._segments:
            if isinstance(seg, list):
                yield from seg
                continue
            bids, pos, status, reasons, bounds, short = seg
            for j in range(len(pos)):
                c = self._blocks[int(bids[j])].candidate(int(pos[j]))
                yield row(c, status, str(reasons[j]), bound_s=float(bounds[j]),
                          shortfall_gib=float(short[j]))

    def _chunk_columns(self, chunks: list[tuple]) -> dict[str, np.ndarray]:
        """The columns of every chunk row, chunks in order (one gather per column)."""
        bids = np.concatenate([c[0] for c in chunks])
        pos = np.concatenate([c[1] for c in chunks])
        n = len(pos)
        blocks = self._blocks
        out: dict[str, np.ndarray] = {}
        for k in _BLOCK_COLS:
            table = [getattr(b, k) for b in blocks]
            out[k] = (_objects(table) if k == "schedule"
                      else np.array(table, dtype=np.int64))[bids]
        offsets = np.array([self._variant_sets[id(b.variants)][0] for b in blocks],
                           dtype=np.int64)
        flat = [v for _o, vs in sorted(self._variant_sets.values(), key=itemgetter(0))
                for v in vs]
        g = offsets[bids] + pos
        for j, k in enumerate(_VARIANT_COLS):
            col = [v[j] for v in flat]
            dt = np.int64 if k in _INT_COLS else bool if k in _BOOL_COLS else object
            out[k] = (_objects(col) if dt is object else np.array(col, dtype=dt))[g]
        nan = np.full(n, np.nan)
        for k in _FLOAT_COLS:
            out[k] = nan
        out["bound_s"] = np.concatenate([c[4] for c in chunks])
        out["shortfall_gib"] = np.concatenate([c[5] for c in chunks])
        out["status"] = _objects([c[2] for c in chunks]).repeat([len(c[1]) for c in chunks])
        out["engine"] = _objects([""]).repeat(n)
        out["recompute_fractions"] = _objects([None]).repeat(n)
        out["reason"] = np.concatenate([c[3] for c in chunks])
        return out

    def columns(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Every column over every row, the dict rows first and then the chunks' (not
        in decision order), each row's position in the decision order and the rank of
        its status (best first)."""
        dict_rows = [r for seg in self._segments if isinstance(seg, list) for r in seg]
        chunks = [seg for seg in self._segments if not isinstance(seg, list)]
        is_dict = np.concatenate(
            [np.ones(len(seg), dtype=bool) if isinstance(seg, list)
             else np.zeros(len(seg[1]), dtype=bool) for seg in self._segments]
            or [np.zeros(0, dtype=bool)])
        parts = []
        if dict_rows:
            cols = {}
            for k in ROW_KEYS:
                vals = list(map(itemgetter(k), dict_rows))
                if k in _INT_COLS:
                    cols[k] = np.array(vals, dtype=np.int64)
                elif k in _BOOL_COLS:
                    cols[k] = np.array(vals, dtype=bool)
                elif k in _FLOAT_COLS:
                    cols[k] = np.array(vals, dtype=float)
                else:
                    cols[k] = _objects(vals)
            parts.append(cols)
        if chunks:
            parts.append(self._chunk_columns(chunks))
        if not parts:
            e = np.zeros(0, dtype=np.int64)
            return {k: np.zeros(0) for k in ROW_KEYS}, e, e
        position = np.concatenate([np.nonzero(is_dict)[0], np.nonzero(~is_dict)[0]])
        rank = np.concatenate(
            [np.array([_STATUS_ORDER[r["status"]] for r in dict_rows], dtype=np.int64)]
            + [np.full(len(c[1]), _STATUS_ORDER[c[2]], dtype=np.int64) for c in chunks])
        return ({k: np.concatenate([p[k] for p in parts]) for k in ROW_KEYS}, position,
                rank)


def ranked_table(rows: RowBook | list[dict]):
    """The rows as a pandas DataFrame: by status, then by time (or bound), then in
    decision order."""
    import pandas as pd

    if not isinstance(rows, RowBook):
        book = RowBook()
        for r in rows:
            book.append(r)
        rows = book
    cols, position, o = rows.columns()
    t = np.where(np.isnan(cols["time_s"]), cols["bound_s"], cols["time_s"])
    t = np.where(np.isnan(t), np.inf, t)
    order = np.lexsort((position, t, o))
    # The gathered columns are fresh arrays: the frame may own them (no second copy).
    return pd.DataFrame({k: cols[k][order] for k in ROW_KEYS}, columns=list(ROW_KEYS),
                        copy=False)
