"""The SimPy discrete-event engine.

One ``simpy.Environment`` per run. Each simulated GPU is a process that runs its
pipeline rank's compiled program (:mod:`merak_sim.sim.program`) in order on its
compute stream; point-to-point transfers and data-parallel collectives run on
communication streams and, with contention on, occupy the links of a
:class:`~merak_sim.sim.entities.Fabric`; memory is allocated and freed on the GPU's
:class:`~merak_sim.sim.entities.HBM` as actions run.

Modes:
- ``representative``: one pipeline (the GPUs with data- and tensor-parallel index 0);
  the other replicas and tensor-parallel ranks are folded by symmetry (their link
  traffic is counted through flow weights).
- ``full``: every GPU is its own entity. Tensor-parallel peers run each compute
  action in lockstep (Megatron's per-layer all-reduces make the group as fast as its
  slowest member); data-parallel peers start each gradient reduction together.
  What-if knobs: a per-GPU slowdown factor, degraded links.

Tensor-parallel collectives (tp > 1): every compute action that contains TP
collectives (``Compiled.tp_s``) also occupies the "collective" stream for their total
time, as one aggregated flow per action (not one per layer, to keep large runs fast)
placed at the end of the action: the action's compute runs for ``d - tp_s``, the
collective for the last ``tp_s`` seconds, of which the first ``tp_s - tp_exposed_s``
overlap the compute (Merak's sub-pipelined TP, shared/reference/merak.md T3) and the
last ``tp_exposed_s`` are exposed (already counted in ``d``). With contention on, the
flow covers the directed links of the TP group's ring (one flow for the whole ring,
since a ring collective runs at the pace of its slowest edge), so it shares bandwidth
with pipeline transfers and data-parallel reductions on those links; if it is slowed,
the action ends when the collective does. A flow alone on idle links is never slowed
(its bandwidth demand is capped at the links' nominal capacity, because a calibrated
cost table may price the TP group faster than the topology's nominal link), so with
idle links the action takes exactly ``d``. With contention off the collective is only
drawn (``[end - tp_s, end]``) and the action takes ``d``.

With contention off every transfer takes its cost-table time and the engine performs
exactly the additions and maxima of :func:`merak_sim.sim.evaluator.evaluate`.
Determinism: SimPy orders simultaneous events by insertion; processes are created in
rank order and no randomness is used.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from merak_sim.schedule.ir import Kind

from .entities import HBM, Fabric, Placement, SyncGroup, Topology
from .program import OP_AR, OP_POST, Compiled

__all__ = ["EngineOptions", "EventLog", "run_engine"]


@dataclass(frozen=True)
class EngineOptions:
    """How to run the engine.

    Attributes:
        mode: "representative" or "full".
        contention: share link bandwidth between concurrent flows (needs topology).
        topology: the cluster's links (required when contention is on).
        overlap_dp: overlap the bucketed gradient reduction with the last backwards.
        buckets: gradient buckets per model chunk when overlapping.
        zero: ZeRO stage (0 or 1).
        slowdown: global rank -> compute-time multiplier (full mode what-if; 2.0 is a
            GPU twice as slow).
        record_memory: keep every memory change (the memory timeline).
    """

    mode: str = "representative"
    contention: bool = False
    topology: Topology | None = None
    overlap_dp: bool = False
    buckets: int = 1
    zero: int = 0
    slowdown: dict[int, float] = field(default_factory=dict)
    record_memory: bool = True


@dataclass
class EventLog:
    """What one simulation produced, shared by the engine and the fast evaluator.

    Attributes:
        prog: the compiled program.
        placement: rank placement.
        mode: "representative" or "full".
        ranks: global rank of each simulated entity.
        stage_of: pipeline rank of each entity.
        copy_of: index of the entity's (dp, tp) copy (0 in representative mode).
        acts: per entity, (action id, start, end) of every compute-stream action and
            the AR, in program order.
        xfers: per copy, (start list, end list) indexed by transfer id.
        buckets: per entity, (chunk, start, end) of overlapped gradient buckets.
        memory: per entity, its HBM.
        makespan: end of the last action or transfer.
        events_processed: SimPy events processed (0 for the evaluator).
        tp_comm: per entity, action id -> (start, end, delay) of the TP collectives
            the fabric simulated (contention on); ``delay`` is how much contention
            lengthened the action. Empty where not simulated: the collective then
            spans the action's last ``min(tp_s, duration)`` seconds.
    """

    prog: Compiled
    placement: Placement
    mode: str
    ranks: list[int]
    stage_of: list[int]
    copy_of: list[int]
    acts: list[list[tuple[int, float, float]]]
    xfers: list[tuple[list[float], list[float]]]
    buckets: list[tuple[tuple[int, float, float], ...]]
    memory: list[HBM]
    makespan: float
    events_processed: int = 0
    tp_comm: list[dict[int, tuple[float, float, float]]] = field(default_factory=list)


def _weights(topo: Topology, pl: Placement, pairs) -> tuple[tuple[str, float], ...]:
    """Links of the first (representative) pair with the number of pairs crossing each."""
    pairs = list(pairs)
    rep = topo.route(*pairs[0])
    cnt: Counter = Counter()
    for src, dst in pairs:
        for link in topo.route(src, dst):
            cnt[link] += 1
    return tuple((link, float(cnt[link])) for link in rep)


def run_engine(prog: Compiled, placement: Placement, capacity: float,
               opts: EngineOptions, capacities: dict[int, float] | None = None) -> EventLog:
    """Simulate one iteration of ``prog`` and return its :class:`EventLog`
    (``capacities``: memory capacity per global rank where it differs)."""
    import simpy

    if opts.mode not in ("representative", "full"):
        raise ValueError(f"unknown mode {opts.mode!r}; choose representative or full")
    if opts.contention and opts.topology is None:
        raise ValueError("contention needs a topology (a cluster); pass one or turn "
                         "contention off")
    if opts.buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {opts.buckets}")
    env = simpy.Environment()
    S = prog.num_ranks
    pl = placement
    if pl.pp != S:
        raise ValueError(f"placement has pp={pl.pp} but the schedule has {S} stages")
    full = opts.mode == "full"
    copies = [(d, t) for d in range(pl.dp) for t in range(pl.tp)] if full else [(0, 0)]
    ents = [(s, ci) for s in range(S) for ci in range(len(copies))]
    ranks = [pl.rank(s, *copies[ci]) for s, ci in ents]
    for r in opts.slowdown:
        if not 0 <= r < pl.world_size:
            raise ValueError(f"slowdown names GPU {r}, outside 0..{pl.world_size - 1}")
        if not full and r not in ranks:
            raise ValueError(f"slowdown of GPU {r} needs mode='full' (representative mode "
                             f"simulates only ranks {ranks})")
    fabric = Fabric(env, opts.topology) if opts.contention else None
    topo = opts.topology
    nx = len(prog.transfers)
    xfers = [([0.0] * nx, [0.0] * nx) for _ in copies]
    # per copy, per transfer: [posted mask, done event, waiter event]
    xst = [[[0, None, None] for _ in range(nx)] for _ in copies]
    tp_groups = {}
    dp_groups = {}
    if full:
        for s in range(S):
            for d in range(pl.dp):
                tp_groups[(s, d)] = SyncGroup(env, pl.tp) if pl.tp > 1 else None
            for t in range(pl.tp):
                dp_groups[(s, t)] = SyncGroup(env, pl.dp)
    else:
        for s in range(S):
            tp_groups[(s, 0)] = None
            dp_groups[(s, 0)] = SyncGroup(env, 1)

    # Link routes and weights (contention only), cached per pipeline-rank pair.
    route_cache: dict = {}

    def p2p_links(src_s: int, dst_s: int, ci: int):
        key = (src_s, dst_s, ci)
        links = route_cache.get(key)
        if links is None:
            if full:
                d, t = copies[ci]
                links = tuple((ln, 1.0) for ln in topo.route(pl.rank(src_s, d, t),
                                                             pl.rank(dst_s, d, t)))
            else:
                links = _weights(topo, pl, [(pl.rank(src_s, d, t), pl.rank(dst_s, d, t))
                                            for d in range(pl.dp) for t in range(pl.tp)])
            route_cache[key] = links
        return links

    def ring_links(s: int, d: int, t: int):
        key = ("ring", s, d, t)
        links = route_cache.get(key)
        if links is None:
            nxt = (d + 1) % pl.dp
            if full:
                links = tuple((ln, 1.0) for ln in topo.route(pl.rank(s, d, t),
                                                             pl.rank(s, nxt, t)))
            else:
                links = _weights(topo, pl, [(pl.rank(s, dd, tt), pl.rank(s, (dd + 1) % pl.dp,
                                                                           tt))
                                            for dd in range(pl.dp) for tt in range(pl.tp)])
            route_cache[key] = links
        return links

    def tp_links(s: int, d: int):
        """(weighted links, demand cap) of the ring of the TP group (stage s, dp index
        d); representative mode weights each link by every dp copy's ring edges."""
        key = ("tp", s, d)
        got = route_cache.get(key)
        if got is None:
            def edges(dd):
                return [(pl.rank(s, dd, t), pl.rank(s, dd, (t + 1) % pl.tp))
                        for t in range(pl.tp)]
            own = edges(d)
            every = own if full else [e for dd in range(pl.dp) for e in edges(dd)]
            cnt: Counter = Counter()
            for a, b in every:
                for ln in topo.route(a, b):
                    cnt[ln] += 1
            names = dict.fromkeys(ln for a, b in own for ln in topo.route(a, b))
            links = tuple((ln, float(cnt[ln])) for ln in names)
            # Nominal (undegraded) capacity: a degraded link still slows the flow.
            cap = min((topo.inter_Bps if ln.startswith("node") else topo.intra_Bps) / w
                      for ln, w in links)
            got = route_cache[key] = (links, cap)
        return got

    tp_s = prog.tp_s
    tp_bytes = prog.tp_bytes
    tp_store: dict = {}
    use_tp = fabric is not None and pl.tp > 1 and any(tp_s)

    def tp_run(d: float, x: int, s: int, d_idx: int):
        """A compute action of ``d`` seconds whose TP collective runs on the fabric
        during its last ``tp_s`` seconds (module docstring)."""
        t0 = env.now
        xt = tp_s[x] if tp_s[x] < d else d
        links, cap = tp_links(s, d_idx)
        demand = tp_bytes[x] / xt
        base = env.timeout(d)
        if d > xt:
            yield env.timeout(d - xt)
        c0 = env.now
        fl = fabric.flow(links, xt, demand if demand < cap else cap)
        yield base
        if fl.slowed and not fl.done.triggered:
            yield fl.done
        tp_store[(s, d_idx, x)] = (c0, env.now, env.now - (t0 + d))

    def start_transfer(ci: int, tid: int):
        tr = prog.transfers[tid]
        st = xst[ci][tid]
        xs, xe = xfers[ci]
        xs[tid] = env.now
        if fabric is not None and tr.duration_s > 0 and tr.nbytes > 0:
            ev = fabric.start(p2p_links(tr.src, tr.dst, ci), tr.duration_s,
                              tr.nbytes / tr.duration_s)
        else:
            ev = env.timeout(tr.duration_s)
        ev.callbacks.append(lambda _e: xe.__setitem__(tid, env.now))
        if st[2] is not None:
            waiter = st[2]
            ev.callbacks.append(lambda _e: waiter.succeed())
        st[1] = ev

    def collective_fn(s: int, t: int, vol_per_s: float):
        """Start function of a data-parallel collective of stage ``s``, tp index t."""
        if fabric is None or pl.dp == 1 or vol_per_s <= 0:
            return None

        def start(duration: float):
            if duration <= 0:
                return env.timeout(0.0)
            if full:
                evs = [fabric.start(ring_links(s, d, t), duration, vol_per_s)
                       for d in range(pl.dp)]
                return env.all_of(evs)
            return fabric.start(ring_links(s, 0, 0), duration, vol_per_s)

        return start

    acts_all: list[list] = []
    tp_all: list[dict] = []
    buckets_all: list = []
    memories: list[HBM] = []
    actions = prog.actions
    dur = prog.duration_s
    alloc = prog.mem_alloc
    free = prog.mem_free
    ar_ids = {}
    for s in range(S):
        for code, x, _y in prog.ops[s]:
            if code == OP_AR:
                ar_ids[s] = x

    def gpu(e: int):
        s, ci = ents[e]
        d_idx, t_idx = copies[ci]
        grank = ranks[e]
        slow = float(opts.slowdown.get(grank, 1.0))
        hbm = memories[e]
        acts = acts_all[e]
        tpw = tp_all[e]
        my_x = xst[ci]
        tpg = tp_groups[(s, d_idx)]
        dpg = dp_groups[(s, t_idx)]
        ar_total = dur[ar_ids[s]] if s in ar_ids else 0.0
        vol = 2.0 * (pl.dp - 1) / pl.dp * prog.grad_bytes[s]
        coll = collective_fn(s, t_idx, vol / ar_total if ar_total > 0 else 0.0)
        last_b = set(prog.last_backward[s])
        overlap = opts.overlap_dp and ar_total > 0 and bool(prog.ar_chunks[s])
        bucket_q: list = []
        bucket_ev = [env.event()]
        ar_done = env.event()
        rb: list = []
        buckets_all[e] = rb
        nb = opts.buckets
        share = 0.5 if opts.zero == 1 else 1.0
        chunk_ar = dict(prog.ar_chunks[s])

        def coll_stream():
            total = len(prog.ar_chunks[s]) * nb
            done = 0
            while done < total:
                if not bucket_q:
                    yield bucket_ev[0]
                    continue
                ch, ready, dd = bucket_q.pop(0)
                if ready > env.now:
                    yield env.timeout(ready - env.now)
                ev = dpg.arrive(("b", done), dd, coll)
                t0 = yield ev
                rb.append((ch, t0, env.now))
                done += 1
            ar_done.succeed()

        def push_buckets(aid: int, t0: float, d: float):
            ch = actions[aid].chunk
            for j in range(nb):
                bucket_q.append((ch, t0 + d * (j + 1) / nb, chunk_ar[ch] * share / nb))
            ev = bucket_ev[0]
            bucket_ev[0] = env.event()
            ev.succeed()

        if overlap:
            env.process(coll_stream())

        for code, x, y in prog.ops[s]:
            if code == OP_POST:
                st = my_x[x]
                st[0] |= 1 if y else 2
                if st[0] == 3:
                    start_transfer(ci, x)
                continue
            if code == OP_AR:
                if overlap:
                    if not ar_done.processed:
                        yield ar_done
                    acts.append((x, rb[0][1] if rb else env.now, env.now))
                    continue
                d = dur[x]
                if d > 0:
                    ev = dpg.arrive("ar", d, coll)
                    t0 = yield ev
                    acts.append((x, t0, env.now))
                else:
                    acts.append((x, env.now, env.now))
                continue
            if y >= 0:
                st = my_x[y]
                ev = st[1]
                if ev is None:
                    ev = st[2] = env.event()
                if not ev.processed:
                    yield ev
            d = dur[x] * slow
            a = actions[x]
            on_fab = use_tp and tp_s[x] > 0 and tp_bytes[x] > 0
            if tpg is not None and a.kind is not Kind.OPTIMIZER:
                pb = (lambda t0, dd, x=x: push_buckets(x, t0, dd)) if (
                    overlap and x in last_b) else None
                sf = ((lambda dd, x=x: env.process(tp_run(dd, x, s, d_idx)))
                      if on_fab else None)
                ev = tpg.arrive(x, d, start_fn=sf, on_start=pb)
                t0 = yield ev
                hbm.alloc(t0, alloc[x], x)
                hbm.free(env.now, free[x])
                acts.append((x, t0, env.now))
                if on_fab:
                    tpw[x] = tp_store[(s, d_idx, x)]
            else:
                t0 = env.now
                hbm.alloc(t0, alloc[x], x)
                if overlap and x in last_b:
                    push_buckets(x, t0, d)
                if on_fab:
                    yield from tp_run(d, x, s, d_idx)
                    tpw[x] = tp_store[(s, d_idx, x)]
                else:
                    yield env.timeout(d)
                hbm.free(env.now, free[x])
                acts.append((x, t0, env.now))
            if a.kind is Kind.OPTIMIZER and overlap and opts.zero == 1:
                ag = ar_total * 0.5
                ev = dpg.arrive("ag", ag, coll)
                t0 = yield ev
                rb.append((-1, t0, env.now))

    for _e, (s, _ci) in enumerate(ents):
        cap = capacities.get(ranks[_e], capacity) if capacities else capacity
        memories.append(HBM(cap, prog.state_bytes[s], opts.record_memory))
        acts_all.append([])
        tp_all.append({})
        buckets_all.append(())
    for e in range(len(ents)):
        env.process(gpu(e))
    # Count processed events cheaply: SimPy has no counter, so wrap step().
    n_events = 0
    step = env.step
    try:
        while True:
            step()
            n_events += 1
    except simpy.core.EmptySchedule:
        pass
    for e, (s, _ci) in enumerate(ents):
        if len(acts_all[e]) != sum(1 for c, _x, _y in prog.ops[s] if c != OP_POST):
            raise RuntimeError(
                f"simulation stopped early on GPU {ranks[e]} (stage {s}): a transfer or "
                "collective never completed; the schedule or the engine is inconsistent"
            )
    makespan = 0.0
    for acts in acts_all:
        if acts:
            makespan = max(makespan, max(en for _a, _s, en in acts))
    for _xs, xe in xfers:
        if xe:
            makespan = max(makespan, max(xe))
    for rb in buckets_all:
        for _c, _s, en in rb:
            makespan = max(makespan, en)
    return EventLog(prog=prog, placement=pl, mode=opts.mode, ranks=ranks,
                 stage_of=[s for s, _ in ents], copy_of=[ci for _, ci in ents],
                 acts=acts_all, xfers=xfers, buckets=[tuple(b) for b in buckets_all],
                 memory=memories, makespan=makespan, events_processed=n_events,
                 tp_comm=tp_all)
