"""Simulation entities: memory (HBM), links with bandwidth sharing, and the
synchronisation groups of tensor- and data-parallel peers (where ranks sit:
:class:`merak_sim.layout.RankLayout`).

Everything here is deterministic: no global counters, ties broken by insertion
order, which the event loop (:mod:`merak_sim.sim.kernel`, SimPy's rule) preserves for
events scheduled at the same time.

Link model ("proportional slowdown"): every transfer or collective is a *flow* with
an isolated duration (from the cost table: what it takes alone on the cluster) and
a bandwidth demand ``bytes / isolated duration`` on each directed link of its route.
When the demands on a link exceed its capacity, every flow on it progresses at
``capacity / total demand`` of its isolated speed; a flow's speed is the minimum over
its links (never above 1). A lone flow therefore takes exactly its cost-table time,
so switching contention on changes a result only where flows really overlap.
Representative mode weights each flow by the number of symmetric copies (data- and
tensor-parallel peers) that cross the same link, which makes it agree with full
mode on symmetric configurations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from merak_sim.layout import node_of

from .deferred import Deferred

__all__ = [
    "Topology",
    "HBM",
    "Fabric",
    "SyncGroup",
    "topology_from_cluster",
]


@dataclass(frozen=True)
class Topology:
    """Directed links of a cluster as seen by point-to-point and collective traffic.

    Links: ``gpu{r}.out`` / ``gpu{r}.in`` (a GPU's intra-node port, NVLink or PCIe, one
    direction) and ``node{n}.nic.out`` / ``node{n}.nic.in`` (all network adapters of a
    node together, one direction). Traffic between GPUs of one node uses the two GPU
    ports; traffic between nodes uses the two nodes' adapters.

    Attributes:
        gpus_per_node: GPUs per node.
        intra_Bps: bytes/s of one GPU's intra-node port, one direction.
        inter_Bps: bytes/s of one node's network adapters together, one direction.
        link_scale: capacity multipliers for degraded links, by link name.
    """

    gpus_per_node: int
    intra_Bps: float
    inter_Bps: float
    link_scale: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.intra_Bps <= 0 or self.inter_Bps <= 0:
            raise ValueError(
                "topology needs gpus_per_node >= 1 and positive link bandwidths, got "
                f"{self.gpus_per_node}, {self.intra_Bps}, {self.inter_Bps}"
            )
        for name, f in self.link_scale.items():
            if not f > 0:
                raise ValueError(f"link {name!r}: capacity factor must be > 0, got {f}")

    def node(self, rank: int) -> int:
        """Node index of a global rank."""
        return node_of(rank, self.gpus_per_node)

    def route(self, src: int, dst: int) -> tuple[str, ...]:
        """Directed links a transfer from ``src`` to ``dst`` crosses."""
        ns, nd = self.node(src), self.node(dst)
        if ns == nd:
            return (f"gpu{src}.out", f"gpu{dst}.in")
        return (f"node{ns}.nic.out", f"node{nd}.nic.in")

    def capacity(self, link: str) -> float:
        """Bytes/s of a directed link, after any degradation."""
        base = self.inter_Bps if link.startswith("node") else self.intra_Bps
        return base * self.link_scale.get(link, 1.0)

    def with_degraded(self, links: dict[str, float]) -> Topology:
        """A copy with the named links' capacity multiplied by the given factors."""
        scale = dict(self.link_scale)
        for name, f in links.items():
            if not (name.startswith("gpu") or name.startswith("node")) or not (
                name.endswith(".out") or name.endswith(".in")
            ):
                raise ValueError(
                    f"unknown link name {name!r}: use gpu<R>.out, gpu<R>.in, "
                    "node<N>.nic.out or node<N>.nic.in"
                )
            scale[name] = scale.get(name, 1.0) * float(f)
        return Topology(self.gpus_per_node, self.intra_Bps, self.inter_Bps, scale)


def _get(obj: Any, *names: str) -> Any:
    for n in names:
        cur = obj
        ok = True
        for part in n.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif hasattr(cur, part):
                cur = getattr(cur, part)
            else:
                ok = False
                break
        if ok and cur is not None:
            return cur
    return None


def topology_from_cluster(cluster: Any) -> Topology:
    """Link topology of a :class:`merak_sim.hardware.Cluster`: ``intra`` is one GPU's
    port into the node fabric and ``inter`` a whole node's adapters, per direction
    (read by attribute name, so any object of that shape works)."""
    gpn = _get(cluster, "gpus_per_node")
    intra = _get(cluster, "intra.bandwidth_Bps")
    inter = _get(cluster, "inter.bandwidth_Bps")
    if gpn is None or intra is None or inter is None:
        raise ValueError(
            f"cannot read gpus_per_node, intra.bandwidth_Bps and inter.bandwidth_Bps from "
            f"cluster {cluster!r}; pass an explicit merak_sim.sim.Topology"
        )
    return Topology(int(gpn), float(intra), float(inter))


class HBM:
    """Memory of one GPU: allocations and frees as actions run, peak and timeline.

    Exceeding ``capacity`` is recorded (first time, action, worst overflow), never
    raised: an out-of-memory configuration is a result.
    """

    __slots__ = ("capacity", "used", "peak", "timeline", "oom_time", "oom_action",
                 "overflow", "_record")

    def __init__(self, capacity: float, resident: float, record: bool = True):
        self.capacity = float(capacity)
        self.used = float(resident)
        self.peak = self.used
        self._record = record
        self.timeline: list[tuple[float, float]] = [(0.0, self.used)] if record else []
        self.oom_time: float | None = None
        self.oom_action: int | None = None
        self.overflow = 0.0
        if self.used > self.capacity:
            self.oom_time, self.oom_action = 0.0, -1
            self.overflow = self.used - self.capacity

    def alloc(self, t: float, nbytes: float, action: int) -> None:
        """Allocate ``nbytes`` at time ``t`` on behalf of ``action``."""
        if not nbytes:
            return
        self.used += nbytes
        if self._record:
            self.timeline.append((t, self.used))
        if self.used > self.peak:
            self._new_peak(self.used, t, action)

    def _new_peak(self, used: float, t: float, action: int) -> None:
        """Record ``used`` as the peak, reached at ``t`` by ``action``, and any excess
        over the capacity."""
        self.peak = used
        over = used - self.capacity
        if over > 0:
            if self.oom_time is None:
                self.oom_time, self.oom_action = t, action
            self.overflow = max(self.overflow, over)

    def free(self, t: float, nbytes: float) -> None:
        """Free ``nbytes`` at time ``t``."""
        if not nbytes:
            return
        self.used -= nbytes
        if self._record:
            self.timeline.append((t, self.used))

    def replay(self, ids: Sequence[int], start: Sequence[float], end: Sequence[float],
               alloc: Sequence[float], free: Sequence[float]) -> None:
        """For each action id of ``ids`` in order, :meth:`alloc` its ``alloc`` bytes
        at its start and :meth:`free` its ``free`` bytes at its end: the same
        operations in the same order, in one loop over local values."""
        used, peak = self.used, self.peak
        rec = self.timeline.append if self._record else None
        for x in ids:
            a = alloc[x]
            if a:
                used += a
                if rec is not None:
                    rec((start[x], used))
                if used > peak:
                    peak = used
                    self._new_peak(used, start[x], x)
            f = free[x]
            if f:
                used -= f
                if rec is not None:
                    rec((end[x], used))
        self.used = used

    def replay_arrays(self, ids: range, start: np.ndarray, end: np.ndarray,
                      alloc: np.ndarray, free: np.ndarray) -> None:
        """:meth:`replay` of the consecutive action ids ``ids`` with numpy arrays
        indexed by action id: the running use is one sequential cumulative sum over
        the same additions and subtractions in the same order (so the same floats),
        and the first out-of-memory action is the first allocation above the
        capacity (the first such use is a new peak: everything before it fit)."""
        lo, hi = ids.start, ids.stop
        a, f = alloc[lo:hi], free[lo:hi]
        steps = np.empty(2 * (hi - lo) + 1)
        steps[0] = self.used
        steps[1::2] = a
        steps[2::2] = -f
        used = np.cumsum(steps)
        after = used[1::2]
        grows = np.flatnonzero(a != 0)
        if len(grows):
            top = float(after[grows].max())
            if top > self.peak:
                self.peak = top
                over = top - self.capacity
                if over > 0:
                    if self.oom_time is None:
                        j = int(grows[np.argmax(after[grows] > self.capacity)])
                        self.oom_time, self.oom_action = float(start[lo + j]), lo + j
                    self.overflow = max(self.overflow, over)
        if self._record:
            self.timeline = Deferred(partial(_timeline, self.timeline, a, f, start[lo:hi],
                                             end[lo:hi], used))
        self.used = float(used[-1])


def _timeline(head: list[tuple[float, float]], a: np.ndarray, f: np.ndarray,
              start: np.ndarray, end: np.ndarray, used: np.ndarray
              ) -> list[tuple[float, float]]:
    """:attr:`HBM.timeline` after :meth:`HBM.replay_arrays`: ``head``, then (start,
    use) of each allocation and (end, use) of each free that changes the use."""
    t = np.empty(len(used) - 1)
    t[0::2] = start
    t[1::2] = end
    moves = np.empty(len(t), dtype=bool)
    moves[0::2] = a != 0
    moves[1::2] = f != 0
    return head + list(zip(t[moves].tolist(), used[1:][moves].tolist(), strict=True))


class SyncGroup:
    """Peers that start an operation together (tensor-parallel lockstep compute, a
    data-parallel collective): the operation starts when the last member arrives and
    lasts the longest member's duration (or as long as the fabric needs)."""

    __slots__ = ("env", "size", "_pending")

    def __init__(self, env: Any, size: int):
        self.env = env
        self.size = size
        self._pending: dict[Any, list] = {}

    def arrive(self, key: Any, duration: float, start_fn=None, on_start=None):
        """Join operation ``key``; returns an event that fires when it ends. Its value
        is the operation's start time. ``start_fn(duration)``, if given, is called by
        the last arrival and must return the event marking the end (a fabric flow);
        otherwise the end is a plain timeout of the longest duration. ``on_start(t0,
        duration)``, if given, is called for this member when the operation starts."""
        p = self._pending.get(key)
        if p is None:
            p = self._pending[key] = [0, 0.0, self.env.event(), []]
        p[0] += 1
        if duration > p[1]:
            p[1] = duration
        if on_start is not None:
            p[3].append(on_start)
        ev = p[2]
        if p[0] == self.size:
            del self._pending[key]
            t0 = self.env.now
            for cb in p[3]:
                cb(t0, p[1])
            end = start_fn(p[1]) if start_fn is not None else self.env.timeout(p[1])
            end.callbacks.append(lambda _e, ev=ev, t0=t0: ev.succeed(t0))
        return ev


class _Flow:
    """One flow on the fabric (``slowed``: its speed has dropped below 1 at least once,
    so it may end after ``start + work``); ``links`` are its (bundle, weight) pairs."""

    __slots__ = ("links", "demand", "remaining", "speed", "updated", "done", "gen", "fid",
                 "slowed")

    def __init__(self, fid, links, demand, work, now, done):
        self.fid = fid
        self.links = links  # tuple of (bundle id, weight)
        self.demand = demand
        self.remaining = work
        self.speed = 1.0
        self.updated = now
        self.done = done
        self.gen = 0
        self.slowed = False


class Fabric:
    """Directed links shared by flows under the proportional-slowdown model (module
    docstring). ``start(links, work_s, demand_Bps)`` returns an event that fires when
    the flow's isolated ``work_s`` seconds of progress are done.

    Links are kept in *bundles*: given every route the run will use (``routes``),
    links that every route crosses together, with the same weight, always carry the
    same flows, hence the same load (the same additions and subtractions in the same
    order), so one load per bundle stands for them all and a flow's speed is the
    smallest capacity of the bundle over that load: a tensor-parallel ring's sixteen
    GPU ports are one bundle. Without ``routes`` each link is its own bundle. A flow
    starting or ending updates the loads of its bundles and re-speeds the flows on
    them, in increasing flow id (the order that fixes simultaneous events)."""

    def __init__(self, env: Any, topology: Topology,
                 routes: Iterable[Sequence[tuple[str, float]]] | None = None):
        self.env = env
        self.topology = topology
        self._bundle: dict[str, int] = {}  # link name -> bundle id
        self._cap: list[float] = []  # per bundle: its smallest capacity
        self._load: list[float] = []
        self._on: list[dict[int, _Flow]] = []  # per bundle: its flows in id order
        self._compiled: dict[int, tuple[Any, tuple[tuple[int, float], ...]]] = {}
        self._exclusive: set[int] = set()  # bundles one route alone crosses
        self._fixed = routes is not None
        self._next_id = 0
        self.flows_started = 0
        if routes is not None:
            self._bundle_links([tuple(r) for r in routes])

    def _bundle_links(self, routes: list[tuple[tuple[str, float], ...]]) -> None:
        """Bundle the links of ``routes`` (class docstring); a bundle that one route
        alone crosses is *exclusive* (what :meth:`flow` may skip for a serial flow)."""
        crossed: dict[str, list[tuple[int, float]]] = {}
        for i, route in enumerate(routes):
            for link, w in route:
                crossed.setdefault(link, []).append((i, w))
        ids: dict[tuple, int] = {}
        for link, sig in crossed.items():
            b = ids.get(key := tuple(sig))
            if b is None:
                b = ids[key] = self._new_bundle(self.topology.capacity(link))
                if len({i for i, _w in sig}) == 1:
                    self._exclusive.add(b)
            self._bundle[link] = b
            self._cap[b] = min(self._cap[b], self.topology.capacity(link))

    def _new_bundle(self, capacity: float) -> int:
        self._cap.append(capacity)
        self._load.append(0.0)
        self._on.append({})
        return len(self._cap) - 1

    def capacity(self, link: str) -> float:
        """Capacity of a link."""
        return self.topology.capacity(link)

    def _route(self, links: Sequence[tuple[str, float]]) -> tuple[tuple[int, float], ...]:
        """``links`` as (bundle, weight) pairs, one per bundle crossed."""
        got = self._compiled.get(id(links))
        if got is not None and got[0] is links:
            return got[1]
        out: dict[int, float] = {}
        for link, w in links:
            b = self._bundle.get(link)
            if b is None:
                if self._fixed:
                    raise ValueError(f"link {link!r} is on no route the fabric was given")
                b = self._bundle[link] = self._new_bundle(self.topology.capacity(link))
            out.setdefault(b, w)
        route = tuple(out.items())
        self._compiled[id(links)] = (links, route)
        return route

    def start(self, links: Iterable[tuple[str, float]], work_s: float, demand_Bps: float):
        """Start a flow over weighted ``links``; returns its completion event."""
        return self.flow(links, work_s, demand_Bps).done

    def flow(self, links: Iterable[tuple[str, float]], work_s: float, demand_Bps: float,
             serial: bool = False) -> _Flow:
        """Start a flow like :meth:`start` and return it (its ``done`` event, and
        ``slowed``: whether contention has slowed it so far).

        ``serial``: flows over these links never overlap in time (a tensor-parallel
        group's collectives, one action after the other). Such a flow on links no
        other route crosses is alone for its whole life, so where alone it runs at
        full speed nothing can change it: it is not put on the links (its end and
        ``done`` event would be read by no one) and comes back with ``done`` None."""
        env = self.env
        if not isinstance(links, tuple):
            links = tuple(links)
        if work_s <= 0 or not links or demand_Bps <= 0:
            done = env.event()
            t = env.timeout(max(work_s, 0.0))
            t.callbacks.append(lambda _e: done.succeed())
            return _Flow(-1, (), 0.0, 0.0, env.now, done)
        route = self._route(links)
        if serial and self._alone_at_full_speed(route, demand_Bps):
            return _Flow(-1, route, demand_Bps, work_s, env.now, None)
        done = env.event()
        fid = self._next_id
        self._next_id += 1
        self.flows_started += 1
        f = _Flow(fid, route, demand_Bps, work_s, env.now, done)
        affected = self._touching(route)
        self._advance(affected)
        load, on = self._load, self._on
        for b, w in route:
            load[b] += w * demand_Bps
            on[b][fid] = f
        affected[fid] = f
        self._respeed(affected)
        return f

    def serial_limit(self, links: Sequence[tuple[str, float]]) -> float | None:
        """For serial flows over ``links`` (see :meth:`flow`): the largest demand at
        which such a flow is not put on the links, where every link has weight 1 and
        no other route crosses them (a demand above it, or None, goes through
        :meth:`flow`)."""
        route = self._route(links if isinstance(links, tuple) else tuple(links))
        if not route or any(b not in self._exclusive or w != 1.0 for b, w in route):
            return None
        return min(self._cap[b] for b, _w in route)

    def _alone_at_full_speed(self, route: tuple[tuple[int, float], ...], demand: float
                             ) -> bool:
        """Whether ``route`` crosses only exclusive bundles and a flow of ``demand``
        alone on them exceeds no capacity."""
        exclusive, cap = self._exclusive, self._cap
        return all(b in exclusive and not w * demand > cap[b] for b, w in route)

    def _touching(self, route: tuple[tuple[int, float], ...]) -> dict[int, _Flow]:
        """The flows on any bundle of ``route`` by increasing id: the order their
        speeds are reset in, which fixes the order of simultaneous events. Each bundle
        keeps its flows in id order (a new flow has the largest id), so one busy
        bundle, or several carrying the same flows, are copied as they are: the merge
        and sort run only where the sets differ."""
        on = self._on
        out: dict[int, _Flow] | None = None
        merged = False
        for b, _w in route:
            g = on[b]
            if not g:
                continue
            if out is None:
                out = dict(g)
            elif g.keys() != out.keys():
                out.update(g)
                merged = True
        if out is None:
            return {}
        return dict(sorted(out.items())) if merged else out

    def _advance(self, flows: dict[int, _Flow]) -> None:
        now = self.env.now
        for f in flows.values():
            f.remaining -= (now - f.updated) * f.speed
            f.updated = now

    def _respeed(self, flows: dict[int, _Flow]) -> None:
        env = self.env
        load, cap = self._load, self._cap
        for f in flows.values():
            sp = 1.0
            for b, _w in f.links:
                lb = load[b]
                c = cap[b]
                if lb > c:
                    s = c / lb
                    if s < sp:
                        sp = s
            if sp == f.speed and f.gen:
                continue
            if sp < 1.0:
                f.slowed = True
            f.speed = sp
            f.gen += 1
            rem = f.remaining if f.remaining > 0 else 0.0
            t = env.timeout(rem / sp)
            t.callbacks.append(partial(self._finish, f, f.gen))

    def _finish(self, f: _Flow, gen: int, _event: Any = None) -> None:
        if gen != f.gen:
            return  # superseded by a later speed change
        affected = self._touching(f.links)
        self._advance(affected)
        load, on = self._load, self._on
        for b, w in f.links:
            flows = on[b]
            del flows[f.fid]
            if flows:
                load[b] -= w * f.demand
            else:
                load[b] = 0.0
        affected.pop(f.fid, None)
        f.remaining = 0.0
        self._respeed(affected)
        f.done.succeed()
