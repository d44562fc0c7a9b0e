"""Pipeline schedule generators: pure functions (S, M, ...) -> compute-only Schedule.

Each generator returns the *compute* order of every rank (F, F*, R, B, I, W, AR, OPT)
and places a communication action itself only where its placement deviates from the
default that :func:`merak_sim.schedule.lowering.lower` would choose (receive right
before its consumer, send right after its producer, adjacent send+receive to the
same peer fused). Use :func:`generate` to get a lowered, ready-to-run schedule.

Sources: GPipe (Huang et al., NeurIPS 2019); 1F1B / PipeDream-flush (Narayanan et
al., ICML 2021); interleaved 1F1B (Narayanan et al., SC 2021, Megatron-LM); ZB-H1
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024); Merak's family (Lai et
al., TPDS 2023, as described in shared/reference/merak.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .ir import Action, Kind, Schedule, ScheduleError, Step
from .lowering import lower

__all__ = [
    "SCHEDULES",
    "ScheduleSpec",
    "generate",
    "gpipe",
    "one_f_one_b",
    "interleaved_1f1b",
    "zb_h1",
    "pre_recompute",
    "last_no_recompute",
    "shifted_critical_path",
]

F, FN, R, B, I, W = (  # noqa: E741 - the IR's own letters
    Kind.FORWARD,
    Kind.FORWARD_NOGRAD,
    Kind.RECOMPUTE,
    Kind.BACKWARD,
    Kind.BACKWARD_INPUT,
    Kind.BACKWARD_WEIGHT,
)


def _check(S: int, M: int, v: int = 1) -> None:
    for name, val in (("pp", S), ("microbatches", M), ("virtual stages", v)):
        if not isinstance(val, int) or isinstance(val, bool):
            raise ScheduleError(f"{name} must be an integer, got {val!r}")
        if val < 1:
            raise ScheduleError(f"{name} must be >= 1, got {val}")


def _tail(s: int) -> tuple[Step, ...]:
    return (Action(Kind.ALL_REDUCE, s), Action(Kind.OPTIMIZER, s))


def _schedule(name: str, S: int, M: int, programs, v: int = 1, no_recompute=()) -> Schedule:
    return Schedule(
        name=name,
        num_stages=S,
        num_microbatches=M,
        virtual_stages=v,
        programs=tuple(tuple(p) + _tail(s) for s, p in enumerate(programs)),
        no_recompute_stages=frozenset(no_recompute),
        lowered=False,
    )


def gpipe(S: int, M: int) -> Schedule:
    """GPipe: every forward, then every backward (in micro-batch order).

    Requirements: S >= 1, M >= 1. Holds all M micro-batches' activations at once.
    """
    _check(S, M)
    progs = [
        [Action(F, s, m) for m in range(M)] + [Action(B, s, m) for m in range(M)]
        for s in range(S)
    ]
    return _schedule("gpipe", S, M, progs)


def _1f1b_order(S: int, M: int, s: int) -> list[tuple[Kind, int]]:
    """(kind, micro-batch) compute order of rank s in 1F1B: W_s warm-up forwards,
    steady (F, B) pairs, W_s cool-down backwards, with W_s = min(S-1-s, M)."""
    warm = min(S - 1 - s, M)
    order = [(F, m) for m in range(warm)]
    for i in range(M - warm):
        order += [(F, warm + i), (B, i)]
    order += [(B, m) for m in range(M - warm, M)]
    return order


def one_f_one_b(S: int, M: int) -> Schedule:
    """1F1B (PipeDream-flush): at most S - s micro-batches in flight on stage s.

    Requirements: S >= 1, M >= 1 (M < S works but leaves a larger bubble).
    """
    _check(S, M)
    progs = [[Action(k, s, m) for k, m in _1f1b_order(S, M, s)] for s in range(S)]
    return _schedule("1f1b", S, M, progs)


def interleaved_1f1b(S: int, M: int, v: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B with v model chunks per rank.

    Virtual micro-batch k runs chunk (k // S) % v of micro-batch (k // (S v)) S + k % S;
    backwards visit chunks in reverse. Rank s warms up with 2 (S - s - 1) + (v - 1) S
    forwards (all of them when M == S). Requirements: M a multiple of S; v >= 1; S >= 2
    when v > 1 (one rank cannot interleave with itself).
    """
    _check(S, M, v)
    if v > 1 and S < 2:
        raise ScheduleError("interleaved-1f1b with virtual stages > 1 needs pp >= 2")
    if M % S:
        raise ScheduleError(
            f"interleaved-1f1b needs microbatches to be a multiple of pp: M={M}, pp={S}"
        )
    total = M * v

    def fwd(k: int) -> tuple[int, int]:
        return (k // S) % v, (k // (S * v)) * S + k % S

    def bwd(k: int) -> tuple[int, int]:
        return v - 1 - (k // S) % v, (k // (S * v)) * S + k % S

    progs = []
    for s in range(S):
        warm = total if M == S else min(2 * (S - s - 1) + (v - 1) * S, total)
        prog = []
        for k in range(warm):
            c, m = fwd(k)
            prog.append(Action(F, s, m, c))
        for k in range(total - warm):
            c, m = fwd(warm + k)
            prog.append(Action(F, s, m, c))
            c, m = bwd(k)
            prog.append(Action(B, s, m, c))
        for k in range(total - warm, total):
            c, m = bwd(k)
            prog.append(Action(B, s, m, c))
        progs.append(prog)
    return _schedule("interleaved-1f1b", S, M, progs, v=v)


def zb_h1(S: int, M: int) -> Schedule:
    """ZB-H1-style zero-bubble schedule: 1F1B with each backward split into I (input
    gradient) and W (weight gradient).

    I sits where 1F1B runs B and its gradient is sent upstream at once, so the
    gradient path back up the pipeline carries only I passes; W follows its I. Memory
    equals 1F1B's (a micro-batch is freed at its W, S - s in flight on stage s). With
    static per-rank orders and f = I = W = 1 the makespan is 3M + 2(S-1), i.e. a bubble
    of (S-1)(F+I) instead of 1F1B's (S-1)(F+I+W); Qi et al. (ICLR 2024) reach
    (S-1)(F+I-W) by also filling the cool-down with postponed W passes adaptively,
    which a static order cannot express without extra memory.
    Requirements: S >= 1, M >= 1.
    """
    _check(S, M)
    progs = []
    for s in range(S):
        prog: list[Action] = []
        for k, m in _1f1b_order(S, M, s):
            prog += [Action(F, s, m)] if k is F else [Action(I, s, m), Action(W, s, m)]
        progs.append(prog)
    return _schedule("zb-h1", S, M, progs)


def _pre_recompute_programs(
    S: int, M: int, last: int, first_wait: bool
) -> list[list[Step]]:
    """1F1B where ranks 0..last run as F* every micro-batch whose backward starts
    after a wait for its gradient, and issue that backward as R then B (the lowering
    places rG between them, so the re-forward fills the wait). Those micro-batches are
    the cool-down ones and, if ``first_wait``, micro-batch 0 (whose backward follows
    the warm-up)."""
    progs: list[list[Step]] = []
    for s in range(S):
        order = _1f1b_order(S, M, s)
        if s > last:
            progs.append([Action(k, s, m) for k, m in order])
            continue
        waits = set(range(M - min(S - 1 - s, M), M))
        if first_wait:
            waits.add(0)
        prog: list[Step] = []
        for k, m in order:
            if m in waits and k is F:
                prog.append(Action(FN, s, m))
            elif m in waits and k is B:
                prog += [Action(R, s, m), Action(B, s, m)]
            else:
                prog.append(Action(k, s, m))
        progs.append(prog)
    return progs


def pre_recompute(S: int, M: int) -> Schedule:
    """Merak T1 item 2 alone ("recompute while waiting"), every stage recomputing.

    On every stage but the last, each micro-batch whose backward would start after an
    idle wait for its gradient (the cool-down ones, and micro-batch 0 after the
    warm-up) runs as F*, and its backward as "R rG B": the re-forward fills the wait.
    This reading reproduces the toy makespans of shared/reference/merak.md (41 for
    S=4, M=8 and 85 for S=8, M=16; f=1, b=2, r=1). Requirements: S >= 1, M >= 1.
    """
    _check(S, M)
    return _schedule("pre-recompute", S, M, _pre_recompute_programs(S, M, S - 2, True))


def last_no_recompute(S: int, M: int) -> Schedule:
    """Merak T1 items 1-2: :func:`pre_recompute` plus a last stage that never
    recomputes (its backward follows its forward at once). Toy makespans 39 (S=4,
    M=8) and 83 (S=8, M=16). Requirements: S >= 1, M >= 1.
    """
    _check(S, M)
    return _schedule(
        "last-no-recompute",
        S,
        M,
        _pre_recompute_programs(S, M, S - 2, True),
        no_recompute={S - 1},
    )


def shifted_critical_path(S: int, M: int) -> Schedule:
    """Merak's shifted critical path schedule (T1 items 1-3).

    On top of :func:`last_no_recompute`: stage S-2 starts F*0 sA0 F*1 F2 R0 rG0 sA1 B0
    sG0 R1 rG1 sA2 B1 (its third forward takes the slot where 1F1B runs B0, and B0/B1
    need no recompute because R0/R1 ran while waiting); stage S-3 starts with F*0 and
    runs R0 before B0; the last stage posts its first two gradient sends on their own
    instead of fused with the next receive, matching stage S-2's order.
    Requirements: M >= max(S, 4).
    """
    _check(S, M)
    if M < max(S, 4):
        raise ScheduleError(
            f"shifted-critical-path needs microbatches >= max(pp, 4) = {max(S, 4)}, got {M}"
        )
    progs = _pre_recompute_programs(S, M, S - 3, False)
    if S >= 3:  # stage S-3: F*0, and R0 right before B0
        s = S - 3
        prog = progs[s]
        prog[prog.index(Action(F, s, 0))] = Action(FN, s, 0)
        prog.insert(prog.index(Action(B, s, 0)), Action(R, s, 0))
    if S >= 2:  # stage S-2: three forwards, then B0 and B1 with their re-forwards
        s = S - 2
        head: list[Step] = [Action(FN, s, 0), Action(FN, s, 1), Action(F, s, 2)]
        for m in (0, 1):
            head += [
                Action(R, s, m),
                Action(Kind.RECV_GRAD, s, m),
                Action(Kind.SEND_ACT, s, m + 1),
                Action(B, s, m),
            ]
        # Steady state from F3 on follows 1F1B (which at this point runs F3 B2 F4 B3 ...).
        rest = _1f1b_order(S, M, s)[5:]
        progs[s] = head + [Action(k, s, m) for k, m in rest]
    if S >= 2:  # last stage: first two gradient sends not fused with the next receive
        s = S - 1
        prog = []
        for k, m in _1f1b_order(S, M, s):
            prog.append(Action(k, s, m))
            if k is B and m < 2:
                prog.append(Action(Kind.SEND_GRAD, s, m))
        progs[s] = prog
    return _schedule("shifted-critical-path", S, M, progs, no_recompute={S - 1})


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule: its generator and a one-line statement of requirements."""

    name: str
    build: Callable[..., Schedule]
    requires: str
    interleaved: bool = False
    merak: bool = False


SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec("gpipe", gpipe, "pp >= 1, microbatches >= 1"),
        ScheduleSpec("1f1b", one_f_one_b, "pp >= 1, microbatches >= 1"),
        ScheduleSpec(
            "interleaved-1f1b",
            interleaved_1f1b,
            "microbatches a multiple of pp; pp >= 2 if virtual stages > 1",
            interleaved=True,
        ),
        ScheduleSpec("zb-h1", zb_h1, "pp >= 1, microbatches >= 1"),
        ScheduleSpec("pre-recompute", pre_recompute, "pp >= 1, microbatches >= 1", merak=True),
        ScheduleSpec(
            "last-no-recompute", last_no_recompute, "pp >= 1, microbatches >= 1", merak=True
        ),
        ScheduleSpec(
            "shifted-critical-path",
            shifted_critical_path,
            "microbatches >= max(pp, 4)",
            merak=True,
        ),
    )
}


def generate(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Build the named schedule and lower it (communication added): ready to run.

    Raises :class:`ScheduleError` for unknown names or violated requirements.
    """
    spec = SCHEDULES.get(name)
    if spec is None:
        raise ScheduleError(
            f"unknown schedule {name!r}; choose one of: {', '.join(SCHEDULES)}"
        )
    if spec.interleaved:
        sched = spec.build(pp, microbatches, virtual_stages)
    else:
        if virtual_stages != 1:
            raise ScheduleError(
                f"schedule {name!r} has no virtual stages (got {virtual_stages}); "
                "use interleaved-1f1b or virtual stages 1"
            )
        sched = spec.build(pp, microbatches)
    return lower(sched)
