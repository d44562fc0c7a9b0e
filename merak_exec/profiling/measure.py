"""The measuring half of the validation loop: profile, run for real, write a run directory.

For each configuration, on one gloo world of ``world`` processes (one torch thread
each), every rank:

1. builds the built-in GPT and :func:`merak_exec.parallel.parallelize` s it;
2. **profiles** (the "profiler step", :mod:`merak_exec.profiling.stage_profile`): times
   each action kind of its own stage through the runtime's own action code while every
   other rank does the same at the same moment (so the contention of 2 processes on 2
   cores is in the figure too): F (with the stage's checkpoint fraction), F with
   nothing checkpointed, F*, R, B after each F, I and W (on cleared gradients; and, in
   pairs, the extra time of B and W adding into existing gradients, as every backward
   of a step but the first does: at least
   :data:`~merak_exec.profiling.stage_profile.ACCUM_MIN_PAIRS` pairs whatever
   ``repeats``), the all-reduce (tied embedding / data parallel) and the optimizer
   step, the median of ``repeats`` after ``warmup``; the bytes each micro-batch keeps
   for backward with and without checkpointing; once per world, gloo point-to-point
   latency and bandwidth and the contention factor (:mod:`merak_exec.profiling.machine`);
   and, before every round of blocks and
   pooled, the cost of posting sends and receives through the runtime
   (:class:`~merak_exec.profiling.post_probe.PostProbe`);
3. **runs for real**, interleaved with the profiles (profile, block of steps,
   profile, ..., profile; ``blocks`` blocks, the first after ``warmup_steps``
   untimed iterations, the others after one): ``steps`` timed training iterations of
   the schedule, a barrier before each, keeping every timed iteration's events on a
   clock common to all ranks (each rank's iteration origin is ``perf_counter``, the
   system-wide monotonic clock on Linux, so the origins can be aligned; on CUDA the
   recorder times with events and one process is assumed). The profiles are
   averaged (the fastest sample kept for ``*_min_s``), so a drift of the machine's
   load affects profile and run alike, and each is kept as well, with the block each
   timed iteration ran in, so every block can be validated against the two profiles
   bracketing it (:func:`merak_sim.validation.compare.block_errors`); and the cases take
   turns block by block (round-robin), so it affects every case alike too (the
   speed-up of one case over another is measured side by side);
4. **measures memory** in one more, untimed iteration: the live bytes of tensors
   autograd saved for backward, of inputs kept by checkpointed layers and of stage
   inputs kept by F* (:class:`~merak_exec.profiling.saved_tensors.SavedTensorTracker`),
   whose peak per rank is the measured activation memory; and the bytes of
   parameters, gradients and optimizer state.

Rank 0 writes the run directory (:mod:`merak_sim.validation.rundir`), which the torch-free
comparison (:mod:`merak_sim.validation`) reads.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from merak_exec.launch import STORE_PORT, run_ranks
from merak_exec.mesh import init_distributed, loopback_env
from merak_exec.models import GPT, GPTConfig
from merak_exec.parallel import parallelize
from merak_exec.profiling.cases import Case, MeasureError, token_batches
from merak_exec.profiling.clock import sync
from merak_exec.profiling.machine import measure_machine
from merak_exec.profiling.post_probe import PostProbe
from merak_exec.profiling.saved_tensors import SavedTensorTracker
from merak_exec.profiling.stage_profile import profile_stage
from merak_sim.config import ParallelConfig
from merak_sim.io import atomic_write_text
from merak_sim.validation.profile import combine_profiles
from merak_sim.validation.rundir import write_measured

__all__ = ["DEFAULT_OPTS", "measure_cases"]


class _CaseRun:
    """One configuration's measurement on this rank: its model, data and what has been
    measured so far. The worker drives every case's :meth:`profile` and :meth:`block`
    round-robin (see :func:`measure_cases`), then :meth:`finish` each."""

    def __init__(self, case: Case, rank: int, world: int, opts: dict) -> None:
        pc = ParallelConfig.from_dict(case.config)
        if pc.world_size != world:
            raise MeasureError(f"case {case.name}: dp*tp*pp = {pc.world_size} but the world "
                               f"has {world} processes")
        self.case, self.rank, self.world, self.opts, self.pc = case, rank, world, opts, pc
        mcfg = GPTConfig(**case.model)
        self.seq = mcfg.n_positions
        torch.manual_seed(0)
        self.pm = parallelize(GPT(mcfg), pc, seq_len=self.seq)
        steps, blocks = int(opts["steps"]), max(1, int(opts["blocks"]))
        self.data = token_batches(case.model, pc.global_batch_size,
                                  steps + int(opts["warmup_steps"]) + blocks + 1)
        self.next = 1  # data[0] feeds the profiler, data[-1] the memory iteration
        ids0, lab0 = self.data[0]
        self.inputs, self.labels = self.pm.split_batch(ids0), self.pm.split_batch(lab0)
        self.rows: list[dict] = []
        self.wall: list[float] = []
        self.origins: list[float] = []
        self.losses: list[float] = []
        self.profiles: list[dict] = []
        self.step_block: list[int] = []  # per timed iteration: the block it ran in
        self.cpu: list[float] = []  # per timed iteration: this rank's thread CPU seconds

    def profile(self) -> None:
        """One profiler step (every rank at once)."""
        dist.barrier()
        self.profiles.append(profile_stage(self.pm, self.inputs, self.labels,
                                           self.opts["warmup"], self.opts["repeats"]))
        dist.barrier()

    def block(self, timed: int, warm: int) -> None:
        """``warm`` untimed then ``timed`` timed training iterations, a barrier before
        each; timed iterations keep their events on the rank's iteration origin."""
        rt = self.pm.runtime
        for i in range(warm + timed):
            ids, lab = self.data[min(self.next, len(self.data) - 2)]
            self.next += 1
            sync()
            dist.barrier()
            t, c = time.perf_counter(), time.thread_time()
            out = self.pm.train_step(ids, lab)
            sync()
            d, cpu = time.perf_counter() - t, time.thread_time() - c
            if i >= warm:
                k = len(self.wall)
                self.wall.append(d)
                self.cpu.append(cpu)
                self.origins.append(rt.recorder.origin_s)
                self.losses.append(out.loss)
                # block b runs between profiles b and b+1 (profile() precedes each block)
                self.step_block.append(len(self.profiles) - 1)
                self.rows += [dict(e, step=k) for e in out.events]

    def _memory(self) -> dict:
        """Activation peak of one untimed iteration and the static bytes."""
        pm = self.pm
        params = list(pm.parameters())
        ids, lab = self.data[-1]
        with SavedTensorTracker(params, pm.runtime) as tr:
            pm.train_step(ids, lab)
            act_peak = tr.peak_bytes
        opt = pm.runtime.optimizer
        return {"activation_peak_bytes": act_peak,
                "param_bytes": sum(p.numel() * p.element_size() for p in params),
                "grad_bytes": sum(p.numel() * p.element_size() for p in params),
                "optimizer_bytes": sum(v.numel() * v.element_size()
                                       for s in opt.state.values() for v in s.values()
                                       if hasattr(v, "numel") and v.dim() > 0)}

    def finish(self) -> dict:
        """Measure memory in one untimed iteration and gather every rank's figures."""
        pm = self.pm
        dist.barrier()
        mem = self._memory()
        mine = {"rank": self.rank, "pp_rank": pm.mesh.pp_rank, "dp_rank": pm.mesh.dp_rank,
                "tp_rank": pm.mesh.tp_rank, "profile": combine_profiles(self.profiles),
                "profile_samples": self.profiles, "step_block": self.step_block,
                "cpu_s": self.cpu,
                "events": self.rows, "wall_s": self.wall, "origins": self.origins,
                "losses": self.losses, "memory": mem}
        allv: list = [None] * self.world
        dist.all_gather_object(allv, mine)
        self.pm = None
        return {"ranks": allv, "config": self.pc.to_dict(), "model": self.case.model,
                "seq_len": self.seq}


def _measure_all(rank: int, world: int, cases: list, out_dir: str, opts: dict,
                 status: dict) -> None:
    """Machine parameters, then every case round-robin, block by block: each case's
    profiles and timed iterations are spread over the whole measurement, so a slow
    spell of the shared machine falls on every case (and on profile and run) alike."""
    sizes = opts["p2p_sizes"]
    machine = measure_machine(rank, world, sizes, opts["warmup"], max(5, opts["repeats"]))
    machine["p2p_post_lockstep_s"] = machine.get("p2p_post_s", 0.0)
    probe = PostProbe(rank, world)
    runs = [_CaseRun(Case(**c), rank, world, opts) for c in cases]
    steps, warm = int(opts["steps"]), int(opts["warmup_steps"])
    per = -(-steps // max(1, int(opts["blocks"])))
    for b, first in enumerate(range(0, steps, per)):
        probe.run()
        for r in runs:
            r.profile()
            r.block(min(per, steps - first), warm if b == 0 else min(1, warm))
    probe.run()
    machine.update(probe.figures())
    for r in runs:
        r.profile()
        res = r.finish()
        if rank == 0:
            write_measured(Path(out_dir) / r.case.name, res, machine, opts)
        status["done"].append(r.case.name)


def _worker(rank: int, world: int, port: int, cases: list, out_dir: str, opts: dict) -> None:
    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", str(opts.get("timeout_s", 120)))
    status: dict = {"rank": rank, "done": [], "error": None}
    try:
        init_distributed(backend=opts.get("backend", "gloo"))
        _measure_all(rank, world, cases, out_dir, opts, status)
    except Exception:  # reported through the status file, judged by the parent
        status["error"] = traceback.format_exc()
    atomic_write_text(os.path.join(out_dir, f".status-rank{rank}.json"), json.dumps(status))
    os._exit(0)  # skip gloo teardown (known exit-time aborts); results are written


DEFAULT_OPTS = {"steps": 12, "blocks": 3, "warmup_steps": 2, "warmup": 2, "repeats": 9,
                "p2p_sizes": [4096, 65536, 262144, 1048576], "timeout_s": 120,
                "backend": "gloo"}


def measure_cases(cases: list[Case], out_dir: str | Path, *, world: int = 2,
                  timeout_s: float = 1800, **opts) -> list[Path]:
    """Profile and run every case on a fresh gloo world of ``world`` processes; return
    the run directories (``out_dir/<case.name>``). Raises :class:`MeasureError` with
    the failing rank's last line if a rank fails, or when ``timeout_s`` passes."""
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
    codes = run_ranks(_worker, world, (world, STORE_PORT, payload, str(out), o),
                      timeout_s=timeout_s)
    if None in codes:
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
