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
            "tp_overlap", "zero", "cp", "ep", "zero_group", "attention", "overlap_param_gather",
            "bound_s", "engine", "reason", "shortfall_gib")
_STATUS_ORDER = {"best": 0, "confirmed": 1, "evaluated": 2, "bounded": 3, "pruned": 4}
#: Columns a chunk takes from its block and from its variant (the rest are constant).
_BLOCK_COLS = ("dp", "tp", "pp", "virtual_stages", "micro_batch_size", "microbatches",
               "schedule", "cp", "ep")
_VARIANT_COLS = ("recompute", "sequence_parallel", "tp_overlap", "zero", "zero_group",
                 "attention", "overlap_param_gather")
_INT_COLS = {"dp", "tp", "pp", "virtual_stages", "micro_batch_size", "microbatches", "zero",
             "cp", "ep", "zero_group"}
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
        c.sequence_parallel, c.tp_overlap, c.zero, c.cp, c.ep, c.zero_group, c.attention,
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

    def memory_pruned(self) -> tuple[np.ndarray, list[tuple]]:
        """(shortfall in GiB, source) of every row with a shortfall: a source is a dict
        row or (block index, variant position); :meth:`candidate_of` turns it into its
        candidate."""
        short, src = [], []
        for seg in self._segments:
            if isinstance(seg, list):
                for r in seg:
                    if not np.isnan(r["shortfall_gib"]):
                        short.append(r["shortfall_gib"])
                        src.append((r,))
                continue
            bids, pos, _status, _reasons, _bounds, sh = seg
            for j in np.nonzero(~np.isnan(sh))[0].tolist():
                short.append(float(sh[j]))
                src.append((int(bids[j]), int(pos[j])))
        return np.asarray(short, dtype=float), src

    def candidate_of(self, source: tuple) -> Candidate:
        """The candidate of a :meth:`memory_pruned` source."""
        if len(source) == 2:
            return self._blocks[source[0]].candidate(source[1])
        r = source[0]
        return Candidate(r["dp"], r["tp"], r["pp"], r["virtual_stages"],
                         r["micro_batch_size"], r["microbatches"], r["schedule"],
                         r["recompute"], bool(r["sequence_parallel"]), r["tp_overlap"],
                         r["zero"], "", r["cp"], r["zero_group"], r["attention"],
                         bool(r["overlap_param_gather"]), r["ep"])

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

    def _sources(self) -> tuple:
        """The dict rows, the chunks, and per row (dict rows first, then the chunks'
        rows: not in decision order) its position in the decision order, the rank of
        its status and its time or bound; per chunk row its block, its variant (an
        index into every variant set laid end to end) and its chunk."""
        segs = self._segments
        dict_rows = [r for seg in segs if isinstance(seg, list) for r in seg]
        chunks = [seg for seg in segs if not isinstance(seg, list)]
        lens = np.array([len(seg) if isinstance(seg, list) else len(seg[1]) for seg in segs],
                        dtype=np.int64)
        is_dict = np.repeat(np.array([isinstance(seg, list) for seg in segs], dtype=bool),
                            lens) if segs else np.zeros(0, dtype=bool)
        position = np.concatenate([np.nonzero(is_dict)[0], np.nonzero(~is_dict)[0]])
        if chunks:
            bids = np.concatenate([c[0] for c in chunks])
            offsets = np.array([self._variant_sets[id(b.variants)][0] for b in self._blocks],
                               dtype=np.int64)
            var = offsets[bids] + np.concatenate([c[1] for c in chunks])
            chunk_of = np.repeat(np.arange(len(chunks)), [len(c[1]) for c in chunks])
            bounds = np.concatenate([c[4] for c in chunks])
        else:
            bids = var = chunk_of = np.zeros(0, dtype=np.int64)
            bounds = np.zeros(0)
        rank = np.concatenate(
            [np.array([_STATUS_ORDER[r["status"]] for r in dict_rows], dtype=np.int64),
             np.array([_STATUS_ORDER[c[2]] for c in chunks], dtype=np.int64)[chunk_of]])
        dict_t = np.array([r["time_s"] for r in dict_rows], dtype=float)
        dict_b = np.array([r["bound_s"] for r in dict_rows], dtype=float)
        t = np.concatenate([np.where(np.isnan(dict_t), dict_b, dict_t), bounds])
        t = np.where(np.isnan(t), np.inf, t)
        return dict_rows, chunks, position, rank, t, bids, var, chunk_of

    def ranked_columns(self) -> dict[str, np.ndarray]:
        """Every column over every row, by status, then by time (or bound), then in
        decision order (:func:`ranked_table`): the order is found first and each
        column gathered once, from its dict rows and from the small per-block,
        per-variant and per-chunk tables of the chunks' rows."""
        dict_rows, chunks, position, rank, t, bids, var, chunk_of = self._sources()
        order = np.lexsort((position, t, rank))
        nd = len(dict_rows)
        # Lookup indices in ranked order: a dict row's own, else nd + its block's,
        # variant's or chunk's.
        own = np.arange(nd, dtype=np.int64)

        def ranked(per_chunk_row: np.ndarray) -> np.ndarray:
            return np.concatenate([own, nd + per_chunk_row])[order]

        block_ix, variant_ix, chunk_ix = ranked(bids), ranked(var), ranked(chunk_of)
        # Where the dict rows land, for the columns constant over the chunks' rows.
        dict_at = np.nonzero(order < nd)[0]
        dict_from = order[dict_at]
        flat = [v for _o, vs in sorted(self._variant_sets.values(), key=itemgetter(0))
                for v in vs]
        out: dict[str, np.ndarray] = {}
        for k in ROW_KEYS:
            mine = list(map(itemgetter(k), dict_rows))
            if k in _BLOCK_COLS:
                vals, ix = mine + [getattr(b, k) for b in self._blocks], block_ix
            elif k in _VARIANT_COLS:
                j = _VARIANT_COLS.index(k)
                vals, ix = mine + [v[j] for v in flat], variant_ix
            elif k == "status":
                vals, ix = mine + [c[2] for c in chunks], chunk_ix
            elif k in ("engine", "recompute_fractions") or (k in _FLOAT_COLS and k not in
                                                             ("bound_s", "shortfall_gib")):
                # Constant over the chunks' rows: filled, then the dict rows' values.
                fill = {"engine": "", "recompute_fractions": None}.get(k, np.nan)
                col = np.full(len(order), fill, dtype=float if k in _FLOAT_COLS else object)
                col[dict_at] = _column(k, mine)[dict_from]
                out[k] = col
                continue
            else:  # reason, bound and shortfall: one value per chunk row
                j = {"reason": 3, "bound_s": 4, "shortfall_gib": 5}[k]
                dt = object if k == "reason" else float
                per = [np.asarray(mine, dtype=dt)] + [np.asarray(c[j], dtype=dt)
                                                      for c in chunks]
                out[k] = np.concatenate(per)[order]
                continue
            out[k] = _column(k, vals)[ix]
        return out


def _column(k: str, vals: list) -> np.ndarray:
    """The lookup array of column ``k`` with its table dtype."""
    if k in _INT_COLS:
        return np.array(vals, dtype=np.int64)
    if k in _BOOL_COLS:
        return np.array(vals, dtype=bool)
    if k in _FLOAT_COLS:
        return np.array(vals, dtype=float)
    return _objects(vals)


def ranked_table(rows: RowBook | list[dict]):
    """The rows as a pandas DataFrame: by status, then by time (or bound), then in
    decision order."""
    import pandas as pd

    if not isinstance(rows, RowBook):
        book = RowBook()
        for r in rows:
            book.append(r)
        rows = book
    if not len(rows):
        return pd.DataFrame({k: np.zeros(0) for k in ROW_KEYS}, columns=list(ROW_KEYS))
    # The gathered columns are fresh arrays: the frame may own them (no second copy).
    return pd.DataFrame(rows.ranked_columns(), columns=list(ROW_KEYS), copy=False)
