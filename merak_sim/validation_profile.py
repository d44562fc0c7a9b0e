"""The profiler step of the validation loop: per-action stage times, kept bytes, and
machine parameters (gloo point-to-point, posting cost, contention).

:func:`profile_stage` times every action kind of this rank's stage *through the
runtime's own action methods* (so the runtime's Python glue per action is in the
figure, not a fudge factor), in lockstep with the other ranks (all busy: the
contention of 2 processes on 2 cores is in the figure) and, where the ranks are
independent, also alone (:func:`merak_sim.validation._contention` uses both); and the
bytes a micro-batch keeps for backward, with and without checkpointing, through
:class:`Tracker` (saved-tensor hooks, checkpoint inputs, F* inputs).
:func:`measure_machine` measures gloo's one-way time, the cost of posting a send or
receive and a contention factor. torch and merak_exec are imported inside functions
only (see :mod:`merak_sim.validation_measure` for why this lives in merak_sim).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref

__all__ = ["Tracker", "profile_stage", "measure_machine", "sync"]

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


class Tracker:
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
        # Hold a detached alias: a saved *output* packed with its grad_fn would form a
        # cycle through the C++ graph that keeps retained graphs (zero-bubble I/W uses
        # retain_graph) and their tensors alive forever; autograd restores grad_fn on
        # unpack, as torch.autograd.graph.save_on_cpu relies on.
        h = _Held(t.detach())
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
def sync() -> None:
    """Wait for queued GPU work (timing GPU actions with a host clock needs it)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _median_time(fn, warmup: int, repeats: int, between=None, fastest=None) -> float:
    """Median seconds of ``fn`` over ``repeats`` after ``warmup`` (the fastest sample
    goes to ``fastest["t"]`` when a dict is given)."""
    ts = []
    for i in range(warmup + repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        d = time.perf_counter() - t
        if between is not None:
            between()
        if i >= warmup:
            ts.append(d)
    if fastest is not None:
        fastest["t"] = min(ts)
        fastest["mean"] = statistics.fmean(ts)
    return statistics.median(ts)


#: Bytes written between optimizer-step samples on CPU: twice the 32 MiB last-level
#: cache of the development machine, enough for most server CPUs' share per core.
_CACHE_FLUSH_BYTES = 64 * 2**20


def profile_stage(pm, inputs, labels, warmup: int, repeats: int) -> dict:
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

    # The fastest sample of the last timing (the lower envelope) and its mean: an
    # iteration sums many right-skewed action times, so its typical (median) value is
    # close to the sum of the actions' means, above the sum of their medians.
    fastest: dict = {}
    # Main-thread CPU seconds against wall seconds of every sample timed with all ranks
    # busy: near 1 the rank kept its core while profiled, as the run's CPU share
    # (:func:`merak_sim.validation.cpu_shares`) tells for the run.
    busy = {"wall": 0.0, "cpu": 0.0}

    def sample(setup, action, clear_grads: bool, lockstep: bool) -> float:
        """Seconds of one ``action()`` after ``setup()`` (a barrier first if lockstep)."""
        setup()
        sync()
        if lockstep:
            dist.barrier()
        t, c = time.perf_counter(), time.thread_time()
        action()
        sync()
        d = time.perf_counter() - t
        if lockstep:
            busy["wall"] += d
            busy["cpu"] += time.thread_time() - c
        if clear_grads:
            for p in pm.parameters():
                p.grad = None
        return d

    def timed(setup, action, clear_grads=True):
        ts = []
        for i in range(warmup + repeats):
            # Lockstep: every rank times its action at the same moment, so each figure
            # carries the contention of all ranks computing at once (the steady state
            # of a pipeline) rather than whatever the other ranks happened to run.
            d = sample(setup, action, clear_grads, lockstep=True)
            if i >= warmup:
                ts.append(d)
        fastest["t"] = min(ts)
        fastest["mean"] = statistics.fmean(ts)
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
                d = sample(setup, action, clear_grads, lockstep=False)
                if i >= warmup:
                    ts.append(d)
        dist.barrier()
        fastest["t"] = min(ts)
        fastest["mean"] = statistics.fmean(ts)
        return statistics.median(ts)

    def both(key, setup, action, clear_grads=True):
        out[key] = timed(setup, action, clear_grads)
        out[key[:-2] + "_min_s"] = fastest["t"]
        out[key[:-2] + "_mean_s"] = fastest["mean"]
        if solo_ok:
            out[key[:-2] + "_solo_s"] = timed_solo(setup, action, clear_grads)
            out[key[:-2] + "_solo_min_s"] = fastest["t"]
            out[key[:-2] + "_solo_mean_s"] = fastest["mean"]
        else:
            for suffix in ("_s", "_min_s", "_mean_s"):
                out[key[:-2] + "_solo" + suffix] = out[key[:-2] + suffix]

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
    # A run clears the gradients once per step (set to None), so only a rank's first
    # backward of the step stores fresh ones; the others add into them (autograd's
    # in-place accumulation: the old gradient read and written back), which the
    # figures above, timed on cleared gradients, leave out. The difference (0.6-2.2 %
    # of a 4-layer stage's backward of the suite's GPT in one process here,
    # benchmarks/backward_context.py) is below two samples' noise, so it is measured
    # in pairs, all ranks at once: the backward on cleared gradients, then the same
    # again adding into them; the median of the pairs' differences is
    # ``<key>_accum_delta_s``, which the pricing adds to every backward but a rank's
    # first of the step.
    def accumulation(key, setup, action):
        diffs = []
        for i in range(warmup + repeats):
            for p in pm.parameters():
                p.grad = None
            fresh = sample(setup, action, clear_grads=False, lockstep=True)
            adding = sample(setup, action, clear_grads=True, lockstep=True)
            if i >= warmup:
                diffs.append(adding - fresh)
        out[key] = statistics.median(diffs)

    accumulation("backward_ckpt_accum_delta_s", lambda: fwd(Kind.FORWARD),
                 lambda: rt._backward(A[Kind.BACKWARD], st()))
    accumulation("backward_accum_delta_s", with_layers(0, lambda: fwd(Kind.FORWARD)),
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
    accumulation("backward_weight_accum_delta_s", iw_setup,
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
        with Tracker(params) as tr:
            rt._forward(A[Kind.FORWARD], box["st"], inputs, labels)
            mb = box["st"][(0, 0)]
            tr.track(mb.x)  # the runtime keeps the stage input for backward
            out[key] = tr.live.bytes
        chunk.recompute_layers = c_layers
        box["st"] = {}
    reset()
    with Tracker(params) as tr:
        rt._forward_nograd(A[Kind.FORWARD_NOGRAD], box["st"], inputs, labels)
        out["input_bytes"] = tr.live.bytes
    box["st"] = {}
    out["p2p_bytes"] = 0 if chunk.is_last else sum(
        math.prod(sh) * torch.empty((), dtype=dt).element_size() for sh, dt in out_specs)
    # AR and OPT in lockstep with every rank (their collectives need all of them).
    with_layers(0, lambda: fwd(Kind.FORWARD))()
    rt._backward(A[Kind.BACKWARD], box["st"])
    out["all_reduce_s"] = _median_time(rt._all_reduce_grads, warmup, repeats, fastest=fastest)
    out["all_reduce_min_s"] = fastest["t"]
    out["all_reduce_mean_s"] = fastest["mean"]
    opt = rt.optimizer
    # In a run the optimizer step follows a whole backward pass, whose activations and
    # gradients have pushed the optimizer's state out of the CPU's last-level cache;
    # timed back to back, the step would find its state cached (15 % faster here).
    # So each sample runs after the cache is refilled with other data.
    flush = None
    if pm.mesh.device.type != "cuda":
        junk = torch.zeros(_CACHE_FLUSH_BYTES // 4)

        def flush(junk=junk):
            junk.add_(1.0)
        flush()
    out["optimizer_s"] = _median_time(opt.step, warmup, repeats, between=flush,
                                      fastest=fastest)
    out["optimizer_min_s"] = fastest["t"]
    out["optimizer_mean_s"] = fastest["mean"]
    opt.zero_grad(set_to_none=True)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in params)
    out["optimizer_bytes"] = sum(v.numel() * v.element_size() for stt in opt.state.values()
                                 for v in stt.values() if hasattr(v, "numel") and v.dim() > 0)
    out["lockstep_wall_s"], out["lockstep_cpu_s"] = busy["wall"], busy["cpu"]
    rt._sends, rt._recvs, rt._losses = [], {}, {}
    return out


def measure_machine(rank: int, world: int, sizes: list[int], warmup: int, repeats: int) -> dict:
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
