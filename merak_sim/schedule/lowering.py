"""Lowering pass: add point-to-point communication to a compute-only schedule.

Rules (pure, deterministic):
- A compute action that consumes a tensor from another rank gets its receive
  inserted immediately before it: F/F* of model stage g > 0 receive the activation
  from g-1 (``rA``); B/I of model stage g < last receive the gradient from g+1 (``rG``).
- A compute action whose output goes to another rank gets its send inserted right
  after it: F/F* of g < last send the activation (``sA``); B/I of g > 0 send the
  input gradient (``sG``). R and W send nothing.
- A hand-off between two model stages on one rank (model stages S-1 and S under the
  ``"v"`` placement) is local: no receive, no send, and no consumed tag; the
  validator checks that program order puts the producer first.
- A generator may place any of these itself; the pass then leaves it where it is.
- An inserted send immediately followed by an inserted receive with the *same peer*
  becomes one :class:`~merak_sim.schedule.ir.Fused` posting (Megatron's
  send_forward_recv_backward / send_backward_recv_forward). Actions a generator
  placed explicitly are never fused.
"""

from __future__ import annotations

from operator import attrgetter

from .ir import Action, Kind, Schedule, Step
from .unchecked import action, fused, new_twin

__all__ = ["lower", "peer_of", "comm_key", "consumed_key"]

_FWD = (Kind.FORWARD, Kind.FORWARD_NOGRAD)
_BWD = (Kind.BACKWARD, Kind.BACKWARD_INPUT)


def _local(sched: Schedule, model_stage: int, mb: int, kind: Kind) -> Action:
    rank, chunk = sched.rank_of(model_stage)
    return Action(kind, rank, mb, chunk)


def comm_key(sched: Schedule, a: Action) -> tuple[str, int, int]:
    """Tag that matches a send with its receive: (tensor, source model stage, micro-batch)."""
    g = sched.model_stage(a)
    if a.kind is Kind.SEND_ACT:
        return ("A", g, a.microbatch)
    if a.kind is Kind.RECV_ACT:
        return ("A", g - 1, a.microbatch)
    if a.kind is Kind.SEND_GRAD:
        return ("G", g, a.microbatch)
    if a.kind is Kind.RECV_GRAD:
        return ("G", g + 1, a.microbatch)
    raise ValueError(f"{a} is not a point-to-point action")


def peer_of(sched: Schedule, a: Action) -> int:
    """The rank on the other end of a send or receive."""
    g = sched.model_stage(a)
    step = 1 if a.kind in (Kind.SEND_ACT, Kind.RECV_GRAD) else -1
    return sched.rank_of(g + step)[0]


def consumed_key(sched: Schedule, a: Action) -> tuple[str, int, int] | None:
    """Tag of the receive that compute action ``a`` waits for, or None (nothing
    remote: the first / last model stage, or a local hand-off)."""
    g = sched.model_stage(a)
    if a.kind in _FWD and g > 0 and not sched.is_local(g - 1):
        return ("A", g - 1, a.microbatch)
    if a.kind in _BWD and g < sched.num_model_stages - 1 and not sched.is_local(g):
        return ("G", g + 1, a.microbatch)
    return None


def _recv_for(sched: Schedule, a: Action) -> Action | None:
    key = consumed_key(sched, a)
    if key is None:
        return None
    kind = Kind.RECV_ACT if key[0] == "A" else Kind.RECV_GRAD
    return Action(kind, a.stage, a.microbatch, a.chunk)


def _send_for(sched: Schedule, a: Action) -> Action | None:
    g = sched.model_stage(a)
    if a.kind in _FWD and g < sched.num_model_stages - 1 and not sched.is_local(g):
        return Action(Kind.SEND_ACT, a.stage, a.microbatch, a.chunk)
    if a.kind in _BWD and g > 0 and not sched.is_local(g - 1):
        return Action(Kind.SEND_GRAD, a.stage, a.microbatch, a.chunk)
    return None


_IS_COMM = attrgetter("kind.is_comm")


def lower(sched: Schedule) -> Schedule:
    """Return ``sched`` with communication inserted (idempotent on lowered schedules)."""
    if sched.lowered:
        return sched
    programs = tuple(_lowered(sched, prog) for prog in sched.programs)
    # ``replace`` would check every action again: the pass only adds sends and
    # receives on their consumer's or producer's rank and chunk, which the checked
    # schedule already holds, so the copy takes the checked fields as they are.
    out = new_twin(type(sched))
    out.__dict__.update(sched.__dict__, programs=programs, lowered=True)
    return out


def _needs(sched: Schedule, a: Action) -> tuple[Kind | None, int, Kind | None, int]:
    """(receive kind, its peer, send kind, its peer) the lowering adds around compute
    action ``a`` (kinds None where it adds none): facts of its kind, rank and chunk."""
    r, s = _recv_for(sched, a), _send_for(sched, a)
    return (r and r.kind, -1 if r is None else peer_of(sched, r),
            s and s.kind, -1 if s is None else peer_of(sched, s))


def _lowered(sched: Schedule, prog: tuple[Step, ...]) -> tuple[Step, ...]:
    """One rank's program lowered in one pass: a send inserted after a compute action
    waits in ``pending`` until the next step shows whether a receive inserted before
    it, to the same peer, fuses with it."""
    # Most generators place no communication: then nothing needs hashing (both
    # scans run at C speed; only a program with a fused group or a send or receive
    # is walked for them).
    explicit = None
    if set(map(type, prog)) != {Action} or True in map(_IS_COMM, prog):
        explicit = {a for s in prog if type(s) is not Action or s.kind.is_comm
                    for a in s.parts} or None  # a fused group holds only sends and receives
    # Indexed by the kind's code (enum hashing is slow) times v plus the chunk
    # (below v, as the Schedule checked): the rank is the program's.
    v = sched.virtual_stages
    needs: list[tuple[Kind | None, int, Kind | None, int] | None] = [None] * (len(Kind) * v)
    out: list[Step] = []
    pending: Action | None = None
    pending_peer = -1
    for step in prog:
        if type(step) is not Action or not step.kind.is_compute:
            if pending is not None:
                out.append(pending)
                pending = None
            out.append(step)
            continue
        ch = step.chunk
        key = step.kind.code * v + ch
        n = needs[key]
        if n is None:
            n = needs[key] = _needs(sched, step)
        recv_kind, recv_peer, send_kind, send_peer = n
        if recv_kind is not None:
            # Unchecked: the fields are those of the checked compute action, and a
            # send or receive takes them all.
            recv = action(recv_kind, step.stage, step.microbatch, ch)
            if explicit is None or recv not in explicit:
                if pending is not None and pending_peer == recv_peer:
                    out.append(fused((pending, recv)))  # two sends and receives
                else:
                    if pending is not None:
                        out.append(pending)
                    out.append(recv)
                pending = None
        if pending is not None:
            out.append(pending)
            pending = None
        out.append(step)
        if send_kind is not None:
            send = action(send_kind, step.stage, step.microbatch, ch)
            if explicit is None or send not in explicit:
                pending, pending_peer = send, send_peer
    if pending is not None:
        out.append(pending)
    return tuple(out)
