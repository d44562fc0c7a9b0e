"""The simulated GPUs of the discrete-event engine (:mod:`merak_sim.sim.engine`).

:class:`EngineOptions` says how to run the engine; an :class:`EngineRun` holds what
every GPU of one run shares: the clock, the compiled program, the fabric and its
routes, the lockstep and collective groups, and the state of every point-to-point
transfer. A :class:`GPU` owns its streams: the compute stream runs its pipeline rank's
program in order; the collective stream (only when the data-parallel reduction
overlaps the backwards) reduces the gradient buckets as they become ready. The
engine's module docstring states the timing rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from merak_sim.layout import RankLayout
from merak_sim.schedule.arrays import KIND_OF_CODE
from merak_sim.schedule.ir import Kind

from .buckets import chunk_buckets, overlapped_share
from .entities import HBM, Fabric, SyncGroup, Topology
from .program import Compiled
from .routes import LinkRoutes
from .structure import OP_AR, OP_POST

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

__all__ = ["EngineOptions", "TransferState", "EngineRun", "GPU"]


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


@dataclass(slots=True)
class TransferState:
    """Where one point-to-point transfer of one (data, tensor)-parallel copy stands.

    Attributes:
        send_posted / recv_posted: whether each side has been posted.
        done: event of the transfer's end, set when it starts (both posted).
        waiter: event a consumer waits on when it needs the transfer before it started.
    """

    send_posted: bool = False
    recv_posted: bool = False
    done: Any = None
    waiter: Any = None


class EngineRun:
    """The state one engine run shares between its GPUs (module docstring)."""

    def __init__(self, env: Any, prog: Compiled, placement: RankLayout, opts: EngineOptions):
        self.env = env
        self.prog = prog
        self.pl = pl = placement
        self.opts = opts
        self.full = full = opts.mode == "full"
        #: (dp index, tp index) of every simulated copy of the pipeline.
        self.copies = ([(d, t) for d in range(pl.dp) for t in range(pl.tp)] if full
                       else [(0, 0)])
        self.routes = LinkRoutes(opts.topology, pl, full) if opts.topology else None
        fa = prog.structure.arrays
        self.fabric = (Fabric(env, opts.topology, self.routes.every_route(
            zip(fa.send_rank.tolist(), fa.recv_rank.tolist(), strict=True), prog.num_ranks,
            self.copies)) if opts.contention else None)
        nx = len(prog.transfer_s)
        self.transfers = [[TransferState() for _ in range(nx)] for _ in self.copies]
        #: per copy, (start times, end times) indexed by transfer id.
        self.xfer_times = [([0.0] * nx, [0.0] * nx) for _ in self.copies]
        S = prog.num_ranks
        #: lockstep group of each (stage, dp index); None when alone.
        self.tp_groups: dict[tuple[int, int], SyncGroup | None] = {}
        #: data-parallel group of each (stage, tp index).
        self.dp_groups: dict[tuple[int, int], SyncGroup] = {}
        for s in range(S):
            for d in range(pl.dp if full else 1):
                self.tp_groups[(s, d)] = SyncGroup(env, pl.tp) if full and pl.tp > 1 else None
            for t in range(pl.tp if full else 1):
                self.dp_groups[(s, t)] = SyncGroup(env, pl.dp if full else 1)
        #: per copy (dp index, tp index), the rendezvous of the tied ranks' AR.
        self.tied_groups = ({c: SyncGroup(env, 2) for c in self.copies} if prog.tied_ar
                            else {})
        #: whether TP collectives are put on the fabric.
        self.tp_on_fabric = self.fabric is not None and pl.tp > 1 and any(prog.tp_s)
        #: (stage, dp index, action id) -> (start, end, delay) of a TP collective.
        self.tp_store: dict[tuple[int, int, int], tuple[float, float, float]] = {}
        #: per action id, its kind code and chunk (the engine builds no Action).
        self.kinds: list[int] = fa.kind.tolist()
        self.chunks: list[int] = fa.chunk.tolist()
        #: per transfer id: the sending and receiving ranks, and its bytes.
        self.t_src: list[int] = fa.send_rank.tolist()
        self.t_dst: list[int] = fa.recv_rank.tolist()
        self.t_bytes: tuple[float, ...] = prog.transfer_bytes

    def start_transfer(self, copy: int, tid: int) -> None:
        """Start transfer ``tid`` of ``copy`` now (both sides are posted)."""
        env = self.env
        dur, nbytes = self.prog.transfer_s[tid], self.t_bytes[tid]
        st = self.transfers[copy][tid]
        xs, xe = self.xfer_times[copy]
        xs[tid] = env.now
        if self.fabric is not None and dur > 0 and nbytes > 0:
            d_idx, t_idx = self.copies[copy]
            ev = self.fabric.start(self.routes.p2p(self.t_src[tid], self.t_dst[tid], d_idx,
                                                   t_idx), dur, nbytes / dur)
        else:
            ev = env.timeout(dur)
        ev.callbacks.append(lambda _e: xe.__setitem__(tid, env.now))
        if st.waiter is not None:
            waiter = st.waiter
            ev.callbacks.append(lambda _e: waiter.succeed())
        st.done = ev

    def dp_collective(self, stage: int, tp_idx: int, vol_per_s: float
                      ) -> Callable[[float], Any] | None:
        """Start function of a data-parallel collective of ``stage`` (tp index
        ``tp_idx``) on the fabric, or None when it is a plain timeout."""
        if self.fabric is None or self.pl.dp == 1 or vol_per_s <= 0:
            return None
        env, fabric, routes, pl = self.env, self.fabric, self.routes, self.pl

        def start(duration: float) -> Any:
            if duration <= 0:
                return env.timeout(0.0)
            if self.full:
                return env.all_of([fabric.start(routes.dp_ring(stage, d, tp_idx), duration,
                                                vol_per_s) for d in range(pl.dp)])
            return fabric.start(routes.dp_ring(stage, 0, 0), duration, vol_per_s)

        return start


class GPU:
    """One simulated GPU: its compute and collective streams, memory and records.

    Attributes:
        stage, copy, rank: pipeline rank, copy index and global rank.
        hbm: its memory.
        acts: (action id, start, end) of every compute-stream action and the AR.
        tp_comm: action id -> (start, end, delay) of TP collectives on the fabric.
        buckets: (chunk, start, end) of the overlapped gradient buckets.
    """

    def __init__(self, run: EngineRun, stage: int, copy: int, rank: int, hbm: HBM):
        prog, opts, env = run.prog, run.opts, run.env
        self.run = run
        self.env = env
        self.stage, self.copy, self.rank = stage, copy, rank
        self.dp_idx, self.tp_idx = run.copies[copy]
        self.hbm = hbm
        self.acts: list[tuple[int, float, float]] = []
        self.tp_comm: dict[int, tuple[float, float, float]] = {}
        self.buckets: list[tuple[int, float, float]] = []
        self.slow = float(opts.slowdown.get(rank, 1.0))
        self.tp_group = run.tp_groups[(stage, self.dp_idx)]
        self.dp_group = run.dp_groups[(stage, self.tp_idx)]
        ar = [x for code, x, _y in prog.ops[stage] if code == OP_AR]
        self.ar_total = prog.duration_s[ar[-1]] if ar else 0.0
        vol = 2.0 * (run.pl.dp - 1) / run.pl.dp * prog.grad_bytes[stage]
        self.dp_start = run.dp_collective(
            stage, self.tp_idx, vol / self.ar_total if self.ar_total > 0 else 0.0)
        self.last_backward = set(prog.last_backward[stage])
        self.overlap = opts.overlap_dp and self.ar_total > 0 and bool(prog.ar_chunks[stage])
        self.chunk_ar = dict(prog.ar_chunks[stage])
        self.bucket_queue: list[tuple[int, float, float]] = []
        self.bucket_wake = env.event()
        self.ar_done = env.event()

    # -- the compute stream -------------------------------------------------------------
    def compute_stream(self) -> Generator:
        """The process of the rank's program."""
        if self.overlap:
            self.env.process(self.collective_stream())
        if self.tp_group is None:
            yield from self._alone_stream()
            return
        for code, x, y in self.run.prog.ops[self.stage]:
            if code == OP_POST:
                self._post(x, bool(y))
            elif code == OP_AR:
                yield from self._all_reduce(x)
            else:
                yield from self._compute(x, y)

    def _alone_stream(self) -> Generator:
        """:meth:`compute_stream` of a GPU without tensor-parallel peers to keep step
        with: :meth:`_wait_transfer`, :meth:`_alone` and :meth:`_tp_collective`
        written out in one loop (the same events, created in the same order; the
        optimizer step and AR by their methods)."""
        run, env, prog = self.run, self.env, self.run.prog
        dur, tp_s, tp_b = prog.duration_s, prog.tp_s, prog.tp_bytes
        alloc, free, kinds = prog.mem_alloc, prog.mem_free, run.kinds
        hbm, acts, slow = self.hbm, self.acts, self.slow
        transfers = run.transfers[self.copy]
        tp_on, optimizer = run.tp_on_fabric, Kind.OPTIMIZER.code
        buckets = self.last_backward if self.overlap else ()
        ring = run.routes.tp_ring(self.stage, self.dp_idx) if tp_on else None
        # demands up to ``limit`` leave nothing to simulate (Fabric.serial_limit)
        limit = run.fabric.serial_limit(ring[0]) if tp_on else None
        if limit is None:
            limit = -1.0
        timeout = env.timeout
        it = iter(prog.structure.op_words[self.stage])
        for code, x, y in zip(it, it, it, strict=True):
            if code == OP_POST:
                self._post(x, bool(y))
                continue
            if code == OP_AR:
                yield from self._all_reduce(x)
                continue
            if kinds[x] == optimizer:
                yield from self._compute(x, y)
                continue
            if y >= 0:
                ev = transfers[y].done
                if ev is None:
                    ev = transfers[y].waiter = env.event()
                if ev.callbacks is not None:  # not processed yet
                    yield ev
            d = dur[x] * slow
            t0 = env.now
            hbm.alloc(t0, alloc[x], x)
            if x in buckets:
                self._push_buckets(x, t0, d)
            if tp_on and tp_s[x] > 0 and tp_b[x] > 0:
                xt = tp_s[x] if tp_s[x] < d else d
                demand = tp_b[x] / xt
                if demand > ring[1]:
                    demand = ring[1]
                base = timeout(d)
                if demand <= limit:
                    # Left off the links: nothing happens when the collective starts
                    # (the clock's own sum: now + delay), so no event for it.
                    c0 = t0 + (d - xt) if d > xt else t0
                    yield base
                else:
                    if d > xt:
                        yield timeout(d - xt)
                    c0 = env.now
                    fl = run.fabric.flow(ring[0], xt, demand, serial=True)
                    yield base
                    if fl.slowed and not fl.done.triggered:
                        yield fl.done
                self.tp_comm[x] = run.tp_store[(self.stage, self.dp_idx, x)] = (
                    c0, env.now, env.now - (t0 + d))
            else:
                yield timeout(d)
            hbm.free(env.now, free[x])
            acts.append((x, t0, env.now))

    def _post(self, tid: int, is_send: bool) -> None:
        st = self.run.transfers[self.copy][tid]
        if is_send:
            st.send_posted = True
        else:
            st.recv_posted = True
        if st.send_posted and st.recv_posted:
            self.run.start_transfer(self.copy, tid)

    def _wait_transfer(self, tid: int) -> Generator:
        st = self.run.transfers[self.copy][tid]
        ev = st.done
        if ev is None:
            ev = st.waiter = self.env.event()
        if not ev.processed:
            yield ev

    def _all_reduce(self, x: int) -> Generator:
        env = self.env
        tied = x in self.run.prog.tied_ar
        reached = env.now
        if tied:
            # A tied embedding's gradients are summed with the other end of the
            # pipeline first: wait until that rank reaches its AR too. The wait is part
            # of this rank's AR, as the runtime records it.
            yield self.run.tied_groups[(self.dp_idx, self.tp_idx)].arrive("tied", 0.0)
        if self.overlap:
            if not self.ar_done.processed:
                yield self.ar_done
            first = self.buckets[0][1] if self.buckets else env.now
            self.acts.append((x, min(first, reached) if tied else first, env.now))
            return
        d = self.run.prog.duration_s[x]
        if d > 0:
            t0 = yield self.dp_group.arrive("ar", d, self.dp_start)
            self.acts.append((x, reached if tied else t0, env.now))
        else:
            self.acts.append((x, reached if tied else env.now, env.now))

    def _compute(self, x: int, consumed: int) -> Generator:
        prog = self.run.prog
        if consumed >= 0:
            yield from self._wait_transfer(consumed)
        d = prog.duration_s[x] * self.slow
        kind = KIND_OF_CODE[self.run.kinds[x]]
        on_fabric = self.run.tp_on_fabric and prog.tp_s[x] > 0 and prog.tp_bytes[x] > 0
        if self.tp_group is not None and kind is not Kind.OPTIMIZER:
            yield from self._lockstep(x, d, on_fabric)
        else:
            yield from self._alone(x, d, on_fabric)
        if kind is Kind.OPTIMIZER and self.overlap and self.run.opts.zero == 1:
            # ZeRO-1: the all-gather half of the reduction runs after the step.
            t0 = yield self.dp_group.arrive("ag", self.ar_total * (1 - overlapped_share(1)),
                                           self.dp_start)
            self.buckets.append((-1, t0, self.env.now))

    def _lockstep(self, x: int, d: float, on_fabric: bool) -> Generator:
        """Run action ``x`` together with the GPU's tensor-parallel peers."""
        prog, env = self.run.prog, self.env
        on_start = ((lambda t0, dd: self._push_buckets(x, t0, dd))
                    if self.overlap and x in self.last_backward else None)
        start_fn = ((lambda dd: env.process(self._tp_collective(dd, x)))
                    if on_fabric else None)
        t0 = yield self.tp_group.arrive(x, d, start_fn=start_fn, on_start=on_start)
        self.hbm.alloc(t0, prog.mem_alloc[x], x)
        self.hbm.free(env.now, prog.mem_free[x])
        self.acts.append((x, t0, env.now))
        if on_fabric:
            self.tp_comm[x] = self.run.tp_store[(self.stage, self.dp_idx, x)]

    def _alone(self, x: int, d: float, on_fabric: bool) -> Generator:
        """Run action ``x`` on this GPU alone."""
        prog, env = self.run.prog, self.env
        t0 = env.now
        self.hbm.alloc(t0, prog.mem_alloc[x], x)
        if self.overlap and x in self.last_backward:
            self._push_buckets(x, t0, d)
        if on_fabric:
            yield from self._tp_collective(d, x)
            self.tp_comm[x] = self.run.tp_store[(self.stage, self.dp_idx, x)]
        else:
            yield env.timeout(d)
        self.hbm.free(env.now, prog.mem_free[x])
        self.acts.append((x, t0, env.now))

    def _tp_collective(self, d: float, x: int) -> Generator:
        """A compute action of ``d`` seconds whose TP collective runs on the fabric
        during its last ``tp_s`` seconds (engine module docstring)."""
        run, env = self.run, self.env
        t0 = env.now
        tp_s = run.prog.tp_s[x]
        xt = tp_s if tp_s < d else d
        links, cap = run.routes.tp_ring(self.stage, self.dp_idx)
        demand = run.prog.tp_bytes[x] / xt
        base = env.timeout(d)
        if d > xt:
            yield env.timeout(d - xt)
        c0 = env.now
        fl = run.fabric.flow(links, xt, demand if demand < cap else cap, serial=True)
        yield base
        if fl.slowed and not fl.done.triggered:
            yield fl.done
        run.tp_store[(self.stage, self.dp_idx, x)] = (c0, env.now, env.now - (t0 + d))

    # -- the collective stream ----------------------------------------------------------
    def _push_buckets(self, x: int, t0: float, d: float) -> None:
        """Queue the gradient buckets of chunk ``x``'s last backward, ready evenly
        through it, and wake the collective stream."""
        ch = self.run.chunks[x]
        opts = self.run.opts
        self.bucket_queue += [(ch, ready, dd) for ready, dd in
                              chunk_buckets(t0, d, self.chunk_ar[ch], opts.buckets, opts.zero)]
        ev, self.bucket_wake = self.bucket_wake, self.env.event()
        ev.succeed()

    def collective_stream(self) -> Generator:
        """The process reducing the gradient buckets in order as they are ready."""
        env = self.env
        total = len(self.run.prog.ar_chunks[self.stage]) * self.run.opts.buckets
        done = 0
        while done < total:
            if not self.bucket_queue:
                yield self.bucket_wake
                continue
            ch, ready, dd = self.bucket_queue.pop(0)
            if ready > env.now:
                yield env.timeout(ready - env.now)
            t0 = yield self.dp_group.arrive(("b", done), dd, self.dp_start)
            self.buckets.append((ch, t0, env.now))
            done += 1
        self.ar_done.succeed()
