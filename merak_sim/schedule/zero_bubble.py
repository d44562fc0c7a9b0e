"""Single-chunk zero-bubble schedules: ZB-H1, ZB-H2, a cost-aware variant and zero
bubble with Merak's recomputation.

Each splits every backward into I (input gradient, on the critical path: its result
goes upstream) and W (weight gradient, needed only by the optimizer step), and moves
the W passes into the slots where 1F1B idles (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024). A micro-batch's activations are freed at its W, so every
postponed W holds one more micro-batch.

Unit costs below mean F = I = W = 1 (``replay(s, f=1, b=2, w=1)``). No single-chunk
schedule beats ``max(3M + S - 1, 2M + 2S - 1)`` there: the last rank cannot start
before S - 1 and has 3M of work; and its last I ends no earlier than S - 1 + 2M (all
its F and I passes), after which that gradient crosses S - 1 ranks and rank 0 still
runs one W (the larger term when M < S).
``zb-h1`` and ``zb-h2`` reach that bound for every (S, M) (tests check the grid).

Memory: 1F1B holds S - s micro-batches on rank s, so its memory-limiting rank 0
holds S. ``zb-h1`` holds min(S, M) on every rank: the rank that limits 1F1B holds
exactly what it holds under 1F1B, the others up to s more. Equality on every rank
is impossible at the bound: a last rank holding one micro-batch must run F I W of
each micro-batch back to back, so its last I ends at S - 2 + 3M and rank S-2's last
I and W end one unit past the bound. ``zb-h2`` holds min(2S - 1, M) (about 2x) and, for
M >= 2S - 1, keeps every rank busy without a gap from its first forward at time s
to 3M + s: the idle time is the parallelogram's two corners only.

The cost-aware ``zb-auto`` takes per-rank F, I, W times and a memory limit in
micro-batches per rank (:class:`ZeroBubbleCosts`), builds candidate orders
(ZB-H1's, lagged-W orders using the memory limit, and greedy list schedules at the
given times) and keeps the one with the shortest makespan under those times.
``zb-scp`` is ZB-H1 with Merak's recomputation (Lai et al., TPDS 2023): micro-batches
whose I would wait for its gradient run their forward as F* and re-forward (R) in
the wait, as the shifted critical path schedule does; the last rank never recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .execute import execute
from .ir import Action, Kind, Schedule, ScheduleError, Step
from .lowering import lower

__all__ = ["StageTimes", "ZeroBubbleCosts", "list_schedule", "zb_h1", "zb_h2",
           "zb_auto", "zb_scp", "order_makespan", "uniform_fractions"]

F, FN, R, I, W = (  # noqa: E741 - the IR's own letters
    Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE, Kind.BACKWARD_INPUT,
    Kind.BACKWARD_WEIGHT)

#: A rank's compute order as (kind, micro-batch) pairs.
Order = list[tuple[Kind, int]]


@dataclass(frozen=True)
class StageTimes:
    """Compute times of one pipeline rank for one micro-batch (any unit).

    Attributes:
        forward: F.
        backward_input: I (input gradient).
        backward_weight: W (weight gradient).
        recompute: R (re-forward); the forward time if not given.
        send: transfer time of this rank's output activation to the next rank (and
            of the gradient coming back over the same link).
    """

    forward: float = 1.0
    backward_input: float = 1.0
    backward_weight: float = 1.0
    recompute: float | None = None
    send: float = 0.0

    def __post_init__(self) -> None:
        times = (self.forward, self.backward_input, self.backward_weight,
                 self.forward if self.recompute is None else self.recompute)
        if min(times) < 0 or min(times[:3]) <= 0 or self.send < 0:
            raise ScheduleError(f"stage times must be positive, got {self}")

    def of(self, kind: Kind) -> float:
        """Time of one compute action of ``kind`` (0 for AR and OPT)."""
        if kind in (F, FN):
            return self.forward
        if kind is R:
            return self.forward if self.recompute is None else self.recompute
        if kind is I:
            return self.backward_input
        if kind is W:
            return self.backward_weight
        return 0.0


@dataclass(frozen=True)
class ZeroBubbleCosts:
    """What the cost-aware schedule adapts to.

    Attributes:
        times: one :class:`StageTimes` per pipeline rank.
        memory_limit: most micro-batches each rank may hold (one int for every
            rank, or one per rank); None: ZB-H1's min(S, M) on every rank.
    """

    times: tuple[StageTimes, ...]
    memory_limit: int | tuple[int, ...] | None = None

    def limits(self, S: int, M: int) -> tuple[int, ...]:
        """Per-rank limit in micro-batches, at least 1 (F I W back to back)."""
        if len(self.times) != S:
            raise ScheduleError(f"cost-aware schedule got times for {len(self.times)} "
                                f"ranks but pp={S}")
        lim = self.memory_limit
        if lim is None:
            lim = min(S, M)
        per = (lim,) * S if isinstance(lim, int) else tuple(lim)
        if len(per) != S:
            raise ScheduleError(f"memory_limit has {len(per)} entries for pp={S}")
        return tuple(max(1, min(int(x), M)) for x in per)


def uniform_fractions(num_stages: int, c0: float) -> tuple[float, ...]:
    """Merak T2's stage-aware rule for the zero-bubble family: T2 holds (1 - c_s) x
    (micro-batches rank s holds) equal to rank 0's, and these schedules hold rank
    0's count on every rank, so every rank checkpoints rank 0's fraction c0 (ranks
    a spec marks as never recomputing still get 0)."""
    if not 0.0 <= c0 <= 1.0:
        raise ScheduleError(f"c0 must lie in [0, 1], got {c0}")
    return (float(c0),) * num_stages


def _unit(S: int) -> tuple[StageTimes, ...]:
    return (StageTimes(),) * S


def _lagged(S: int, M: int, lags: Sequence[int]) -> list[Order]:
    """1F1B's F / I order with W of micro-batch m placed after I of m + lag_s (and
    the W passes left over after the last I). Rank s holds S - s + lag_s."""
    out = []
    for s in range(S):
        warm, d = min(S - 1 - s, M), lags[s]
        order: Order = [(F, m) for m in range(warm)]
        for m in range(M):
            if warm + m < M:
                order.append((F, warm + m))
            order.append((I, m))
            if m - d >= 0:
                order.append((W, m - d))
        order += [(W, m) for m in range(max(0, M - d), M)]
        out.append(order)
    return out


def list_schedule(S: int, M: int, times: Sequence[StageTimes],
                  limits: Sequence[int]) -> list[Order]:
    """Greedy list schedule at the given times: each rank, whenever it is free, runs
    the next I whose gradient has arrived, else the next F whose input has arrived if
    it holds fewer than its limit, else its oldest pending W, else waits. Ranks decide
    in time order (ties by rank), so the result is a pure function of its arguments.
    A transfer over the link after rank s takes ``times[s].send``."""
    inf = float("inf")
    clock = [0.0] * S
    blocked: list[float | None] = [None] * S
    act = [dict.fromkeys(range(M), 0.0) if s == 0 else {} for s in range(S)]
    grad: list[dict[int, float]] = [{} for _ in range(S)]
    nf, ni, held = [0] * S, [0] * S, [0] * S
    pending: list[list[int]] = [[] for _ in range(S)]
    orders: list[Order] = [[] for _ in range(S)]
    left = set(range(S))

    def arrive(box: dict[int, float], rank: int, m: int, at: float) -> None:
        box[m] = at
        if blocked[rank] is not None:
            clock[rank], blocked[rank] = max(blocked[rank], at), None

    while left:
        s = min(left, key=lambda x: (clock[x], x))
        now = clock[s]
        if now == inf:
            raise ScheduleError(f"list schedule stuck (pp={S}, M={M}, limits={limits})")
        can_f = nf[s] < M and held[s] < limits[s]
        if ni[s] < nf[s] and grad[s].get(ni[s], inf) <= now:
            kind, m = I, ni[s]
        elif can_f and act[s].get(nf[s], inf) <= now:
            kind, m = F, nf[s]
        elif pending[s]:
            kind, m = W, pending[s][0]
        else:
            nxt = min(grad[s].get(ni[s], inf) if ni[s] < nf[s] else inf,
                      act[s].get(nf[s], inf) if can_f else inf)
            if nxt == inf:
                blocked[s], clock[s] = now, inf
            else:
                clock[s] = nxt
            continue
        end = now + times[s].of(kind)
        orders[s].append((kind, m))
        clock[s] = end
        if kind is F:
            nf[s] += 1
            held[s] += 1
            if s + 1 < S:
                arrive(act[s + 1], s + 1, m, end + times[s].send)
            else:
                grad[s][m] = end
        elif kind is I:
            ni[s] += 1
            pending[s].append(m)
            if s > 0:
                arrive(grad[s - 1], s - 1, m, end + times[s - 1].send)
        else:
            pending[s].pop(0)
            held[s] -= 1
            if ni[s] == M and not pending[s]:
                left.discard(s)
    return orders


def _peak_held(order: Order) -> int:
    """Most micro-batches a rank's order holds (F or F* to W)."""
    cur = top = 0
    for k, _m in order:
        cur += k in (F, FN)
        cur -= k is W
        top = max(top, cur)
    return top


def _programs(S: int, orders: Sequence[Order]) -> list[list[Step]]:
    return [[Action(k, s, m) for k, m in orders[s]] for s in range(S)]


def order_makespan(S: int, M: int, programs: Sequence[Sequence[Step]],
                   times: Sequence[StageTimes]) -> float:
    """Makespan of per-rank compute programs run under ``times`` (activations and
    gradients cross the link after rank s in ``times[s].send``)."""
    sched = lower(Schedule("candidate", S, M, 1, tuple(tuple(p) for p in programs),
                           lowered=False))

    def transfer(a: Action) -> float:
        return times[a.stage if a.kind is Kind.SEND_ACT else a.stage - 1].send
    return execute(sched, lambda a: times[a.stage].of(a.kind), transfer).makespan


def zb_h1(S: int, M: int) -> list[list[Step]]:
    """ZB-H1 (Qi et al., ICLR 2024): 1F1B's forward and input-gradient order with the
    W of micro-batch m postponed on rank s until after the I of micro-batch m + s, so
    the postponed W passes fill 1F1B's cool-down. Every rank holds min(S, M)
    micro-batches, 1F1B's peak (module docstring). Unit-cost makespan
    max(3M + S - 1, 2M + 2S - 1): 27 for S=4, M=8 and 55 for S=8, M=16 (1F1B: 33, 69).
    """
    return _programs(S, _lagged(S, M, range(S)))


def zb_h2(S: int, M: int) -> list[list[Step]]:
    """ZB-H2 (Qi et al., ICLR 2024): up to 2S - 1 micro-batches in flight on every
    rank (about twice 1F1B's peak of S), so the warm-up runs extra forwards and no
    rank idles between its first and last action once M >= 2S - 1: rank s is busy
    from s to 3M + s at unit costs, makespan 3M + S - 1, idle time only in the
    parallelogram's corners (the paper fills them from the next iteration by
    relaxing the optimizer's synchronisation, which this single-iteration schedule
    does not do). The order is the greedy list schedule at unit costs."""
    return _programs(S, list_schedule(S, M, _unit(S), [2 * S - 1] * S))


def zb_auto(S: int, M: int, costs: ZeroBubbleCosts | None = None) -> list[list[Step]]:
    """Cost-aware zero bubble: the fastest, under ``costs.times``, of ZB-H1's order
    (when the memory limit allows it), lagged-W orders that postpone each rank's W
    as far as its limit allows, and greedy list schedules at the given times with
    the limits and with ZB-H1's; never holds more than ``costs.memory_limit``
    micro-batches on a rank. Ties keep the earlier candidate, ZB-H1's order first.
    Without costs (unit times, ZB-H1's memory) that is ZB-H1's order, which reaches
    the unit-cost bound, so it is returned without building the others."""
    if costs is None:
        return zb_h1(S, M)
    times, lim = costs.times, costs.limits(S, M)
    cands: list[list[Order]] = []
    if all(x >= min(S, M) for x in lim):
        cands.append(_lagged(S, M, range(S)))
    # Lag d on rank s holds min(S - s + d, M) micro-batches at most.
    cands.append(_lagged(S, M, [max(0, lim[s] - (S - s)) for s in range(S)]))
    cands.append(list_schedule(S, M, times, lim))
    hold = [min(x, min(S, M)) for x in lim]
    if hold != list(lim):
        cands.append(list_schedule(S, M, times, hold))
    best, best_t = None, float("inf")
    for orders in cands:
        if any(_peak_held(o) > lim[s] for s, o in enumerate(orders)):
            continue
        progs = _programs(S, orders)
        t = order_makespan(S, M, progs, times)
        if t < best_t - 1e-12:
            best, best_t = progs, t
    assert best is not None
    return best


def _with_recompute(S: int, orders: Sequence[Order], waits: Sequence[set[int]]
                    ) -> list[list[Step]]:
    """Rank s's micro-batches in ``waits[s]`` run F* and re-forward (R) before their I."""
    progs: list[list[Step]] = []
    for s in range(S):
        prog: list[Step] = []
        for k, m in orders[s]:
            if m in waits[s] and k is F:
                prog.append(Action(FN, s, m))
            elif m in waits[s] and k is I:
                prog += [Action(R, s, m), Action(I, s, m)]
            else:
                prog.append(Action(k, s, m))
        progs.append(prog)
    return progs


def zb_scp(S: int, M: int) -> list[list[Step]]:
    """ZB-H1 with Merak's recomputation placed into waits: on every rank but the last,
    a micro-batch whose backward would start after waiting for its gradient runs its
    forward as F* (keeping only its input) and its backward as R then I, so the
    lowering puts the gradient receive between them and the re-forward overlaps the
    wait, as in the shifted critical path schedule. At unit costs with a full
    re-forward (F = R = I = W = 1, an I paying its recompute unless an R ran for it)
    those are, on ranks s <= S-3, the first S-2 micro-batches (their backwards wait
    for the first gradients) and the last S-1-s (the cool-down's, whose gradients are
    still travelling), and on rank S-2 micro-batch 0; marking waiting backwards until
    none is left reaches the same makespans (tests check S 2..6, M 1..2S). The last rank never
    recomputes (its I follows its F at once). At r = 1 with full recompute: 34 for
    S=4, M=8 and 70 for S=8, M=16 (shifted critical path: 38, 82)."""
    waits: list[set[int]] = []
    for s in range(S):
        if s == S - 1:
            waits.append(set())
        elif s == S - 2:
            waits.append({0})
        else:
            waits.append(set(range(min(S - 2, M))) | set(range(max(0, M - (S - 1 - s)), M)))
    return _with_recompute(S, _lagged(S, M, range(S)), waits)
