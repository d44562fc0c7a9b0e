"""Which links a flow of the SimPy engine occupies, and with what weight.

With contention on, every transfer and collective is a flow over directed links of
the cluster's :class:`~merak_sim.sim.entities.Topology`. In full mode each GPU's flow
covers its own route (weight 1 per link); in representative mode one flow stands for
every (data, tensor)-parallel copy, so each link of the representative route is
weighted by how many copies' routes cross it. Routes are computed once per run and
cached.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from merak_sim.layout import RankLayout

from .entities import Topology

__all__ = ["LinkRoutes", "Links"]

#: (link name, flow weight) pairs of one flow.
Links = tuple[tuple[str, float], ...]


def weighted_route(topo: Topology, pairs: Iterable[tuple[int, int]]) -> Links:
    """Links of the first (representative) pair with the number of pairs crossing each."""
    pairs = list(pairs)
    rep = topo.route(*pairs[0])
    route = topo.route
    # Counted in one pass (Counter counts an iterable in C).
    cnt = Counter(link for src, dst in pairs for link in route(src, dst))
    return tuple((link, float(cnt[link])) for link in rep)


class LinkRoutes:
    """Cached link sets of the three kinds of flow: pipeline transfers, data-parallel
    ring steps and tensor-parallel rings."""

    def __init__(self, topo: Topology, placement: RankLayout, full: bool):
        self.topo = topo
        self.pl = placement
        self.full = full
        self._p2p: dict[tuple[int, int, int], Links] = {}
        self._ring: dict[tuple[int, int, int], Links] = {}
        self._tp: dict[tuple[int, int], tuple[Links, float]] = {}

    def _own(self, src: int, dst: int) -> Links:
        return tuple((ln, 1.0) for ln in self.topo.route(src, dst))

    def p2p(self, src_stage: int, dst_stage: int, dp_idx: int, tp_idx: int) -> Links:
        """Links of a pipeline transfer from ``src_stage`` to ``dst_stage`` of the copy
        (dp_idx, tp_idx); every copy's route weighs in representative mode."""
        key = (src_stage, dst_stage, dp_idx * self.pl.tp + tp_idx)
        links = self._p2p.get(key)
        if links is None:
            pl = self.pl
            if self.full:
                links = self._own(pl.rank(src_stage, dp_idx, tp_idx),
                                  pl.rank(dst_stage, dp_idx, tp_idx))
            else:
                links = weighted_route(self.topo, [
                    (pl.rank(src_stage, d, t), pl.rank(dst_stage, d, t))
                    for d in range(pl.dp) for t in range(pl.tp)])
            self._p2p[key] = links
        return links

    def dp_ring(self, stage: int, dp_idx: int, tp_idx: int) -> Links:
        """Links of one data-parallel ring step of ``stage`` from dp index ``dp_idx`` to
        the next (every ring edge of the stage weighs in representative mode)."""
        key = (stage, dp_idx, tp_idx)
        links = self._ring.get(key)
        if links is None:
            pl = self.pl
            if self.full:
                links = self._own(pl.rank(stage, dp_idx, tp_idx),
                                  pl.rank(stage, (dp_idx + 1) % pl.dp, tp_idx))
            else:
                links = weighted_route(self.topo, [
                    (pl.rank(stage, d, t), pl.rank(stage, (d + 1) % pl.dp, t))
                    for d in range(pl.dp) for t in range(pl.tp)])
            self._ring[key] = links
        return links

    def tp_ring(self, stage: int, dp_idx: int) -> tuple[Links, float]:
        """(weighted links, demand cap in bytes/s) of the ring of the TP group (stage,
        dp index); representative mode weights each link by every dp copy's ring
        edges. The cap is the links' nominal (undegraded) capacity per unit weight, so
        a degraded link still slows the flow."""
        key = (stage, dp_idx)
        got = self._tp.get(key)
        if got is None:
            pl, topo = self.pl, self.topo

            def edges(d: int) -> list[tuple[int, int]]:
                return [(pl.rank(stage, d, t), pl.rank(stage, d, (t + 1) % pl.tp))
                        for t in range(pl.tp)]

            own = edges(dp_idx)
            every = own if self.full else [e for d in range(pl.dp) for e in edges(d)]
            cnt = Counter(ln for a, b in every for ln in topo.route(a, b))
            names = dict.fromkeys(ln for a, b in own for ln in topo.route(a, b))
            links = tuple((ln, float(cnt[ln])) for ln in names)
            cap = min((topo.inter_Bps if ln.startswith("node") else topo.intra_Bps) / w
                      for ln, w in links)
            got = self._tp[key] = (links, cap)
        return got

    def every_route(self, pairs: Iterable[tuple[int, int]], stages: int,
                    copies: list[tuple[int, int]]) -> list[Links]:
        """The links of every flow a run can start: pipeline transfers between the
        stage ``pairs`` and data-parallel ring steps of every stage, for each copy
        (dp index, tp index) simulated, and the tensor-parallel rings of every stage
        and dp index (what the fabric bundles its links by)."""
        pairs = sorted(set(pairs))
        out = [self.p2p(a, b, d, t) for d, t in copies for a, b in pairs]
        dps = sorted({d for d, _t in copies})
        for s in range(stages):
            if self.pl.dp > 1:  # one data-parallel rank reduces nothing on the links
                out += [self.dp_ring(s, d, t) for d, t in copies]
            if self.pl.tp > 1:
                out += [self.tp_ring(s, d)[0] for d in dps]
        return out
