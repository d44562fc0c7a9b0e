"""The discrete-event engine (``engine="simpy"``).

One :class:`~merak_sim.sim.kernel.Environment` per run: the engine's own event loop
with SimPy's semantics and event order (it replaced SimPy itself, issue 34 item 5:
the same events, processed in the same order, about a third of the cost per event).
Each simulated GPU (:class:`~merak_sim.sim.gpu.GPU`)
is a process that runs its pipeline rank's compiled program
(:mod:`merak_sim.sim.program`) in order on its compute stream; point-to-point
transfers and data-parallel collectives run on communication streams and, with
contention on, occupy the links of a :class:`~merak_sim.sim.entities.Fabric` (routes
in :mod:`merak_sim.sim.routes`); memory is allocated and freed on the GPU's
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
overlap the compute (Merak's sub-pipelined TP, Lai et al. TPDS 2023, T3) and the
last ``tp_exposed_s`` are exposed (already counted in ``d``). With contention on, the
flow covers the directed links of the TP group's ring (one flow for the whole ring,
since a ring collective runs at the pace of its slowest edge), so it shares bandwidth
with pipeline transfers and data-parallel reductions on those links; if it is slowed,
the action ends when the collective does. A flow alone on idle links is never slowed
(its bandwidth demand is capped at the links' nominal capacity, because a calibrated
cost table may price the TP group faster than the topology's nominal link), so with
idle links the action takes exactly ``d``. With contention off the collective is only
drawn (``[end - tp_s, end]``) and the action takes ``d``.

Tied embeddings (``Compiled.tied_ar``): the AR of the first and the last pipeline rank
of each (data, tensor)-parallel copy is a rendezvous: each rank's AR starts when it
reaches it, the earlier rank waits inside it until the other arrives, then each runs
its own reduction (with the reduction overlapped, the AR step ends no earlier than the
rendezvous). The wait is part of the AR, as the runtime records it.

With contention off every transfer takes its cost-table time and the engine performs
exactly the additions and maxima of :func:`merak_sim.sim.evaluator.evaluate`.
Determinism: simultaneous events are processed in insertion order (SimPy's rule);
processes are created in rank order and no randomness is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from merak_sim.layout import RankLayout
from merak_sim.progress import Progress

from .entities import HBM
from .gpu import GPU, EngineOptions, EngineRun
from .kernel import Environment
from .program import Compiled
from .structure import OP_POST

__all__ = ["EventLog", "run_engine"]


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
        events_processed: events processed (0 for the evaluator).
        tp_comm: per entity, action id -> (start, end, delay) of the TP collectives
            the fabric simulated (contention on); ``delay`` is how much contention
            lengthened the action. Empty where not simulated: the collective then
            spans the action's last ``min(tp_s, duration)`` seconds.
        times: (start, end) of every action id and (start, end) of every transfer
            id, as numpy arrays, where the log holds one entity per pipeline rank
            whose ``acts`` are its actions in id order (the fast evaluator's): what
            the array paths of the result read instead of ``acts``; else None.
    """

    prog: Compiled
    placement: RankLayout
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
    times: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


def _check(prog: Compiled, placement: RankLayout, opts: EngineOptions) -> None:
    if opts.mode not in ("representative", "full"):
        raise ValueError(f"unknown mode {opts.mode!r}; choose representative or full")
    if opts.contention and opts.topology is None:
        raise ValueError("contention needs a topology (a cluster); pass one or turn "
                         "contention off")
    if opts.buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {opts.buckets}")
    if placement.pp != prog.num_ranks:
        raise ValueError(f"placement has pp={placement.pp} but the schedule has "
                         f"{prog.num_ranks} stages")


def _check_slowdown(opts: EngineOptions, placement: RankLayout, ranks: list[int]) -> None:
    for r in opts.slowdown:
        if not 0 <= r < placement.world_size:
            raise ValueError(f"slowdown names GPU {r}, outside 0..{placement.world_size - 1}")
        if opts.mode != "full" and r not in ranks:
            raise ValueError(f"slowdown of GPU {r} needs mode='full' (representative mode "
                             f"simulates only ranks {ranks})")


#: Events between two progress reports (a report sums the GPUs' finished actions).
PROGRESS_EVERY = 4096


def _run_to_end(env: Environment, gpus: list[GPU], progress: Progress | None = None) -> int:
    """Run ``env`` until no event is left; the number of events processed. With
    ``progress``, the compute actions the ``gpus`` finished are reported every
    :data:`PROGRESS_EVERY` events."""
    if progress is None or progress.mode == "off":
        return env.run()
    return env.run(PROGRESS_EVERY, lambda: progress.advance(
        sum(len(g.acts) for g in gpus) - progress.done))


def _makespan(gpus: list[GPU], xfer_times: list[tuple[list[float], list[float]]]) -> float:
    """End of the last action, transfer or gradient bucket."""
    makespan = 0.0
    for g in gpus:
        if g.acts:
            makespan = max(makespan, max(en for _a, _s, en in g.acts))
    for _xs, xe in xfer_times:
        if xe:
            makespan = max(makespan, max(xe))
    for g in gpus:
        for _c, _s, en in g.buckets:
            makespan = max(makespan, en)
    return makespan


def run_engine(prog: Compiled, placement: RankLayout, capacity: float,
               opts: EngineOptions, capacities: dict[int, float] | None = None,
               progress: Progress | None = None) -> EventLog:
    """Simulate one iteration of ``prog`` and return its :class:`EventLog`
    (``capacities``: memory capacity per global rank where it differs; ``progress``
    counts the compute actions done)."""
    _check(prog, placement, opts)
    env = Environment()
    run = EngineRun(env, prog, placement, opts)
    ents = [(s, ci) for s in range(prog.num_ranks) for ci in range(len(run.copies))]
    ranks = [placement.rank(s, *run.copies[ci]) for s, ci in ents]
    _check_slowdown(opts, placement, ranks)
    gpus = []
    for (s, ci), rank in zip(ents, ranks, strict=True):
        cap = capacities.get(rank, capacity) if capacities else capacity
        gpus.append(GPU(run, s, ci, rank, HBM(cap, prog.state_bytes[s], opts.record_memory)))
    for g in gpus:
        env.process(g.compute_stream())
    if progress is not None:
        progress.start(sum(1 for g in gpus for c, _x, _y in prog.ops[g.stage] if c != OP_POST))
    n_events = _run_to_end(env, gpus, progress)
    for g in gpus:
        if len(g.acts) != sum(1 for c, _x, _y in prog.ops[g.stage] if c != OP_POST):
            raise RuntimeError(
                f"simulation stopped early on GPU {g.rank} (stage {g.stage}): a transfer "
                "or collective never completed; the schedule or the engine is inconsistent"
            )
    return EventLog(prog=prog, placement=placement, mode=opts.mode, ranks=ranks,
                    stage_of=[s for s, _ in ents], copy_of=[ci for _, ci in ents],
                    acts=[g.acts for g in gpus], xfers=run.xfer_times,
                    buckets=[tuple(g.buckets) for g in gpus], memory=[g.hbm for g in gpus],
                    makespan=_makespan(gpus, run.xfer_times), events_processed=n_events,
                    tp_comm=[g.tp_comm for g in gpus])
