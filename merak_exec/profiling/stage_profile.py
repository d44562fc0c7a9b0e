"""The profiler step of the validation loop: every action kind of a rank's stage, timed.

:func:`profile_stage` times each action kind of this rank's (single) chunk *through the
runtime's own action code* (:meth:`merak_exec.runtime.PipelineRuntime.run_action`, so
the runtime's Python glue per action is in the figure, not a fudge factor), in
lockstep with the other ranks (all busy: the contention of 2 processes on 2 cores is
in the figure) and, where the ranks are independent, also alone (the pricing of
:mod:`merak_sim.validation` uses both); and the bytes a micro-batch keeps for backward,
with and without checkpointing, through the
:class:`~merak_exec.profiling.saved_tensors.SavedTensorTracker`. One function per
action kind writes its figures; they run in a fixed order.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from merak_exec.profiling.clock import median_time, sync
from merak_exec.profiling.saved_tensors import SavedTensorTracker
from merak_exec.step_state import StepState
from merak_sim.schedule.ir import Action, Kind

__all__ = ["profile_stage"]

#: Bytes written between optimizer-step samples on CPU: twice the 32 MiB last-level
#: cache of the development machine, enough for most server CPUs' share per core.
_CACHE_FLUSH_BYTES = 64 * 2**20
#: Fewest (fresh, adding) backward pairs behind a gradient-accumulation figure
#: (:meth:`_Bench.accumulation`): the median of five differences, not of the two a quick
#: profile's ``repeats`` give.
ACCUM_MIN_PAIRS = 5


class _Bench:
    """The stage under test: its runtime, fixed inputs, the current step state and the
    sampling rules shared by every action kind's figures."""

    def __init__(self, pm, inputs, labels, warmup: int, repeats: int) -> None:
        self.pm, self.rt, self.chunk = pm, pm.runtime, pm.chunks[0]
        self.inputs, self.labels, self.warmup, self.repeats = inputs, labels, warmup, repeats
        s = pm.mesh.pp_rank
        gen = torch.Generator().manual_seed(1234 + s)

        def make(specs, scale=1.0):
            return tuple(torch.randn(sh, generator=gen).to(dt) * scale
                         if dt.is_floating_point else torch.zeros(sh, dtype=dt)
                         for sh, dt in specs)
        specs = self.rt.boundary_specs
        self.x_in = make(specs[s - 1]) if s > 0 else ()
        self.g_in = make([sd for sd in specs.get(s, []) if sd[1].is_floating_point], 1e-3)
        self.out_specs = specs.get(s, [])
        self.actions = {k: Action(k, s, 0 if k.per_microbatch else -1, 0) for k in (
            Kind.FORWARD, Kind.FORWARD_NOGRAD, Kind.RECOMPUTE, Kind.BACKWARD,
            Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT, Kind.ALL_REDUCE)}
        self.state = StepState()
        self.layers = self.chunk.recompute_layers
        # The fastest sample of the last timing (the lower envelope) and its mean: an
        # iteration sums many right-skewed action times, so its typical (median) value
        # is close to the sum of the actions' means, above the sum of their medians.
        self.fastest: dict = {}
        # Main-thread CPU seconds against wall seconds of every sample timed with all
        # ranks busy: near 1 the rank kept its core while profiled, as the run's CPU
        # share (:func:`merak_sim.validation.measured.cpu_shares`) tells for the run.
        self.busy = {"wall": 0.0, "cpu": 0.0}
        self.world = dist.get_world_size()
        # Alone: one rank times while the others wait at a barrier (what a pipeline
        # stage sees in warm-up and cool-down). Not under TP: its actions need every
        # TP rank.
        self.solo_ok = self.world > 1 and pm.config.tp == 1

    # -- running actions ---------------------------------------------------------------
    def reset(self) -> None:
        """A fresh step state whose receives are already there."""
        self.state = StepState()
        if not self.chunk.is_first:
            self.state.give_receive(Kind.RECV_ACT, 0, 0, tuple(t.clone() for t in self.x_in))
        if not self.chunk.is_last:
            self.state.give_receive(Kind.RECV_GRAD, 0, 0, tuple(t.clone() for t in self.g_in))

    def act(self, kind: Kind) -> None:
        """Run action ``kind`` on micro-batch 0 of the current state."""
        self.rt.run_action(self.actions[kind], self.state, self.inputs, self.labels)

    def fwd(self, kind: Kind) -> None:
        """A fresh state, then forward ``kind`` (F or F*)."""
        self.reset()
        self.act(kind)

    def runner(self, kind: Kind) -> Callable[[], None]:
        return lambda: self.act(kind)

    def forwarder(self, kind: Kind) -> Callable[[], None]:
        return lambda: self.fwd(kind)

    def with_layers(self, n: int, f: Callable[[], object]) -> Callable[[], object]:
        """``f`` with ``n`` layers checkpointed instead of the stage's own number."""
        def g():
            self.chunk.recompute_layers = n
            try:
                return f()
            finally:
                self.chunk.recompute_layers = self.layers
        return g

    def clear_grads(self) -> None:
        for p in self.pm.parameters():
            p.grad = None

    # -- sampling ------------------------------------------------------------------------
    def sample(self, setup, action, clear_grads: bool, lockstep: bool) -> float:
        """Seconds of one ``action()`` after ``setup()`` (a barrier first if lockstep);
        ``clear_grads`` clears the gradients after it, untimed."""
        setup()
        sync()
        if lockstep:
            dist.barrier()
        t, c = time.perf_counter(), time.thread_time()
        action()
        sync()
        d = time.perf_counter() - t
        if lockstep:
            self.busy["wall"] += d
            self.busy["cpu"] += time.thread_time() - c
        if clear_grads:
            self.clear_grads()
        return d

    def _summary(self, ts: list[float]) -> float:
        self.fastest["t"] = min(ts)
        self.fastest["mean"] = statistics.fmean(ts)
        return statistics.median(ts)

    def timed(self, setup, action, clear_grads: bool = True) -> float:
        """Median over the repeats, every rank timing its action at the same moment, so
        each figure carries the contention of all ranks computing at once (the steady
        state of a pipeline) rather than whatever the other ranks happened to run."""
        ts = []
        for i in range(self.warmup + self.repeats):
            d = self.sample(setup, action, clear_grads, lockstep=True)
            if i >= self.warmup:
                ts.append(d)
        return self._summary(ts)

    def timed_solo(self, setup, action, clear_grads: bool = True) -> float:
        """Median over the repeats, each rank timing while the others wait."""
        ts = []
        for i in range(self.warmup + self.repeats):
            for r in range(self.world):
                dist.barrier()
                if r != dist.get_rank():
                    continue
                d = self.sample(setup, action, clear_grads, lockstep=False)
                if i >= self.warmup:
                    ts.append(d)
        dist.barrier()
        return self._summary(ts)

    def both(self, out: dict, key: str, setup, action, clear_grads: bool = True) -> None:
        """``key`` (lockstep median) with its ``_min_s``/``_mean_s`` and the ``_solo``
        figures (the lockstep ones again where ranks cannot run alone)."""
        base = key[:-2]
        out[key] = self.timed(setup, action, clear_grads)
        out[base + "_min_s"] = self.fastest["t"]
        out[base + "_mean_s"] = self.fastest["mean"]
        if self.solo_ok:
            out[base + "_solo_s"] = self.timed_solo(setup, action, clear_grads)
            out[base + "_solo_min_s"] = self.fastest["t"]
            out[base + "_solo_mean_s"] = self.fastest["mean"]
        else:
            for suffix in ("_s", "_min_s", "_mean_s"):
                out[base + "_solo" + suffix] = out[base + suffix]

    def accumulation(self, out: dict, key: str, setup, action) -> None:
        """A run clears the gradients once per step (set to None), so only a rank's
        first backward of the step stores fresh ones; the others add into them
        (autograd's in-place accumulation: the old gradient read and written back),
        which figures timed on cleared gradients leave out. The difference (0.6-2.2 %
        of a 4-layer stage's backward of the suite's GPT in one process here,
        benchmarks/backward_context.py) is below two samples' noise, so it is measured
        in pairs, all ranks at once: the backward on cleared gradients, then the same
        again adding into them; the median of the pairs' differences is ``key``, which
        the pricing adds to every backward but a rank's first of the step. At least
        :data:`ACCUM_MIN_PAIRS` pairs after the warmup, whatever the profile's
        ``repeats``: a median of two differences is one of noise."""
        diffs = []
        for i in range(self.warmup + max(self.repeats, ACCUM_MIN_PAIRS)):
            self.clear_grads()
            fresh = self.sample(setup, action, clear_grads=False, lockstep=True)
            adding = self.sample(setup, action, clear_grads=True, lockstep=True)
            if i >= self.warmup:
                diffs.append(adding - fresh)
        out[key] = statistics.median(diffs)


# -- one function per action kind ------------------------------------------------------------
def _forward(b: _Bench, out: dict) -> None:
    """F with the stage's checkpoint fraction, and with nothing checkpointed."""
    b.both(out, "forward_s", b.reset, b.forwarder(Kind.FORWARD))
    out["forward_plain_s"] = b.timed(b.reset, b.with_layers(0, b.forwarder(Kind.FORWARD)))


def _backward(b: _Bench, out: dict) -> None:
    """B after each F (checkpointed or not), and what adding into gradients costs."""
    plain_f = b.with_layers(0, b.forwarder(Kind.FORWARD))
    backward = b.runner(Kind.BACKWARD)
    b.both(out, "backward_ckpt_s", b.forwarder(Kind.FORWARD), backward)
    b.both(out, "backward_s", plain_f, backward)
    b.accumulation(out, "backward_ckpt_accum_delta_s", b.forwarder(Kind.FORWARD), backward)
    b.accumulation(out, "backward_accum_delta_s", plain_f, backward)


def _nograd(b: _Bench, out: dict) -> None:
    """F* and the re-forward R after it."""
    b.both(out, "forward_nograd_s", b.reset, b.forwarder(Kind.FORWARD_NOGRAD))
    b.both(out, "reforward_s", b.forwarder(Kind.FORWARD_NOGRAD), b.runner(Kind.RECOMPUTE))


def _zero_bubble(b: _Bench, out: dict) -> None:
    """I after a plain F, and W after I (zero-bubble's split backward)."""
    plain_f = b.with_layers(0, b.forwarder(Kind.FORWARD))
    b.both(out, "backward_input_s", plain_f, b.runner(Kind.BACKWARD_INPUT), clear_grads=False)
    b.reset()

    def iw_setup():
        plain_f()
        b.act(Kind.BACKWARD_INPUT)

    weight = b.runner(Kind.BACKWARD_WEIGHT)
    b.both(out, "backward_weight_s", iw_setup, weight)
    b.accumulation(out, "backward_weight_accum_delta_s", iw_setup, weight)


def _bare(b: _Bench, out: dict) -> None:
    """The stage's layers without the runtime around them (no-grad)."""
    xb = (b.inputs[0],) if b.chunk.is_first else b.x_in

    def bare():
        with torch.no_grad():
            b.chunk(*xb, use_checkpoint=False)
    out["bare_forward_nograd_s"] = b.timed(lambda: None, bare, clear_grads=False)


def _memory(b: _Bench, out: dict) -> None:
    """Bytes kept per micro-batch, with and without checkpointing, by F*, and sent."""
    params = list(b.pm.parameters())
    for key, n in (("activation_bytes", 0), ("checkpoint_bytes", b.chunk.num_heavy),
                   ("kept_bytes", b.layers)):
        b.reset()
        b.chunk.recompute_layers = n
        with SavedTensorTracker(params, b.rt) as tr:
            b.act(Kind.FORWARD)
            tr.track(b.state.microbatch(0, 0).x)  # the runtime keeps the stage input
            out[key] = tr.live_bytes
        b.chunk.recompute_layers = b.layers
        b.state = StepState()
    b.reset()
    with SavedTensorTracker(params, b.rt) as tr:
        b.act(Kind.FORWARD_NOGRAD)
        out["input_bytes"] = tr.live_bytes
    b.state = StepState()
    out["p2p_bytes"] = 0 if b.chunk.is_last else sum(
        math.prod(sh) * torch.empty((), dtype=dt).element_size() for sh, dt in b.out_specs)


def _all_reduce(b: _Bench, out: dict) -> None:
    """AR after one plain F and B, in lockstep (its collectives need every rank)."""
    b.with_layers(0, b.forwarder(Kind.FORWARD))()
    b.act(Kind.BACKWARD)
    out["all_reduce_s"] = median_time(b.runner(Kind.ALL_REDUCE), b.warmup, b.repeats,
                                      fastest=b.fastest)
    out["all_reduce_min_s"] = b.fastest["t"]
    out["all_reduce_mean_s"] = b.fastest["mean"]


def _optimizer(b: _Bench, out: dict) -> None:
    """The optimizer step, each sample after the CPU cache was refilled: in a run the
    step follows a whole backward pass, whose activations and gradients have pushed the
    optimizer's state out of the last-level cache (timed back to back it would find
    its state cached, 15 % faster here)."""
    opt = b.rt.optimizer
    flush = None
    if b.pm.mesh.device.type != "cuda":
        junk = torch.zeros(_CACHE_FLUSH_BYTES // 4)

        def flush(junk=junk):
            junk.add_(1.0)
        flush()
    out["optimizer_s"] = median_time(opt.step, b.warmup, b.repeats, between=flush,
                                     fastest=b.fastest)
    out["optimizer_min_s"] = b.fastest["t"]
    out["optimizer_mean_s"] = b.fastest["mean"]
    opt.zero_grad(set_to_none=True)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in b.pm.parameters())
    out["optimizer_bytes"] = sum(v.numel() * v.element_size() for st in opt.state.values()
                                 for v in st.values() if hasattr(v, "numel") and v.dim() > 0)


def profile_stage(pm, inputs, labels, warmup: int, repeats: int) -> dict:
    """Per-action times and bytes of this rank's (single) chunk of the
    :class:`~merak_exec.parallel.ParallelModel` ``pm``, through its runtime (every rank
    calls it together); ``inputs``/``labels``: one iteration's micro-batches."""
    b = _Bench(pm, inputs, labels, warmup, repeats)
    heavy = b.chunk.num_heavy
    out: dict = {"recompute_layers": b.layers, "heavy_layers": heavy,
                 "recompute_fraction": b.layers / heavy if heavy else 0.0}
    for figures in (_forward, _backward, _nograd, _zero_bubble, _bare, _memory,
                    _all_reduce, _optimizer):
        figures(b, out)
    out["lockstep_wall_s"], out["lockstep_cpu_s"] = b.busy["wall"], b.busy["cpu"]
    return out
