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

from dataclasses import replace

from .ir import Action, Fused, Kind, Schedule, Step, iter_actions

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


def lower(sched: Schedule) -> Schedule:
    """Return ``sched`` with communication inserted (idempotent on lowered schedules)."""
    if sched.lowered:
        return sched
    # What a compute action needs depends on its kind, rank and chunk only (keyed by
    # the kind's identity: enum hashing is slow); the micro-batch is copied.
    needs: dict[tuple[int, int, int], tuple[Kind | None, Kind | None]] = {}
    programs = []
    for prog in sched.programs:
        # Most generators place no communication: then nothing needs hashing.
        explicit = {a for a in iter_actions(prog) if a.kind.is_comm} or None
        # (step, inserted?) pairs; inserted ones are candidates for fusion.
        seq: list[tuple[Step, bool]] = []
        for step in prog:
            if isinstance(step, Action) and step.kind.is_compute:
                key = (id(step.kind), step.stage, step.chunk)
                kinds = needs.get(key)
                if kinds is None:
                    r, s = _recv_for(sched, step), _send_for(sched, step)
                    kinds = needs[key] = (r and r.kind, s and s.kind)
                if kinds[0] is not None:
                    recv = Action(kinds[0], step.stage, step.microbatch, step.chunk)
                    if explicit is None or recv not in explicit:
                        seq.append((recv, True))
                seq.append((step, False))
                if kinds[1] is not None:
                    send = Action(kinds[1], step.stage, step.microbatch, step.chunk)
                    if explicit is None or send not in explicit:
                        seq.append((send, True))
            else:
                seq.append((step, False))
        programs.append(tuple(_fuse(sched, seq)))
    return replace(sched, programs=tuple(programs), lowered=True)


def _fuse(sched: Schedule, seq: list[tuple[Step, bool]]) -> list[Step]:
    peers: dict[tuple[int, int], int] = {}  # (kind identity, chunk) -> peer rank

    def peer(a: Action) -> int:
        key = (id(a.kind), a.chunk)
        p = peers.get(key)
        if p is None:
            p = peers[key] = peer_of(sched, a)
        return p

    out: list[Step] = []
    i = 0
    while i < len(seq):
        step, inserted = seq[i]
        if (
            inserted
            and i + 1 < len(seq)
            and seq[i + 1][1]
            and isinstance(step, Action)
            and step.kind.is_send
        ):
            nxt = seq[i + 1][0]
            if (
                isinstance(nxt, Action)
                and nxt.kind.is_recv
                and peer(nxt) == peer(step)
            ):
                out.append(Fused((step, nxt)))
                i += 2
                continue
        out.append(step)
        i += 1
    return out
