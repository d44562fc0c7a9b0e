"""Pipeline schedule generators and their registry :data:`SCHEDULES`.

Each generator is a pure function (S, M[, v]) -> the *compute* order of every rank
(F, F*, R, B, I, W; :meth:`ScheduleSpec.build` appends AR and OPT). It places a
communication action itself only where its placement deviates from the default that
:func:`merak_sim.schedule.lowering.lower` would choose (receive right before its
consumer, send right after its producer, adjacent send+receive to the same peer
fused). Its :class:`~merak_sim.schedule.spec.ScheduleSpec` declares what it
requires and which ranks never recompute; the spec checks the requirements before the
generator runs. Use :func:`generate` to get a lowered, ready-to-run schedule.

Sources: GPipe (Huang et al., NeurIPS 2019); 1F1B / PipeDream-flush (Narayanan et
al., ICML 2021); interleaved 1F1B (Narayanan et al., SC 2021, Megatron-LM); ZB-H1
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; the zero-bubble family
is :mod:`merak_sim.schedule.zero_bubble`); Merak's family (Lai et al., TPDS 2023);
ZB-V and DualPipeV in :mod:`merak_sim.schedule.v_shape`.
"""

from __future__ import annotations

from .ir import Action, Kind, Schedule, ScheduleError, Step, make_action
from .lowering import lower
from .replay import stage_aware_fractions
from .spec import Period, ScheduleSpec
from .unchecked import action
from .v_shape import dualpipev, zb_v
from .zero_bubble import uniform_fractions, zb_auto, zb_h1, zb_h2, zb_scp
from .zero_bubble_interleaved import zb_interleaved

__all__ = ["SCHEDULES", "generate"]

F, FN, R, B, I, W = (  # noqa: E741 - the IR's own letters
    Kind.FORWARD,
    Kind.FORWARD_NOGRAD,
    Kind.RECOMPUTE,
    Kind.BACKWARD,
    Kind.BACKWARD_INPUT,
    Kind.BACKWARD_WEIGHT,
)


def gpipe(S: int, M: int) -> list[list[Step]]:
    """GPipe: every forward, then every backward (in micro-batch order).

    Holds all M micro-batches' activations at once.
    """
    return [
        [make_action(F, s, m) for m in range(M)] + [make_action(B, s, m) for m in range(M)]
        for s in range(S)
    ]


def _1f1b_order(S: int, M: int, s: int) -> list[tuple[Kind, int]]:
    """(kind, micro-batch) compute order of rank s in 1F1B: W_s warm-up forwards,
    steady (F, B) pairs, W_s cool-down backwards, with W_s = min(S-1-s, M)."""
    warm = min(S - 1 - s, M)
    order = [(F, m) for m in range(warm)]
    for i in range(M - warm):
        order.append((F, warm + i))
        order.append((B, i))
    order += [(B, m) for m in range(M - warm, M)]
    return order


def one_f_one_b_period(S: int, v: int = 1) -> Period:
    """1F1B's steady state: once M >= S - 1 every rank runs its full warm-up, and
    one more micro-batch adds one (F, B) pair to every rank's steady phase (block j
    of rank s: F of micro-batch S - 1 - s + j, then B of micro-batch j)."""
    warm = [S - 1 - s for s in range(S)]
    return Period(max(S - 1, 1), 1, tuple(warm), (2,) * S, tuple(w + 2 for w in warm))


def zb_h1_period(S: int, v: int = 1) -> Period:
    """ZB-H1's steady state: once M >= S - 1, one more micro-batch adds one (F, I, W)
    block to every rank s after its S - 1 - s warm-up forwards and s (F, I) pairs (the W
    lag) and before its last 2S - s - 2 compute steps (and AR, OPT)."""
    return Period(max(S - 1, 1), 1, tuple(S - 1 + s for s in range(S)), (3,) * S,
                  tuple(2 * S - s for s in range(S)))


def one_f_one_b(S: int, M: int) -> list[list[Step]]:
    """1F1B (PipeDream-flush): at most S - s micro-batches in flight on stage s.

    M < S works but leaves a larger bubble.
    """
    # Unchecked: ranks and micro-batches come from range, the kinds are F and B.
    return [[action(k, s, m, 0) for k, m in _1f1b_order(S, M, s)] for s in range(S)]


def interleaved_1f1b_period(S: int, v: int) -> Period:
    """Interleaved 1F1B's steady state: from M = 2S on (M a multiple of S), S more
    micro-batches add v S (F, B) pairs to every rank's steady phase; the suffix is
    the cool-down, the prefix what makes the rest whole blocks, aligned across ranks
    (rank s's blocks start 2s steps after rank 0's)."""
    warm = [2 * (S - s - 1) + (v - 1) * S for s in range(S)]
    block = 2 * v * S
    return Period(2 * S, S, tuple((w + 2 * (-w % (v * S))) % block for w in warm),
                  (block,) * S, tuple(w + 2 for w in warm))


def interleaved_1f1b(S: int, M: int, v: int) -> list[list[Step]]:
    """Megatron's interleaved 1F1B with v model chunks per rank.

    Virtual micro-batch k runs chunk (k // S) % v of micro-batch (k // (S v)) S + k % S;
    backwards visit chunks in reverse. Rank s warms up with 2 (S - s - 1) + (v - 1) S
    forwards, also when M == S (where Megatron runs every forward first: the same
    makespan, but each rank below the first holds fewer chunk micro-batches at once).
    Needs M a multiple of S.
    """
    total = M * v

    def fwd(k: int) -> tuple[int, int]:
        return (k // S) % v, (k // (S * v)) * S + k % S

    def bwd(k: int) -> tuple[int, int]:
        return v - 1 - (k // S) % v, (k // (S * v)) * S + k % S

    progs = []
    for s in range(S):
        warm = min(2 * (S - s - 1) + (v - 1) * S, total)
        prog = []
        for k in range(warm):
            c, m = fwd(k)
            prog.append(make_action(F, s, m, c))
        for k in range(total - warm):
            c, m = fwd(warm + k)
            prog.append(make_action(F, s, m, c))
            c, m = bwd(k)
            prog.append(make_action(B, s, m, c))
        for k in range(total - warm, total):
            c, m = bwd(k)
            prog.append(make_action(B, s, m, c))
        progs.append(prog)
    return progs


def one_f_one_b_split(S: int, M: int) -> list[list[Step]]:
    """1F1B with each backward split into I (input gradient) then W (weight gradient)
    at once: the split alone, with no W postponed (ZB-H1 is ``zb-h1``).

    I sits where 1F1B runs B and its gradient is sent upstream at once, so the
    gradient path back up the pipeline carries only I passes; W follows its I. Memory
    equals 1F1B's on every rank (a micro-batch is freed at its W, S - s in flight on
    stage s). With f = I = W = 1 the makespan is 3M + 2(S-1), a bubble of (S-1)(F+I)
    instead of 1F1B's (S-1)(F+I+W): 30 for S=4, M=8 and 62 for S=8, M=16.
    """
    progs = []
    for s in range(S):
        prog: list[Action] = []
        for k, m in _1f1b_order(S, M, s):
            prog += [make_action(F, s, m)] if k is F else [make_action(I, s, m), make_action(W, s, m)]
        progs.append(prog)
    return progs


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
            progs.append([make_action(k, s, m) for k, m in order])
            continue
        waits = set(range(M - min(S - 1 - s, M), M))
        if first_wait:
            waits.add(0)
        prog: list[Step] = []
        for k, m in order:
            if m in waits and k is F:
                prog.append(make_action(FN, s, m))
            elif m in waits and k is B:
                prog += [make_action(R, s, m), make_action(B, s, m)]
            else:
                prog.append(make_action(k, s, m))
        progs.append(prog)
    return progs


def pre_recompute(S: int, M: int) -> list[list[Step]]:
    """Merak T1 item 2 alone ("recompute while waiting"), every stage recomputing.

    On every stage but the last, each micro-batch whose backward would start after an
    idle wait for its gradient (the cool-down ones, and micro-batch 0 after the
    warm-up) runs as F*, and its backward as "R rG B": the re-forward fills the wait.
    This reading reproduces Merak's toy makespans (41 for S=4, M=8 and 85 for S=8,
    M=16; f=1, b=2, r=1).
    """
    return _pre_recompute_programs(S, M, S - 2, True)


def last_no_recompute(S: int, M: int) -> list[list[Step]]:
    """Merak T1 items 1-2: :func:`pre_recompute` plus a last stage that never
    recomputes (its backward follows its forward at once; its spec declares it).
    Toy makespans 39 (S=4, M=8) and 83 (S=8, M=16).
    """
    return _pre_recompute_programs(S, M, S - 2, True)


def shifted_critical_path(S: int, M: int) -> list[list[Step]]:
    """Merak's shifted critical path schedule (T1 items 1-3).

    On top of :func:`last_no_recompute`: stage S-2 starts F*0 sA0 F*1 F2 R0 rG0 sA1 B0
    sG0 R1 rG1 sA2 B1 (its third forward takes the slot where 1F1B runs B0, and B0/B1
    need no recompute because R0/R1 ran while waiting); stage S-3 starts with F*0 and
    runs R0 before B0; the last stage posts its first two gradient sends on their own
    instead of fused with the next receive, matching stage S-2's order. Needs
    M >= max(S, 4); the last stage never recomputes.
    """
    progs = _pre_recompute_programs(S, M, S - 3, False)
    if S >= 3:  # stage S-3: F*0, and R0 right before B0
        s = S - 3
        prog = progs[s]
        prog[prog.index(make_action(F, s, 0))] = make_action(FN, s, 0)
        prog.insert(prog.index(make_action(B, s, 0)), make_action(R, s, 0))
    if S >= 2:  # stage S-2: three forwards, then B0 and B1 with their re-forwards
        s = S - 2
        head: list[Step] = [make_action(FN, s, 0), make_action(FN, s, 1), make_action(F, s, 2)]
        for m in (0, 1):
            head += [
                make_action(R, s, m),
                make_action(Kind.RECV_GRAD, s, m),
                make_action(Kind.SEND_ACT, s, m + 1),
                make_action(B, s, m),
            ]
        # Steady state from F3 on follows 1F1B (which at this point runs F3 B2 F4 B3 ...).
        rest = _1f1b_order(S, M, s)[5:]
        progs[s] = head + [make_action(k, s, m) for k, m in rest]
    if S >= 2:  # last stage: first two gradient sends not fused with the next receive
        s = S - 1
        prog = []
        for k, m in _1f1b_order(S, M, s):
            prog.append(make_action(k, s, m))
            if k is B and m < 2:
                prog.append(make_action(Kind.SEND_GRAD, s, m))
        progs[s] = prog
    return progs


def _shifted_stage_fractions(S: int, c0: float) -> tuple[float, ...]:
    """Merak T2 fractions under the shifted critical path: stage S-2 holds three
    micro-batches at its start, as stage S-3 does, so it takes S-3's ratio (pp >= 3)."""
    c = list(stage_aware_fractions(S, c0))
    if S >= 3:
        c[S - 2] = c[S - 3]
    return tuple(c)


#: Policies Merak's schedules (explicit F* / R re-forwards) are paired with.
_CHECKPOINTING = ("full", "stage-aware")
_MERAK = dict(explicit_recompute=True, recompute_policies=_CHECKPOINTING)

#: Every registered schedule generator by name, with its declared facts.
SCHEDULES: dict[str, ScheduleSpec] = {
    s.name: s
    for s in (
        ScheduleSpec("gpipe", gpipe),
        ScheduleSpec("1f1b", one_f_one_b, period=one_f_one_b_period),
        ScheduleSpec("interleaved-1f1b", interleaved_1f1b, interleaved=True,
                     period=interleaved_1f1b_period,
                     microbatches_multiple_of_pp=True),
        ScheduleSpec("1f1b-split", one_f_one_b_split),
        ScheduleSpec("zb-h1", zb_h1, stage_fractions=uniform_fractions, period=zb_h1_period),
        ScheduleSpec("zb-h2", zb_h2, stage_fractions=uniform_fractions),
        ScheduleSpec("zb-auto", zb_auto, cost_aware=True, stage_fractions=uniform_fractions),
        ScheduleSpec("zb-interleaved", zb_interleaved, interleaved=True, min_virtual_stages=2,
                     microbatches_multiple_of_pp=True, stage_fractions=uniform_fractions),
        ScheduleSpec("zb-scp", zb_scp, last_stage_never_recomputes=True,
                     **dict(_MERAK, stage_fractions=uniform_fractions)),
        ScheduleSpec("pre-recompute", pre_recompute, **_MERAK),
        ScheduleSpec("last-no-recompute", last_no_recompute, last_stage_never_recomputes=True,
                     **_MERAK),
        ScheduleSpec("shifted-critical-path", shifted_critical_path, microbatch_floor=4,
                     microbatches_at_least_pp=True, last_stage_never_recomputes=True,
                     stage_fractions=_shifted_stage_fractions, **_MERAK),
        ScheduleSpec("zb-v", zb_v, interleaved=True, placement="v"),
        ScheduleSpec("dualpipev", dualpipev, interleaved=True, placement="v",
                     microbatches_per_rank=2),
    )
}


def generate(name: str, pp: int, microbatches: int, virtual_stages: int = 1,
             costs=None) -> Schedule:
    """Build the named schedule and lower it (communication added): ready to run.

    ``costs`` (a :class:`~merak_sim.schedule.zero_bubble.ZeroBubbleCosts`) reaches
    cost-aware generators only (:attr:`ScheduleSpec.cost_aware`). Raises
    :class:`ScheduleError` for unknown names or violated requirements.
    """
    spec = SCHEDULES.get(name)
    if spec is None:
        raise ScheduleError(
            f"unknown schedule {name!r}; choose one of: {', '.join(SCHEDULES)}"
        )
    return lower(spec.build(pp, microbatches, virtual_stages, costs))
