"""``simulate(...) -> SimResult``: the one entry point of the simulator.

It resolves names (model, cluster), validates the degrees against the cluster,
prices the configuration with a cost model (the calibrated analytic one by
default), builds the schedule, compiles both into flat programs and runs either the
SimPy engine or the exact fast evaluator.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable
from merak_sim.costs.calibrated import CalibratedCostModel
from merak_sim.costs.protocol import CostModel
from merak_sim.hardware import GPU, Cluster, get_gpu
from merak_sim.layout import RankLayout
from merak_sim.model import ModelSpec
from merak_sim.progress import Progress, progress_reporter
from merak_sim.resolve import resolve_cluster, resolve_model
from merak_sim.schedule import SCHEDULES, generate, lower
from merak_sim.schedule.arrays import array_schedule
from merak_sim.schedule.ir import Schedule
from merak_sim.sim.from_config import recompute_fractions, schedule_for, split_grad_sync

from .deferred import Deferred
from .engine import EventLog, run_engine
from .entities import HBM, Topology, topology_from_cluster
from .evaluator import DependencyGraph, evaluate
from .gpu import EngineOptions
from .periodic import Evaluated, Extended, extended
from .program import Compiled, compile_program
from .result import SimResult, build_result, result_of
from .structure import forget_structures

__all__ = ["simulate", "SimulationError", "evaluator_trace", "resolve_config", "schedule_of",
           "shape_schedule", "forget_schedules"]

#: Micro-batch passes (pp x micro-batches x virtual stages) from which
#: :func:`shape_schedule` builds a schedule as rows: below, the Action objects are
#: as fast (the arrays' fixed cost of some 60 numpy calls; measured: 1F1B pp 8 at 104
#: passes 0.8 ms as rows, 1.4 ms as Actions; pp 4 at 32 passes 0.7 and 0.4 ms).
ARRAY_PASSES = 64
#: How many generated schedules :func:`schedule_of` keeps (least recently used out).
SCHEDULES_KEPT = 64
_SCHEDULES: OrderedDict[tuple, Schedule] = OrderedDict()


class SimulationError(ValueError):
    """Bad simulator input (message names the problem and the fix)."""


def resolve_config(config: ParallelConfig | dict | None, **kwargs: Any) -> ParallelConfig:
    """A ParallelConfig from an instance, a dict (:meth:`ParallelConfig.to_dict` form)
    or keyword arguments."""
    if isinstance(config, ParallelConfig):
        if kwargs:
            raise SimulationError("give either a ParallelConfig or keyword degrees, not both")
        return config
    d = dict(config or {})
    d.update(kwargs)
    if not d:
        raise SimulationError("no parallel configuration given (dp, tp, pp, batch sizes...)")
    try:
        return ParallelConfig.from_dict(d)
    except TypeError as e:
        raise SimulationError(f"bad parallel configuration: {e}") from None


def schedule_of(cfg: ParallelConfig, table: CostTable | None = None) -> Schedule:
    """``schedule_for(cfg, table)``, kept per (schedule, pp, micro-batches, virtual
    stages) (:func:`shape_schedule`). A cost-aware schedule depends on ``table`` too,
    so it is built afresh each time."""
    spec = SCHEDULES.get(cfg.schedule)
    if table is not None and spec is not None and spec.cost_aware:
        return schedule_for(cfg, table)
    return shape_schedule(cfg.schedule, cfg.pp, cfg.num_microbatches, cfg.virtual_stages)


def shape_schedule(name: str, pp: int, microbatches: int, virtual_stages: int = 1
                   ) -> Schedule:
    """The lowered schedule ``name`` for (pp, micro-batches, virtual stages), kept per
    shape (the :data:`SCHEDULES_KEPT` most recent): generators are pure functions of
    those (cost-aware ones with unit costs here), and handing out the same object
    lets :func:`~merak_sim.sim.program.compile_program` and the evaluator reuse its
    structure and dependency order for every configuration of that shape. From
    :data:`ARRAY_PASSES` micro-batch passes on, a generator with a closed form builds
    it as rows (:func:`~merak_sim.schedule.arrays.array_schedule`: its Action
    programs only on first use) and it compiles with numpy."""
    key = (name, pp, microbatches, virtual_stages)
    sched = _SCHEDULES.get(key)
    if sched is None:
        spec = SCHEDULES.get(name)
        rows = (array_schedule(spec, pp, microbatches, virtual_stages)
                if spec is not None and pp * microbatches * virtual_stages >= ARRAY_PASSES
                else None)
        sched = _SCHEDULES[key] = rows or generate(name, pp, microbatches, virtual_stages)
        while len(_SCHEDULES) > SCHEDULES_KEPT:
            _SCHEDULES.popitem(last=False)
    else:
        _SCHEDULES.move_to_end(key)
    return sched


def forget_schedules() -> None:
    """Empty :func:`shape_schedule`'s cache and the compiled structures kept per
    schedule object (:func:`~merak_sim.sim.structure.forget_structures`), so that
    the next simulation of every shape starts cold (benchmarks of the first call;
    freeing memory)."""
    _SCHEDULES.clear()
    forget_structures()


def _load_schedule(schedule: Schedule | str | Path) -> Schedule:
    if isinstance(schedule, Schedule):
        return schedule
    p = Path(schedule)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SimulationError(f"cannot read schedule file {p}: {e.strerror}") from None
    sched = Schedule.from_json(text) if text.lstrip().startswith("{") else \
        Schedule.from_csv(text)
    return lower(sched)


#: Actions of a rank from which its memory is replayed with numpy.
REPLAY_ARRAYS = 256


def evaluator_trace(prog: Compiled, placement: RankLayout, capacity: float, *,
                    overlap_dp: bool = False, buckets: int = 1, zero: int = 0,
                    pl: DependencyGraph | None = None,
                    record_memory: bool = True) -> EventLog:
    """Run the fast evaluator and package its times as an :class:`EventLog` (memory is
    replayed per rank in program order, which is time order on each rank, with numpy:
    :meth:`~merak_sim.sim.entities.HBM.replay_arrays`; each rank's rows are built on
    first use)."""
    ev = evaluate(prog, pl, overlap_dp=overlap_dp, buckets=buckets, zero=zero)
    S = prog.num_ranks
    times = ev.arrays or (np.array(ev.start), np.array(ev.end), np.array(ev.xfer_start),
                          np.array(ev.xfer_end))
    start, end = times[0], times[1]
    fa = prog.structure.arrays
    mem = np.array(prog.memory_values)
    alloc, free = mem[fa.alloc], mem[fa.free]
    first = fa.first.tolist()
    acts = []
    mems = []
    for r in range(S):
        hbm = HBM(capacity, prog.state_bytes[r], record_memory)
        ids = range(first[r], first[r + 1])
        if len(ids) < REPLAY_ARRAYS:  # a few actions: the loop costs less than numpy
            hbm.replay(ids, ev.start, ev.end, prog.mem_alloc, prog.mem_free)
        else:
            hbm.replay_arrays(ids, start, end, alloc, free)
        acts.append(Deferred(partial(_rows, ids, ev.start, ev.end)))
        mems.append(hbm)
    return EventLog(prog=prog, placement=placement, mode="representative",
                    ranks=[placement.rank(s) for s in range(S)], stage_of=list(range(S)),
                    copy_of=[0] * S, acts=acts, xfers=[(ev.xfer_start, ev.xfer_end)],
                    buckets=list(ev.buckets), memory=mems, makespan=ev.makespan,
                    times=times)


def _rows(ids: range, start: list[float], end: list[float]) -> list[tuple[int, float, float]]:
    """(action id, start, end) of the actions ``ids``."""
    lo, hi = ids.start, ids.stop
    return list(zip(ids, start[lo:hi], end[lo:hi], strict=True))


def _resolve_model_cluster(model: ModelSpec | str | Path | dict | None,
                           cluster: Cluster | str | Path | dict | None, nodes: int | None,
                           cfg: ParallelConfig, sub_cluster: bool
                           ) -> tuple[ModelSpec | None, Cluster | None]:
    """The ModelSpec and Cluster named by ``model`` and ``cluster`` (None where not
    given), checked against the configuration's degrees."""
    spec = None if model is None else resolve_model(model)
    clus = None if cluster is None else resolve_cluster(cluster, nodes)
    if clus is not None:
        world = clus.world_size
        degrees = (f"dp*cp*tp*pp = {cfg.dp}*{cfg.cp}*{cfg.tp}*{cfg.pp}" if cfg.cp > 1
                   else f"dp*tp*pp = {cfg.dp}*{cfg.tp}*{cfg.pp}")
        if cfg.world_size > world:
            raise SimulationError(
                f"{degrees} = {cfg.world_size} GPUs but cluster "
                f"{clus.name} has only {world}; lower the degrees or use --nodes")
        if cfg.world_size < world and not sub_cluster:
            raise SimulationError(
                f"{degrees} = {cfg.world_size} GPUs but cluster "
                f"{clus.name} has {world}; match the degrees to the cluster, set --nodes, or "
                "pass --sub-cluster (sub_cluster=True)")
    if spec is not None:
        if hasattr(spec, "check_tp"):
            spec.check_tp(cfg.tp)
        if hasattr(spec, "check_pp"):
            spec.check_pp(cfg.pp, cfg.virtual_stages)
    return spec, clus


def _engine_options(cfg: ParallelConfig, clus: Cluster | None, capacity: float, *,
                    mode: str, topology: Topology | None, contention: bool | None,
                    overlap_dp: bool, buckets: int, slowdown: dict[int, float] | None,
                    degraded_links: dict[str, float] | None,
                    gpu_types: dict[int, GPU | str] | None, keep_trace: bool
                    ) -> tuple[EngineOptions, dict[int, float] | None]:
    """The SimPy engine's options and the per-rank memory capacities where GPU types
    differ (see :func:`simulate` for the what-ifs)."""
    what_if = bool(slowdown or degraded_links or gpu_types)
    topo = topology
    if topo is None and clus is not None:
        topo = topology_from_cluster(clus)
    if degraded_links:
        if topo is None:
            raise SimulationError("degrading a link needs a cluster or a topology")
        topo = topo.with_degraded(degraded_links)
    use_cont = (topo is not None) if contention is None else bool(contention)
    slow = {int(k): float(v) for k, v in (slowdown or {}).items()}
    for r, v in slow.items():
        if not v > 0:
            raise SimulationError(f"slowdown of GPU {r} must be > 0, got {v}")
    if gpu_types:
        if clus is None:
            raise SimulationError("gpu_types needs a cluster (the base GPU type)")
        base = clus.gpu.peak(cfg.dtype)
        for r, g in gpu_types.items():
            gpu = g if isinstance(g, GPU) else get_gpu(g)
            slow[int(r)] = slow.get(int(r), 1.0) * base / gpu.peak(cfg.dtype)
    if what_if and mode != "full":
        raise SimulationError("what-ifs (slowdown, degraded links, gpu types) need "
                              "mode='full'")
    opts = EngineOptions(mode=mode, contention=use_cont, topology=topo,
                         overlap_dp=overlap_dp, buckets=buckets, zero=split_grad_sync(cfg),
                         slowdown=slow, record_memory=keep_trace)
    caps = None
    if gpu_types and clus is not None:
        frac = capacity / clus.gpu.memory_bytes
        caps = {int(r): frac * (g if isinstance(g, GPU) else get_gpu(g)).memory_bytes
                for r, g in gpu_types.items()}
    return opts, caps


def simulate(
    model: ModelSpec | str | Path | dict | None = None,
    cluster: Cluster | str | Path | dict | None = None,
    config: ParallelConfig | dict | None = None,
    *,
    nodes: int | None = None,
    cost_model: CostModel | None = None,
    cost_table: CostTable | None = None,
    custom_schedule: Schedule | str | Path | None = None,
    mode: str = "representative",
    engine: str = "simpy",
    contention: bool | None = None,
    overlap_dp: bool = False,
    buckets: int = 4,
    topology: Topology | None = None,
    sub_cluster: bool = False,
    slowdown: dict[int, float] | None = None,
    degraded_links: dict[str, float] | None = None,
    gpu_types: dict[int, GPU | str] | None = None,
    keep_trace: bool = True,
    progress: bool | str | Progress = False,
    **config_kwargs: Any,
) -> SimResult:
    """Simulate one training iteration.

    Args:
        model: a model preset name, JSON file/dict or ModelSpec (not needed when
            ``cost_table`` is given).
        cluster: a cluster preset name, JSON file/dict or Cluster; ``nodes`` resizes it.
        config: a ParallelConfig, its dict form, or None with keyword degrees
            (``dp=2, tp=4, pp=8, micro_batch_size=1, global_batch_size=128, ...``).
        cost_model: a :class:`~merak_sim.costs.base.CostModel`; default the analytic
            model with its calibrated A100 efficiency parameters
            (:class:`~merak_sim.costs.calibrated.CalibratedCostModel`).
        cost_table: use these costs directly instead of a cost model.
        custom_schedule: a Schedule or a schedule JSON/CSV file to run instead of the
            configuration's generator (``config.schedule``).
        mode: "representative" (one pipeline, replicas folded by symmetry) or "full"
            (every GPU its own entity).
        engine: "simpy" (discrete events, contention) or "evaluator" (exact
            contention-free critical path, representative mode only; without a
            trace, a generated schedule whose generator declares a steady-state
            period is evaluated on a small base of it and extended exactly,
            :mod:`merak_sim.sim.periodic`).
        contention: share link bandwidth between concurrent transfers; default on when
            the engine is simpy and the cluster's links are known.
        overlap_dp: bucketed data-parallel gradient reduction overlapped with the last
            backwards (default off: AR after the backward, as Megatron without
            ``--overlap-grad-reduce``; also on when ``config.overlap_param_gather``
            is).
        buckets: gradient buckets per model chunk when overlapping.
        sub_cluster: allow dp * tp * pp below the cluster's GPU count.
        slowdown / degraded_links / gpu_types: full-mode what-ifs: compute-time
            multiplier per global rank; capacity factor per link name (``gpu3.out``,
            ``node1.nic.in``); GPU type (preset name or GPU) per global rank, priced by
            the ratio of peak FLOP/s and with its own memory capacity.
        keep_trace: keep the timeline (events, Chrome trace, plots) in the result.
        progress: the SimPy engine's progress on stderr (compute actions done):
            "bar", "lines" (a line every few seconds once past a few), a
            :class:`~merak_sim.progress.Progress`, or False (none).
    """
    cfg = resolve_config(config, **config_kwargs)
    overlap_dp = overlap_dp or cfg.overlap_param_gather
    _check_mode(cfg, mode, engine, contention or slowdown or degraded_links or gpu_types)
    spec, clus = _resolve_model_cluster(model, cluster, nodes, cfg, sub_cluster)
    cost_table = _priced(cfg, spec, clus, cost_model, cost_table)
    placement = RankLayout.of(cfg)
    capacity = float(cost_table.memory_capacity_bytes)
    common = _common(cfg, spec, clus, cost_table)
    if engine == "evaluator":
        return _evaluated(cfg, cost_table, placement, custom_schedule, keep_trace,
                          overlap_dp, buckets, common)
    opts, caps = _engine_options(cfg, clus, capacity, mode=mode, topology=topology,
                                 contention=contention, overlap_dp=overlap_dp,
                                 buckets=buckets, slowdown=slowdown,
                                 degraded_links=degraded_links, gpu_types=gpu_types,
                                 keep_trace=keep_trace)
    tr = _engine_log(_compiled(cfg, cost_table, custom_schedule), placement, capacity, opts,
                     caps, progress)
    return build_result(tr, engine=engine, keep_trace=keep_trace, **common)


def _engine_log(prog: Compiled, placement: RankLayout, capacity: float, opts: EngineOptions,
                caps: dict[int, float] | None, progress: bool | str | Progress) -> EventLog:
    """The discrete-event engine's log of ``prog`` (its progress reported as asked)."""
    with progress_reporter(progress, "simulating") as prog_bar:
        return run_engine(prog, placement, capacity, opts, capacities=caps,
                          progress=prog_bar)


def _check_mode(cfg: ParallelConfig, mode: str, engine: str, discrete: Any) -> None:
    """SimulationError for a mode or engine :func:`simulate` does not know, full mode
    with context parallelism, or the evaluator asked for what only the discrete-event
    engine does (full mode, or ``discrete``: contention or what-ifs)."""
    if mode == "full" and cfg.cp > 1:
        raise SimulationError(f"mode='full' does not place context-parallel ranks (cp="
                              f"{cfg.cp}); use mode='representative'")
    if mode not in ("representative", "full"):
        raise SimulationError(f"unknown mode {mode!r}; choose representative or full")
    if engine not in ("simpy", "evaluator"):
        raise SimulationError(f"unknown engine {engine!r}; choose simpy or evaluator")
    if engine == "evaluator" and (mode != "representative" or discrete):
        raise SimulationError("the fast evaluator runs representative mode without "
                              "contention or what-ifs; use engine='simpy'")


def _priced(cfg: ParallelConfig, spec: ModelSpec | None, clus: Cluster | None,
            cost_model: CostModel | None, cost_table: CostTable | None) -> CostTable:
    """``cost_table``, or the table ``cost_model`` (default the calibrated analytic
    one) prices for the model and cluster."""
    if cost_table is not None:
        return cost_table
    if spec is None or clus is None:
        raise SimulationError("give a model and a cluster (or a cost_table)")
    return (cost_model or CalibratedCostModel()).cost_table(spec, clus, cfg)


def _common(cfg: ParallelConfig, spec: ModelSpec | None, clus: Cluster | None,
            cost_table: CostTable) -> dict:
    """The keyword arguments every result of :func:`simulate` is built with."""
    # A cost model's table already carries the cluster's notes (CostTable.notes);
    # only a hand-made table may lack them, so add just the ones it does not have.
    notes = list(dict.fromkeys(cost_table.notes))
    if clus is not None:
        notes += [n for n in getattr(clus, "notes", ()) if n not in notes]
    return dict(capacity=float(cost_table.memory_capacity_bytes),
                peak_flops=float(cost_table.peak_flops), global_batch=cfg.global_batch_size,
                seq_len=getattr(spec, "seq_len", None) if spec is not None else None,
                config=cfg, notes=tuple(notes), meta=dict(cost_table.meta))


def _compiled(cfg: ParallelConfig, table: CostTable,
              custom_schedule: Schedule | str | Path | None) -> Compiled:
    """The configuration's schedule (or ``custom_schedule``), checked against its
    degrees and compiled with ``table``."""
    sched = (schedule_of(cfg, table) if custom_schedule is None
             else _load_schedule(custom_schedule))
    if (sched.num_stages, sched.num_microbatches, sched.virtual_stages) != (
            cfg.pp, cfg.num_microbatches, cfg.virtual_stages):
        raise SimulationError(
            f"schedule has pp={sched.num_stages}, microbatches={sched.num_microbatches}, "
            f"virtual stages={sched.virtual_stages} but the configuration needs "
            f"{cfg.pp}, {cfg.num_microbatches}, {cfg.virtual_stages}")
    return compile_program(sched, table, recompute_fractions(cfg, sched))


#: Objects a paused block may leave alive before :func:`_collector_paused` freezes
#: them (a schedule of a few thousand passes stays below it).
FREEZE_AFTER = 200_000
#: Micro-batch passes from which an evaluation's result is frozen whatever the count
#: of objects: its few containers (the times, the per-action tuples) hold hundreds of
#: thousands of items, which a collection of the young generation would traverse
#: (20 ms at 65,536 passes, a third of the evaluation).
FREEZE_PASSES = 4096


@contextmanager
def _collector_paused(large: bool = False) -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (if it runs): building
    and evaluating a schedule allocates hundreds of thousands of acyclic tuples,
    actions and lists that reference counting frees, and a collection started part
    way only walks them in vain. Cycles made meanwhile are collected after the
    block.

    Where the block leaves more than :data:`FREEZE_AFTER` new objects alive (a large
    schedule and its structure, kept in the caches, and the result), or it was
    ``large`` (containers of many items), they are frozen (``gc.freeze``) before the
    collector resumes: otherwise its next collections walk every one of them again
    (0.7 s after the 1T run's 0.85 s). They are long-lived and acyclic, so reference
    counting still frees them when dropped; only a cycle alive now and dropped later
    would wait for ``gc.unfreeze``."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if large or gc.get_count()[0] > FREEZE_AFTER:
            gc.freeze()
        gc.enable()


def _evaluated(cfg: ParallelConfig, table: CostTable, placement: RankLayout,
               custom_schedule: Schedule | str | Path | None, keep_trace: bool,
               overlap_dp: bool, buckets: int, common: dict) -> SimResult:
    """:func:`simulate`'s result with the fast evaluator: extended from a small base
    where the schedule is periodic and no trace is kept, else in full (with the
    cyclic collector paused, :func:`_collector_paused`)."""
    with _collector_paused(cfg.pp * cfg.num_microbatches * cfg.virtual_stages
                           >= FREEZE_PASSES):
        if custom_schedule is None and not keep_trace:
            ext = _periodic(cfg, table, placement, overlap_dp, buckets, common)
            if ext is not None:
                return result_of(ext.makespan, ext.figures, None, ext.flops,
                                 ext.recompute_flops, placement=placement, stages=cfg.pp,
                                 mode="representative", engine="evaluator", **common)
        prog = _compiled(cfg, table, custom_schedule)
        tr = evaluator_trace(prog, placement, common["capacity"], overlap_dp=overlap_dp,
                             buckets=buckets, zero=split_grad_sync(cfg), record_memory=keep_trace)
        return build_result(tr, engine="evaluator", keep_trace=keep_trace, **common)


def _periodic(cfg: ParallelConfig, table: CostTable, placement: RankLayout,
              overlap_dp: bool, buckets: int, common: dict) -> Extended | None:
    """The evaluator's figures for ``cfg`` extended from a small base schedule of the
    same generator (:mod:`merak_sim.sim.periodic`), or None to evaluate in full."""
    spec = SCHEDULES.get(cfg.schedule)
    period = spec.steady_period(cfg.pp, cfg.virtual_stages) if spec is not None else None

    def evaluated(m: int) -> Evaluated:
        sched = shape_schedule(cfg.schedule, cfg.pp, m, cfg.virtual_stages)
        prog = compile_program(sched, table, recompute_fractions(cfg, sched))
        tr = evaluator_trace(prog, placement, common["capacity"], overlap_dp=overlap_dp,
                             buckets=buckets, zero=split_grad_sync(cfg), record_memory=False)
        return Evaluated(prog, tr, build_result(tr, engine="evaluator", keep_trace=False,
                                                **common))

    return extended(period, cfg.num_microbatches, evaluated)
