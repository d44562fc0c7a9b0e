"""How each rank posts its point-to-point operations, and the proof that NCCL can run it.

The runtime's posting rule (:func:`runtime_postings`): every communication step of a
program (a single ``sA``/``rA``/``sG``/``rG``, or a :class:`~merak_sim.schedule.ir.Fused`
group) is posted as **one batch** (``batch_isend_irecv``, even of one operation) on the
rank's pipeline group, whose communicator a collective over all its ranks initialised
before the first batch. Both ends of every transfer therefore post the same way.

Why the rule, in NCCL's terms (what ProcessGroupNCCL does with what it is given):

- a lone ``isend``/``irecv`` runs on a two-rank communicator of the pair, a batched
  one on the group's communicator; NCCL ignores tags, so a lone send and a batched
  receive of the same tensor sit on different communicators and never meet;
- operations on one communicator run in posting order on one stream, and a batch
  completes only when every operation in it has met its partner (NCCL promises no
  buffering: a send may wait for its receive to be posted);
- the first operation on a communicator creates it, collectively over all the
  group's ranks, so a batch between two of them must not be the first use.

:func:`check_postings` models exactly that: per (rank, communicator) a FIFO of
postings, matching by order per (communicator, sender, receiver), rendezvous
completion, and a compute action waiting for the posting that holds the receive it
consumes (the semantics of :mod:`merak_sim.schedule.ir` otherwise). It proves every
operation meets its partner on the same communicator carrying the same tensor, and
that the whole run finishes; a failure raises :class:`PostingError` whose message
draws a rank x step grid with each posting's mode (``[...]`` batched, ``<...>``
lone) and marks the offending or stuck steps ``>>...<<``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from .ir import Action, Fused, Kind, Schedule, ScheduleError
from .lowering import comm_key, consumed_key, peer_of

__all__ = ["Posting", "PostingError", "channel", "channels", "runtime_postings",
           "pipeline_group_postings", "fused_only_postings", "communicator", "check_postings"]


class PostingError(ScheduleError):
    """The postings of a schedule would hang or mismatch on NCCL (message has the grid)."""


@dataclass(frozen=True)
class Posting:
    """One call that posts point-to-point operations on a rank.

    Attributes:
        rank: the pipeline rank posting.
        step: index of the step in the rank's program.
        ops: the sends and receives posted together.
        group: the process group they are posted on (a name; see :func:`channel`).
        batched: one ``batch_isend_irecv`` (True) or a lone ``isend``/``irecv``.
    """

    rank: int
    step: int
    ops: tuple[Action, ...]
    group: tuple
    batched: bool


def channel(sched: Schedule, rank: int, op: Action) -> tuple[str, int, int]:
    """The directed channel a send or receive of ``rank`` travels on: (``"A"`` or
    ``"G"``, sending rank, receiving rank). The runtime gives each channel its own
    two-rank process group, so each has its own communicator and stream."""
    peer = peer_of(sched, op)
    src, dst = (rank, peer) if op.kind.is_send else (peer, rank)
    return ("A" if op.kind in (Kind.SEND_ACT, Kind.RECV_ACT) else "G", src, dst)


def channels(pp: int, virtual_stages: int,
             placement: str = "loop") -> tuple[tuple[str, int, int], ...]:
    """Every channel a schedule with ``pp`` ranks and ``virtual_stages`` chunks may use,
    in a fixed order (so every rank creates their groups alike): activations from r to
    r+1 and gradients back, around the ring when chunks wrap from the last rank to the
    first (``"loop"`` placement), or back up from r+1 to r (``"v"``)."""
    if pp < 2:
        return ()
    links = [(r, r + 1) for r in range(pp - 1)]
    if placement == "v":
        links += [(r + 1, r) for r in range(pp - 1)]
    elif virtual_stages > 1:
        links.append((pp - 1, 0))
    return tuple(c for a, b in links for c in (("A", a, b), ("G", b, a)))


def _comm_steps(sched: Schedule, rank: int):
    for i, step in enumerate(sched.programs[rank]):
        if isinstance(step, Fused) or step.kind.is_comm:
            yield i, step.parts


def runtime_postings(sched: Schedule) -> tuple[tuple[Posting, ...], ...]:
    """The runtime's rule: every operation is one batch (``batch_isend_irecv`` of one
    op) on its channel's group; a fused step posts its operations at the same point,
    one batch each."""
    return tuple(tuple(Posting(r, i, (op,), channel(sched, r, op), True)
                       for i, parts in _comm_steps(sched, r) for op in parts)
                 for r in range(sched.num_stages))


def pipeline_group_postings(sched: Schedule) -> tuple[tuple[Posting, ...], ...]:
    """Every step one batch on the one pipeline group (both ends alike, but all of a
    rank's operations share one communicator and so one stream)."""
    return tuple(tuple(Posting(r, i, parts, ("pp",), True) for i, parts in _comm_steps(sched, r))
                 for r in range(sched.num_stages))


def fused_only_postings(sched: Schedule) -> tuple[tuple[Posting, ...], ...]:
    """On the pipeline group, a batch only for a fused step and a lone operation
    otherwise: the two ends of a transfer differ whenever only one of them is fused."""
    return tuple(tuple(Posting(r, i, parts, ("pp",), len(parts) > 1)
                       for i, parts in _comm_steps(sched, r))
                 for r in range(sched.num_stages))


def communicator(sched: Schedule, p: Posting, op: Action) -> tuple:
    """The NCCL communicator ``op`` of posting ``p`` runs on: its group's own for a
    batch, a separate one of the two ranks for a lone operation (ProcessGroupNCCL)."""
    if p.batched:
        return p.group
    peer = peer_of(sched, op)
    return (*p.group, "lone", min(p.rank, peer), max(p.rank, peer))


def _grid(sched: Schedule, postings, marked: dict[int, set[int]], width: int = 12) -> str:
    """Rank x step grid around the marked steps, postings drawn with their mode."""
    drawn: dict = defaultdict(str)
    for rp in postings:
        for p in rp:
            t = "/".join(str(a) for a in p.ops)
            drawn[(p.rank, p.step)] += f"[{t}]" if p.batched else f"<{t}>"
    lines = []
    for r, prog in enumerate(sched.programs):
        marks = marked.get(r, set())
        centre = min(marks) if marks else len(prog)
        lo = max(0, centre - width // 2)
        toks = []
        for i in range(lo, min(len(prog), lo + width)):
            t = drawn.get((r, i)) or "/".join(str(a) for a in prog[i].parts)
            toks.append(f">>{t}<<" if i in marks else t)
        state = f"step {centre}" if marks else "done"
        lines.append(f"  S{r} ({state}): {'... ' if lo else ''}{' '.join(toks)}")
    return "\n".join(lines) + "\n  ([...] one batch_isend_irecv, <...> a lone isend/irecv)"


def _match(sched: Schedule, postings) -> dict:
    """Partner of every (rank, posting index, op index): the (rank, posting index) of
    the op it meets; kth send meets kth receive per (communicator, sender, receiver)."""
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    for r, rp in enumerate(postings):
        for j, p in enumerate(rp):
            for k, op in enumerate(p.ops):
                c, peer = communicator(sched, p, op), peer_of(sched, op)
                if op.kind.is_send:
                    sends[(c, r, peer)].append((r, j, k))
                else:
                    recvs[(c, peer, r)].append((r, j, k))
    partner = {}
    chans = sorted(sends.keys() | recvs.keys(), key=repr)  # deterministic reports
    for chan in chans:  # an operation without a partner first: the likelier cause
        s, r = sends.get(chan, []), recvs.get(chan, [])
        keys = [{comm_key(sched, postings[x][j].ops[k]) for x, j, k in side}
                for side in (s, r)]
        alone = [e for side, other in ((s, keys[1]), (r, keys[0])) for e in side
                 if comm_key(sched, postings[e[0]][e[1]].ops[e[2]]) not in other]
        if alone:
            rank, j, k = min(alone, key=lambda e: postings[e[0]][e[1]].step)
            p = postings[rank][j]
            other = "receive" if p.ops[k].kind.is_send else "send"
            key, marks = comm_key(sched, p.ops[k]), {rank: {p.step}}
            for q in postings[peer_of(sched, p.ops[k])]:  # the other end, if posted
                if any(o.kind.is_send != p.ops[k].kind.is_send and comm_key(sched, o) == key
                       for o in q.ops):
                    marks.setdefault(q.rank, set()).add(q.step)
            raise PostingError(
                f"schedule {sched.name!r}: {p.ops[k]} on rank {rank} finds no {other} "
                f"on the same communicator ({'batched' if p.batched else 'lone'} here; "
                "NCCL ignores tags, so a lone and a batched end never meet)\n"
                + _grid(sched, postings, marks))
    for chan in chans:
        s, r = sends.get(chan, []), recvs.get(chan, [])
        for i in range(len(s)):
            (rs, js, ks), (rr, jr, kr) = s[i], r[i]
            ps, pr = postings[rs][js], postings[rr][jr]
            if comm_key(sched, ps.ops[ks]) != comm_key(sched, pr.ops[kr]):
                raise PostingError(
                    f"schedule {sched.name!r}: on one communicator send #{i} {ps.ops[ks]} of "
                    f"rank {rs} meets receive {pr.ops[kr]} of rank {rr} (NCCL matches by "
                    "order, not tag)\n"
                    + _grid(sched, postings, {rs: {ps.step}, rr: {pr.step}}))
            partner[(rs, js, ks)] = (rr, jr)
            partner[(rr, jr, kr)] = (rs, js)
    return partner


def check_postings(sched: Schedule, postings=None) -> float:
    """Prove ``postings`` (default: :func:`runtime_postings`) of lowered ``sched`` run
    on NCCL: every operation meets its partner on one communicator and the run ends.

    Returns the makespan with unit compute and free transfers; raises
    :class:`PostingError` with the grid otherwise.
    """
    if postings is None:
        postings = runtime_postings(sched)
    partner = _match(sched, postings)
    # Node ids: 2n / 2n+1 = start / completion of the n-th posting (all ranks), then
    # one id per compute action (its end). deps[id] lists the ids it waits for.
    first = []
    n = 0
    for rp in postings:
        first.append(n)
        n += 2 * len(rp)
    deps: list[list[int]] = [[] for _ in range(n)]
    where: list[tuple[int, int]] = [(p.rank, p.step) for rp in postings for p in rp
                                    for _ in (0, 1)]
    compute: list[bool] = [False] * n
    for r, prog in enumerate(sched.programs):
        at_step: dict = defaultdict(list)
        for j, p in enumerate(postings[r]):
            at_step[p.step].append(j)
        last_compute, last_on = None, {}
        recv_in: dict = {}  # comm key of a posted receive -> its posting's completion id
        for i, step in enumerate(prog):
            for j in at_step.get(i, ()):
                p = postings[r][j]
                s = first[r] + 2 * j
                if last_compute is not None:
                    deps[s].append(last_compute)
                for c in {communicator(sched, p, op) for op in p.ops}:
                    if c in last_on:  # one stream per communicator: in posting order
                        deps[s].append(last_on[c])
                    last_on[c] = s + 1
                deps[s + 1].append(s)
                for k, op in enumerate(p.ops):
                    rq, jq = partner[(r, j, k)]
                    deps[s + 1].append(first[rq] + 2 * jq)
                    if op.kind.is_recv:
                        recv_in[comm_key(sched, op)] = s + 1
            if i in at_step or not step.kind.is_compute:
                continue
            node = len(deps)
            deps.append([] if last_compute is None else [last_compute])
            where.append((r, i))
            compute.append(True)
            key = consumed_key(sched, step)
            if key is not None:
                if key not in recv_in:
                    raise PostingError(f"schedule {sched.name!r}: {step} on rank {r} consumes "
                                       f"{key} but no posting before it receives it\n"
                                       + _grid(sched, postings, {r: {i}}))
                deps[node].append(recv_in[key])
            last_compute = node
    return _longest_path(sched, postings, deps, where, compute)


def _longest_path(sched: Schedule, postings, deps: list[list[int]],
                  where: list[tuple[int, int]], compute: list[bool]) -> float:
    """Kahn's order over the dependency graph; a node left over is a hang."""
    n = len(deps)
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in range(n)]
    for u, ds in enumerate(deps):
        for d in ds:
            users[d].append(u)
    t = [-1.0] * n
    ready = deque(u for u in range(n) if waiting[u] == 0)
    done = 0
    while ready:
        u = ready.popleft()
        done += 1
        t[u] = max((t[d] for d in deps[u]), default=0.0) + (1.0 if compute[u] else 0.0)
        for v in users[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    if done < n:
        stuck: dict[int, set[int]] = {}
        for u in sorted(range(n), key=lambda u: where[u]):
            r, i = where[u]
            if t[u] < 0 and r not in stuck:
                stuck[r] = {i}
        raise PostingError(
            f"schedule {sched.name!r} hangs on NCCL: postings on one communicator run in "
            "order and a batch completes only when all its partners are posted\n"
            + _grid(sched, postings, stuck))
    return max(t, default=0.0)
