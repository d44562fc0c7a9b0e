"""The measuring half of the validation loop: profile, run for real, write a run directory.

For each configuration, on a gloo world of ``world`` processes (one torch thread
each), every rank:

1. builds the built-in GPT and :func:`merak_exec.parallel.parallelize` s it;
2. **profiles** (the "profiler step"): times each action kind of its own stage
   through the runtime's own action methods (so the runtime's Python glue per action
   is in the figure, not a fudge factor) while every other rank does the same at the
   same moment (so the contention of 2 processes on 2 cores is in the figure too):
   F (with the stage's checkpoint fraction), F with nothing checkpointed, F*, R, B
   after each F, I and W, the all-reduce (tied embedding / data parallel) and the
   optimizer step, the median of ``repeats`` after ``warmup``; the bytes each
   micro-batch keeps for backward (saved-tensor hooks) with and without
   checkpointing; and, once per world, gloo point-to-point latency and bandwidth
   (ping-pong over several sizes, least-squares fit) and the contention factor
   (a fixed matmul loop timed alone versus on every rank at once);
3. **runs for real** (between two profiles, whose times are averaged so that a drift
   of the machine's load affects profile and run alike): ``warmup`` + ``steps``
   training iterations of the schedule, a barrier before each, keeping every timed
   iteration's events on a clock common to all ranks (each rank's iteration origin
   is ``perf_counter``, the system-wide monotonic clock on Linux, so the origins can
   be aligned; on CUDA the recorder times with events and one process is assumed);
4. **measures memory** in one more, untimed iteration: the live bytes of tensors
   autograd saved for backward, of inputs kept by checkpointed layers and of stage
   inputs kept by F* (deduplicated by storage, freed when the graph drops them),
   whose peak per rank is the measured activation memory; and the bytes of
   parameters, gradients and optimizer state.

Rank 0 writes the run directory (:mod:`merak_sim.rundir`).

Why this module lives in ``merak_sim``: the validation loop is owned here, and the
real backend's files belong to another engineer. It imports torch and merak_exec
only inside functions, so ``import merak_sim`` stays light; it reaches into two
private runtime attributes (``PipelineRuntime._forward`` and friends, and
``Recorder._t0``), which a ``merak_exec`` profiling hook would make unnecessary.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Case", "MeasureError", "measure_cases", "small_gpt"]


class MeasureError(ValueError):
    """The measurement could not run (message names the problem and the fix)."""


def small_gpt(layers: int = 8, hidden: int = 128, heads: int = 4, vocab: int = 512,
              seq: int = 128) -> dict:
    """Built-in GPT settings for the CPU validation suite (a dict of GPTConfig fields)."""
    return {"vocab_size": vocab, "n_positions": seq, "n_embd": hidden, "n_layer": layers,
            "n_head": heads, "dropout": 0.0}


@dataclass(frozen=True)
class Case:
    """One configuration to validate.

    Attributes:
        name: directory name of its run.
        config: :class:`~merak_sim.config.ParallelConfig` fields (dict form).
        model: built-in GPT settings (:func:`small_gpt`).
    """

    name: str
    config: dict
    model: dict = field(default_factory=small_gpt)


class _Done:
    """A completed communication handle (the profiler feeds receives directly)."""

    def wait(self, timeout=None) -> bool:  # noqa: D102 - mirrors torch's Work.wait
        return True


# -- memory tracking -----------------------------------------------------------------
class _Live:
    """Live bytes of tracked storages, deduplicated by storage pointer."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.bytes = 0
        self.peak = 0
        self.params: set[int] = set()

    def add(self, t) -> int | None:
        try:
            s = t.untyped_storage()
            ptr, n = s.data_ptr(), s.nbytes()
        except (RuntimeError, NotImplementedError):
            return None
        if ptr in self.params or n == 0:
            return None
        c = self.count.get(ptr, 0)
        if c == 0:
            self.size[ptr] = n
            self.bytes += n
            self.peak = max(self.peak, self.bytes)
        self.count[ptr] = c + 1
        return ptr

    def drop(self, ptr: int | None) -> None:
        if ptr is None or ptr not in self.count:
            return
        self.count[ptr] -= 1
        if self.count[ptr] == 0:
            del self.count[ptr]
            self.bytes -= self.size.pop(ptr)


class _Held:
    """What the pack hook stores: the tensor, and a ticket released with the graph."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t) -> None:
        self.t = t


class _Tracker:
    """Saved-tensor hooks plus checkpoint-input and F*-input tracking, as a context."""

    def __init__(self, params) -> None:
        self.live = _Live()
        self.live.params = {p.untyped_storage().data_ptr() for p in params}
        self._ctx = None
        self._patches: list = []

    def track(self, t) -> None:
        """Count tensor ``t`` (or each tensor of a tuple) until garbage collected."""
        if isinstance(t, (tuple, list)):
            for x in t:
                self.track(x)
            return
        if not hasattr(t, "untyped_storage"):
            return
        ptr = self.live.add(t)
        if ptr is not None:
            weakref.finalize(t, self.live.drop, ptr)

    def _pack(self, t):
        h = _Held(t)
        ptr = self.live.add(t)
        if ptr is not None:
            weakref.finalize(h, self.live.drop, ptr)
        return h

    @staticmethod
    def _unpack(h):
        return h.t

    def __enter__(self):
        import torch

        import merak_exec.runtime as rt_mod
        import merak_exec.stages as st_mod

        orig_ckpt = st_mod.checkpoint
        tracker = self

        def ckpt(fn, *a, **k):  # the inputs a checkpointed layer keeps
            for x in a:
                tracker.track(x)
            return orig_ckpt(fn, *a, **k)

        orig_fn = rt_mod.PipelineRuntime._forward_nograd

        def fwd_nograd(rt, a, st, inputs, labels):  # the stage input F* keeps
            orig_fn(rt, a, st, inputs, labels)
            x = st[(a.chunk, a.microbatch)].x
            if x is not None:
                tracker.track(x)

        orig_run = st_mod.StageModule._run_layers

        def run_layers(mod, *a, **k):
            # saved-tensor hooks are thread-local: sub-pipelined TP runs the layers in
            # worker threads, so the hooks are (re)entered wherever the layers run.
            with torch.autograd.graph.saved_tensors_hooks(tracker._pack, tracker._unpack):
                return orig_run(mod, *a, **k)

        st_mod.checkpoint = ckpt
        rt_mod.PipelineRuntime._forward_nograd = fwd_nograd
        st_mod.StageModule._run_layers = run_layers
        self._patches = [(st_mod, "checkpoint", orig_ckpt),
                         (rt_mod.PipelineRuntime, "_forward_nograd", orig_fn),
                         (st_mod.StageModule, "_run_layers", orig_run)]
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        for obj, name, orig in self._patches:
            setattr(obj, name, orig)
        return False


# -- profiler step ---------------------------------------------------------------------
def _sync() -> None:
    """Wait for queued GPU work (timing GPU actions with a host clock needs it)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median_time(fn, warmup: int, repeats: int, between=None) -> float:
    ts = []
    for i in range(warmup + repeats):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        d = time.perf_counter() - t
        if between is not None:
            between()
        if i >= warmup:
            ts.append(d)
    return statistics.median(ts)


def _profile_stage(pm, inputs, labels, warmup: int, repeats: int) -> dict:
    """Per-action times and bytes of this rank's (single) chunk, through the runtime."""
    import torch

    from merak_sim.schedule.ir import Action, Kind

    rt = pm.runtime
    chunk = pm.chunks[0]
    s = pm.mesh.pp_rank
    gen = torch.Generator().manual_seed(1234 + s)

    def make(specs, scale=1.0):
        return tuple(torch.randn(sh, generator=gen).to(dt) * scale if dt.is_floating_point
                     else torch.zeros(sh, dtype=dt) for sh, dt in specs)

    # The runtime's boundary description changed from one (shape, dtype) to a list
    # per model stage; accept both.
    if hasattr(rt, "boundary_specs"):
        specs = rt.boundary_specs
        x_in = make(specs[s - 1]) if s > 0 else ()
        g_in = make([sd for sd in specs.get(s, []) if sd[1].is_floating_point], 1e-3)
        out_specs = specs.get(s, [])

        def recv_entry(ts):
            return ([_Done()], tuple(t.clone() for t in ts), None)
    else:
        one = [(tuple(rt.boundary_shape), rt.boundary_dtype)]
        x_in, g_in, out_specs = make(one), make(one, 1e-3), one

        def recv_entry(ts):
            return (_Done(), ts[0].clone(), None)
    A = {k: Action(k, s, 0, 0) for k in (Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE,
                                         Kind.BACKWARD, Kind.BACKWARD_INPUT,
                                         Kind.BACKWARD_WEIGHT)}
    box: dict = {}

    def reset():
        rt._sends, rt._recvs, rt._losses = [], {}, {}
        box["st"] = {}
        if not chunk.is_first:
            rt._recvs[(0, 0, Kind.RECV_ACT)] = recv_entry(x_in)
        if not chunk.is_last:
            rt._recvs[(0, 0, Kind.RECV_GRAD)] = recv_entry(g_in)

    def fwd(kind):
        reset()
        if kind is Kind.FORWARD:
            rt._forward(A[kind], box["st"], inputs, labels)
        else:
            rt._forward_nograd(A[kind], box["st"], inputs, labels)

    import torch.distributed as dist

    def timed(setup, action, clear_grads=True):
        ts = []
        for i in range(warmup + repeats):
            setup()
            # Lockstep: every rank times its action at the same moment, so each figure
            # carries the contention of all ranks computing at once (the steady state
            # of a pipeline) rather than whatever the other ranks happened to run.
            _sync()
            dist.barrier()
            t = time.perf_counter()
            action()
            _sync()
            d = time.perf_counter() - t
            if clear_grads:
                for p in pm.parameters():
                    p.grad = None
            if i >= warmup:
                ts.append(d)
        return statistics.median(ts)

    world = dist.get_world_size()
    # Alone: one rank times while the others wait at a barrier (what a pipeline stage
    # sees in warm-up and cool-down). Not under TP: its actions need every TP rank.
    solo_ok = world > 1 and pm.config.tp == 1

    def timed_solo(setup, action, clear_grads=True):
        ts = []
        for i in range(warmup + repeats):
            for r in range(world):
                dist.barrier()
                if r != dist.get_rank():
                    continue
                setup()
                _sync()
                t = time.perf_counter()
                action()
                _sync()
                d = time.perf_counter() - t
                if clear_grads:
                    for p in pm.parameters():
                        p.grad = None
                if i >= warmup:
                    ts.append(d)
        dist.barrier()
        return statistics.median(ts)

    def both(key, setup, action, clear_grads=True):
        out[key] = timed(setup, action, clear_grads)
        out[key[:-2] + "_solo_s"] = (timed_solo(setup, action, clear_grads) if solo_ok
                                     else out[key])

    c_layers = chunk.recompute_layers
    heavy = sum(chunk._heavy)
    out: dict = {"recompute_layers": c_layers, "heavy_layers": heavy,
                 "recompute_fraction": c_layers / heavy if heavy else 0.0}

    def with_layers(n, f):
        def g():
            chunk.recompute_layers = n
            try:
                return f()
            finally:
                chunk.recompute_layers = c_layers
        return g

    st = lambda: box["st"]  # noqa: E731 - short accessor used below
    both("forward_s", reset, lambda: fwd(Kind.FORWARD))
    out["forward_plain_s"] = timed(reset, with_layers(0, lambda: fwd(Kind.FORWARD)))
    both("backward_ckpt_s", lambda: fwd(Kind.FORWARD),
         lambda: rt._backward(A[Kind.BACKWARD], st()))
    both("backward_s", with_layers(0, lambda: fwd(Kind.FORWARD)),
         lambda: rt._backward(A[Kind.BACKWARD], st()))
    both("forward_nograd_s", reset, lambda: fwd(Kind.FORWARD_NOGRAD))
    both("reforward_s", lambda: fwd(Kind.FORWARD_NOGRAD),
         lambda: rt._recompute(A[Kind.RECOMPUTE], st(), labels))
    both("backward_input_s", with_layers(0, lambda: fwd(Kind.FORWARD)),
         lambda: rt._backward_input(A[Kind.BACKWARD_INPUT], st()), clear_grads=False)
    reset()

    def iw_setup():
        with_layers(0, lambda: fwd(Kind.FORWARD))()
        rt._backward_input(A[Kind.BACKWARD_INPUT], box["st"])

    both("backward_weight_s", iw_setup,
         lambda: rt._backward_weight(A[Kind.BACKWARD_WEIGHT], st()))
    # Bare module time: the stage's layers without the runtime around them.
    xb = (inputs[0],) if chunk.is_first else x_in

    def bare():
        with torch.no_grad():
            chunk(*xb, use_checkpoint=False)
    out["bare_forward_nograd_s"] = timed(lambda: None, bare, clear_grads=False)
    # Bytes kept per micro-batch (saved-tensor hooks), with and without checkpointing.
    params = list(pm.parameters())
    for key, n in (("activation_bytes", 0), ("checkpoint_bytes", heavy),
                   ("kept_bytes", c_layers)):
        reset()
        chunk.recompute_layers = n
        with _Tracker(params) as tr:
            rt._forward(A[Kind.FORWARD], box["st"], inputs, labels)
            mb = box["st"][(0, 0)]
            tr.track(mb.x)  # the runtime keeps the stage input for backward
            out[key] = tr.live.bytes
        chunk.recompute_layers = c_layers
        box["st"] = {}
    reset()
    with _Tracker(params) as tr:
        rt._forward_nograd(A[Kind.FORWARD_NOGRAD], box["st"], inputs, labels)
        out["input_bytes"] = tr.live.bytes
    box["st"] = {}
    out["p2p_bytes"] = 0 if chunk.is_last else sum(
        math.prod(sh) * torch.empty((), dtype=dt).element_size() for sh, dt in out_specs)
    # AR and OPT in lockstep with every rank (their collectives need all of them).
    with_layers(0, lambda: fwd(Kind.FORWARD))()
    rt._backward(A[Kind.BACKWARD], box["st"])
    out["all_reduce_s"] = _median_time(rt._all_reduce_grads, warmup, repeats)
    opt = rt.optimizer
    out["optimizer_s"] = _median_time(opt.step, warmup, repeats)
    opt.zero_grad(set_to_none=True)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in params)
    out["optimizer_bytes"] = sum(v.numel() * v.element_size() for stt in opt.state.values()
                                 for v in stt.values() if hasattr(v, "numel") and v.dim() > 0)
    rt._sends, rt._recvs, rt._losses = [], {}, {}
    return out


def _machine(rank: int, world: int, sizes: list[int], warmup: int, repeats: int) -> dict:
    """gloo point-to-point between ranks 0 and 1 and the contention factor of ``world``
    busy processes.

    One-way time as the runtime meets it when a transfer is exposed: the receiver has
    posted its ``irecv`` and waits on it, the sender stamps the moment it posts
    ``isend``, the receiver the moment its wait returns; both stamps are
    ``perf_counter``, one clock for every process on the machine. Fitted as
    alpha + bytes * beta (least squares over the medians per size). The blocking
    ping-pong (half a round trip) is kept as a diagnostic.
    """
    import torch
    import torch.distributed as dist

    out: dict = {"p2p_points": [], "pingpong_points": []}
    two = world >= 2 and rank < 2
    peer = 1 - rank if two else -1
    for n in sizes if world >= 2 else []:
        t = torch.zeros(max(1, n // 4), dtype=torch.float32)
        stamps = []
        for _ in range(warmup + repeats):
            dist.barrier()
            w = dist.irecv(t, 0) if rank == 1 else None
            dist.barrier()
            stamp = 0.0
            if rank == 0:
                stamp = time.perf_counter()
                dist.isend(t, 1).wait()
            elif rank == 1:
                w.wait()
                stamp = time.perf_counter()
            stamps.append(stamp)
        allv: list = [None] * world
        dist.all_gather_object(allv, stamps)
        lat = [b - a for a, b in zip(allv[0][warmup:], allv[1][warmup:], strict=True)]
        out["p2p_points"].append([t.numel() * 4, statistics.median(lat)])

        def ping(t=t):
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            elif rank == 1:
                dist.recv(t, peer)
                dist.send(t, peer)
        dist.barrier()
        out["pingpong_points"].append([t.numel() * 4,
                                       _median_time(ping, warmup, repeats) / 2])
    # Cost of posting one non-blocking send or receive (the runtime posts between
    # compute actions; the simulator's posts take no time, so it is added to the
    # action that follows). Both directions, the largest size, in lockstep.
    if world >= 2:
        t = torch.zeros(max(1, sizes[-1] // 4), dtype=torch.float32)
        posts = []
        for i in range(warmup + repeats):
            for sender in (0, 1):
                dist.barrier()
                if not two:
                    continue
                t0 = time.perf_counter()
                w = dist.isend(t, peer) if rank == sender else dist.irecv(t, peer)
                d = time.perf_counter() - t0
                w.wait()
                if i >= warmup:
                    posts.append(d)
        out["p2p_post_s"] = statistics.median(posts) if posts else 0.0
    dist.barrier()
    a = torch.randn(192, 192)

    def work():
        for _ in range(20):
            a @ a
    solo = []
    for r in range(world):  # each rank alone, the others wait at the barrier
        if r == rank:
            solo.append(_median_time(work, warmup, repeats))
        dist.barrier()
    together = _median_time(work, warmup, repeats)
    dist.barrier()
    out["compute_solo_s"] = solo[0]
    out["compute_together_s"] = together
    out["contention_factor"] = together / solo[0] if solo and solo[0] > 0 else 1.0
    pts = out["p2p_points"]
    if len(pts) >= 2:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        beta = max(beta, 0.0)
        out["p2p_alpha_s"] = max(0.0, my - beta * mx)
        out["p2p_s_per_byte"] = beta
    out["threads"] = torch.get_num_threads()
    return out


# -- the real run ------------------------------------------------------------------------
def _batches(model_cfg: dict, global_batch: int, steps: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    seq, vocab = model_cfg["n_positions"], model_cfg["vocab_size"]
    out = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (global_batch, seq + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def _run_case(case: Case, rank: int, world: int, opts: dict) -> dict:
    import torch
    import torch.distributed as dist

    from merak_exec.models import GPT, GPTConfig
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig.from_dict(case.config)
    if pc.world_size != world:
        raise MeasureError(f"case {case.name}: dp*tp*pp = {pc.world_size} but the world has "
                           f"{world} processes")
    mcfg = GPTConfig(**case.model)
    seq = mcfg.n_positions
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=seq)
    steps, warm = opts["steps"], opts["warmup_steps"]
    data = _batches(case.model, pc.global_batch_size, steps + warm + 2)
    ids0, lab0 = data[0]
    inputs, labels = pm.split_batch(ids0), pm.split_batch(lab0)
    dist.barrier()
    prof = _profile_stage(pm, inputs, labels, opts["warmup"], opts["repeats"])
    dist.barrier()
    rt = pm.runtime
    rows, wall, origins, losses = [], [], [], []
    for i, (ids, lab) in enumerate(data[:steps + warm]):
        _sync()
        dist.barrier()
        t = time.perf_counter()
        out = pm.train_step(ids, lab)
        _sync()
        d = time.perf_counter() - t
        if i >= warm:
            k = i - warm
            wall.append(d)
            origins.append(rt.recorder._t0)
            losses.append(out.loss)
            for e in out.events:
                rows.append(dict(e, step=k))
    # Profile again after the run and average: the machine's load drifts, and a
    # profile taken on both sides of the run sees conditions closer to the run's.
    dist.barrier()
    again = _profile_stage(pm, inputs, labels, opts["warmup"], opts["repeats"])
    for k, v in again.items():
        if k.endswith("_s"):
            prof[k] = (prof[k] + v) / 2
    # One untimed iteration with memory tracking.
    dist.barrier()
    params = list(pm.parameters())
    ids, lab = data[-1]
    with _Tracker(params) as tr:
        pm.train_step(ids, lab)
        act_peak = tr.live.peak
    opt = rt.optimizer
    mem = {"activation_peak_bytes": act_peak,
           "param_bytes": sum(p.numel() * p.element_size() for p in params),
           "grad_bytes": sum(p.numel() * p.element_size() for p in params),
           "optimizer_bytes": sum(v.numel() * v.element_size() for s in opt.state.values()
                                  for v in s.values() if hasattr(v, "numel") and v.dim() > 0)}
    mine = {"rank": rank, "pp_rank": pm.mesh.pp_rank, "dp_rank": pm.mesh.dp_rank,
            "tp_rank": pm.mesh.tp_rank, "profile": prof, "events": rows, "wall_s": wall,
            "origins": origins, "losses": losses, "memory": mem}
    allv: list = [None] * world
    dist.all_gather_object(allv, mine)
    del pm
    return {"ranks": allv, "config": pc.to_dict(), "model": case.model, "seq_len": seq}


def _worker(rank: int, world: int, port: int, cases: list, out_dir: str, opts: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    os.environ.setdefault("MERAK_TIMEOUT_S", str(opts.get("timeout_s", 120)))
    import torch

    torch.set_num_threads(1)
    status: dict = {"rank": rank, "done": [], "error": None}
    try:
        from merak_exec.mesh import init_distributed

        init_distributed(backend=opts.get("backend", "gloo"))
        sizes = opts["p2p_sizes"]
        machine = _machine(rank, world, sizes, opts["warmup"], max(5, opts["repeats"]))
        for c in cases:
            case = Case(**c)
            res = _run_case(case, rank, world, opts)
            if rank == 0:
                from merak_sim.rundir import write_measured

                write_measured(Path(out_dir) / case.name, res, machine, opts)
            status["done"].append(case.name)
    except Exception:  # reported through the status file, judged by the parent
        status["error"] = traceback.format_exc()
    from merak_sim.io import atomic_write_text

    atomic_write_text(os.path.join(out_dir, f".status-rank{rank}.json"), json.dumps(status))
    os._exit(0)  # skip gloo teardown (known exit-time aborts); results are written


DEFAULT_OPTS = {"steps": 9, "warmup_steps": 2, "warmup": 2, "repeats": 9,
                "p2p_sizes": [4096, 65536, 262144, 1048576], "timeout_s": 120,
                "backend": "gloo"}


def measure_cases(cases: list[Case], out_dir: str | Path, *, world: int = 2,
                  timeout_s: float = 1800, **opts) -> list[Path]:
    """Profile and run every case on a fresh gloo world of ``world`` processes; return
    the run directories (``out_dir/<case.name>``). Raises :class:`MeasureError` with
    the failing rank's last line if a rank fails, or when ``timeout_s`` passes."""
    import torch.multiprocessing as mp

    from merak_exec.testing import free_port

    o = dict(DEFAULT_OPTS)
    unknown = set(opts) - set(o)
    if unknown:
        raise MeasureError(f"unknown measurement option(s): {', '.join(sorted(unknown))}")
    o.update(opts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob(".status-rank*.json"):
        f.unlink()
    payload = [{"name": c.name, "config": c.config, "model": c.model} for c in cases]
    ctx = mp.spawn(_worker, args=(world, free_port(), payload, str(out), o), nprocs=world,
                   join=False)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise MeasureError(f"measurement did not finish within {timeout_s:g} s; lower "
                               "steps/repeats or the model size")
    for r in range(world):
        f = out / f".status-rank{r}.json"
        if not f.exists():
            raise MeasureError(f"rank {r} wrote no status (it crashed); rerun with fewer cases")
        st = json.loads(f.read_text())
        if st["error"]:
            last = st["error"].strip().splitlines()[-1]
            raise MeasureError(f"rank {r} failed: {last}")
    return [out / c.name for c in cases]
