"""Liveness: the one walk of what a schedule keeps alive on a rank, and when.

Every consumer of "how many micro-batches are held, and how big" reads this walk: the
memory model (:func:`merak_sim.memory.peak_memory`), the compiled program's memory
deltas that the SimPy engine and the fast evaluator replay
(:func:`merak_sim.sim.program.compile_program`), the planner's memory screen
(:func:`merak_sim.planner.templates.memory_template`) and the validator's in-flight
counts (:func:`merak_sim.schedule.validate.validate`). The simulator and the planner
therefore report the same peak for the same plan.

What is alive
-------------
A live *item* is one (chunk, micro-batch) of the rank between its forward and the end
of its backward. It holds one of three things (:class:`Held`):

- ``stash``: after F, the activations autograd keeps for backward. With a fraction c
  of the chunk's layers checkpointed this is ``kept_bytes(c) = c * checkpoint_bytes +
  (1 - c) * activation_bytes`` (the checkpointed layers keep their inputs only).
- ``input``: after F* (Merak's forward without grad), only the stage input.
- ``rebuilt``: after R, the full activation set re-forwarded from that input; R grows
  the item by ``activation_bytes - input_bytes`` (never shrinks it).

Transitions, per compute action in program order: F and F* allocate their item when
they start; R grows it when it starts; B frees it when it ends; zero-bubble's I frees
nothing and W frees all of it when it ends. AR, OPT and communication change nothing.
Peaks are taken after allocations; unit sizes (:data:`ALIVE`, :data:`FULL`) turn the
same walk into counts.

What the four earlier walks counted
-----------------------------------
- memory model: the per-item bytes above (F ``kept_bytes(c_s)``, F* ``input_bytes``,
  R replaces the item by ``activation_bytes``, B and W free, I nothing), peak after
  allocations and the most items alive, *plus* a constant "buffer" term: two
  point-to-point buffers (2 x the largest ``p2p_bytes`` of the rank's chunks: one
  activation, one gradient) and, when c_s > 0, one layer's recompute working set
  (the largest ``(activation_bytes - checkpoint_bytes) / layers``).
- compiled program (SimPy engine and evaluator HBM): the same items and transitions,
  bytes allocated at the action's start and freed at its end, R allocating
  ``max(0, activation_bytes - held)``; no buffers and no working set.
- planner memory template: per rank the distinct (chunk, state) count vectors after
  each allocation, priced linearly in c (F at ``kept_bytes(c)``, F* at ``input_bytes``,
  R at ``activation_bytes``), plus the memory model's buffer term.
- validator: unit counts after each F/F*/R/B/W: items alive (F, F*, R) and items
  holding full activations (F, or F* after its R).

They agree on the items and their transitions (the I/W split of zero-bubble frees at
W in all four: I's input gradient does not release the tensors W's weight gradient
reads). They disagreed on the buffer term: the memory model and the planner added it,
the simulator did not, so a plan the planner screened at one peak simulated at
another. The walk here counts what the simulator counted (its memory figures are the
reference, and it is the quantity the runtime's saved-tensor tracker measures, which
the CPU validation suite matches within 1 %): the received activation is the stage
input that the first layer stashes anyway, and sends, gradient receives and the
recompute working set are transient buffers inside or between actions, outside the
stash. The memory model and the planner's screen no longer add them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .ir import Action, Kind, Schedule

if TYPE_CHECKING:
    from merak_sim.costs.base import StageCost

__all__ = ["ALIVE", "FULL", "Held", "ItemSizes", "LiveStep", "LiveTrace", "liveness",
           "entered_by", "FREES", "REBUILDS", "stash_sizes", "transitions"]


class Held(enum.IntEnum):
    """What one live (chunk, micro-batch) item holds (module docstring)."""

    STASH = 0
    INPUT = 1
    REBUILT = 2


#: The kind whose item enters :attr:`Held.REBUILT` (an explicit re-forward).
REBUILDS = Kind.RECOMPUTE
#: The kinds that free their item (if live).
FREES = (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)
# The state each allocating kind enters, indexed by the kind's code (hashing an
# enum member runs Python code), None for the others.
_ENTERS_BY_CODE = [{Kind.FORWARD: Held.STASH, Kind.FORWARD_NOGRAD: Held.INPUT,
                    REBUILDS: Held.REBUILT}.get(k) for k in Kind]
_B, _W = FREES


def entered_by(kind: Kind) -> Held | None:
    """The state an action of ``kind`` moves its item into (None: it allocates
    nothing; :data:`FREES` free their item instead, :func:`transitions`)."""
    return _ENTERS_BY_CODE[kind.code]


@dataclass(frozen=True, slots=True)
class ItemSizes:
    """Size of one live item of a chunk in each :class:`Held` state: bytes for the
    memory model, 1 and 0 to count items.

    Attributes:
        stash: after F.
        input: after F*.
        rebuilt: after R (an item R grows never holds less than its input).
    """

    stash: float
    input: float
    rebuilt: float

    def of(self, held: Held) -> float:
        """Size of an item in state ``held`` as the walk holds it."""
        if held is Held.STASH:
            return self.stash
        if held is Held.INPUT:
            return self.input
        return max(self.rebuilt, self.input)


#: Unit sizes: every live item counts one.
ALIVE = ItemSizes(1, 1, 1)
#: Unit sizes: items holding their full activations (F, or F* after R) count one.
FULL = ItemSizes(1, 0, 1)


def stash_sizes(stage: StageCost, fraction: float) -> ItemSizes:
    """Bytes one micro-batch of ``stage`` holds in each state when ``fraction`` of its
    layers is checkpointed (module docstring)."""
    return ItemSizes(stage.kept_bytes(fraction), stage.input_bytes, stage.activation_bytes)


@dataclass(frozen=True, slots=True)
class LiveStep:
    """One compute action of the walk.

    Attributes:
        action: the action.
        enters: state its item enters when the action starts (F, F*, R), else None.
        leaves: state its item leaves: the input R grows from, or what B / W free
            when they end; else None.
        counts: live items after the action, index ``chunk * 3 + Held``.
    """

    action: Action
    enters: Held | None
    leaves: Held | None
    counts: tuple[int, ...]

    @property
    def allocates(self) -> bool:
        """Whether the action allocates (F, F*, R)."""
        return self.enters is not None


@dataclass(frozen=True)
class LiveTrace:
    """The walk of one rank: one :class:`LiveStep` per compute action, program order.

    ``sizes`` arguments are one :class:`ItemSizes` per chunk, or one for all chunks.
    """

    rank: int
    chunks: int
    steps: tuple[LiveStep, ...]

    def _per_chunk(self, sizes: ItemSizes | Sequence[ItemSizes]) -> Sequence[ItemSizes]:
        if isinstance(sizes, ItemSizes):
            return [sizes] * self.chunks
        if len(sizes) != self.chunks:
            raise ValueError(f"rank {self.rank} has {self.chunks} chunks but "
                             f"{len(sizes)} item sizes were given")
        return sizes

    def deltas(self, sizes: ItemSizes | Sequence[ItemSizes]
               ) -> tuple[tuple[float, float], ...]:
        """Per step, (allocated when the action starts, freed when it ends)."""
        per = self._per_chunk(sizes)
        held: dict[tuple[int, int], float] = {}
        out = []
        for st in self.steps:
            a = st.action
            key = (a.chunk, a.microbatch)
            alloc = free = 0.0
            if st.enters is not None:
                new = float(per[a.chunk].of(st.enters))
                if key in held:
                    alloc = max(0.0, new - held[key])
                    held[key] += alloc
                else:
                    alloc = held[key] = new
            elif st.leaves is not None:
                free = held.pop(key, 0.0)
            out.append((alloc, free))
        return tuple(out)

    def peak(self, sizes: ItemSizes | Sequence[ItemSizes]) -> float:
        """Largest live total after an allocation (0 if nothing is ever alive)."""
        cur = top = 0.0
        for alloc, free in self.deltas(sizes):
            if alloc:
                cur += alloc
                top = max(top, cur)
            cur -= free
        return top

    @property
    def peak_in_flight(self) -> int:
        """Most items alive at once."""
        return max((sum(s.counts) for s in self.steps), default=0)

    def allocation_counts(self) -> tuple[tuple[int, ...], ...]:
        """The distinct count vectors after each allocation, sorted: every candidate
        for the peak, whatever the sizes."""
        return tuple(sorted({s.counts for s in self.steps if s.allocates}))


def liveness(sched: Schedule, rank: int) -> LiveTrace:
    """Walk ``rank``'s program (lowered or not; communication is skipped) and return
    its :class:`LiveTrace` (module docstring)."""
    return LiveTrace(rank, sched.virtual_stages,
                     tuple(LiveStep(*t) for t in transitions(sched, rank, counted=True)))


def transitions(sched: Schedule, rank: int, counted: bool = False
                ) -> list[tuple[Action, Held | None, Held | None, tuple[int, ...] | None]]:
    """The walk of :func:`liveness` as plain tuples, one per compute action in program
    order: (action, enters, leaves, counts), counts (as :attr:`LiveStep.counts`) only
    if ``counted``, else None; for consumers that walk thousands of actions and need
    only the transitions."""
    # Items keyed by micro-batch * v + chunk (chunks below v and micro-batches of
    # per-micro-batch actions >= 0, as Schedule and Action check): no tuple to hash.
    v = sched.virtual_stages
    state: dict[int, Held] = {}
    counts = [0] * (3 * v)
    out: list[tuple[Action, Held | None, Held | None, tuple[int, ...] | None]] = []
    entering = _ENTERS_BY_CODE
    for a in sched.programs[rank]:
        # A fused group holds sends and receives only: nothing to flatten.
        if type(a) is not Action:
            continue
        k = a.kind
        if k.is_comm:
            continue
        key = a.microbatch * v + a.chunk
        enters = entering[k.code]
        leaves = None
        if enters is not None:
            leaves = state.get(key)
            if counted:
                if leaves is not None:
                    counts[a.chunk * 3 + leaves] -= 1
                counts[a.chunk * 3 + enters] += 1
            state[key] = enters
        elif k is _B or k is _W:
            leaves = state.pop(key, None)
            if counted and leaves is not None:
                counts[a.chunk * 3 + leaves] -= 1
        out.append((a, enters, leaves, tuple(counts) if counted else None))
    return out
