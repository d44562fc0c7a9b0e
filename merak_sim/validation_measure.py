"""The measuring half of the validation loop: profile, run for real, write a run directory.

For each configuration, on one gloo world of ``world`` processes (one torch thread
each), every rank:

1. builds the built-in GPT and :func:`merak_exec.parallel.parallelize` s it;
2. **profiles** (the "profiler step", :mod:`merak_sim.validation_profile`): times
   each action kind of its own stage
   through the runtime's own action methods (so the runtime's Python glue per action
   is in the figure, not a fudge factor) while every other rank does the same at the
   same moment (so the contention of 2 processes on 2 cores is in the figure too):
   F (with the stage's checkpoint fraction), F with nothing checkpointed, F*, R, B
   after each F, I and W (on cleared gradients; and, in pairs, the extra time of B and
   W adding into existing gradients, as every backward of a step but the first does),
   the all-reduce (tied embedding / data parallel) and the
   optimizer step, the median of ``repeats`` after ``warmup``; the bytes each
   micro-batch keeps for backward (saved-tensor hooks) with and without
   checkpointing; once per world, gloo point-to-point latency and bandwidth (timed
   one-way transfers over several sizes, least-squares fit) and the contention factor
   (a fixed matmul loop timed alone versus on every rank at once); and, before every
   round of blocks and pooled, the cost of posting sends and receives through the
   runtime (a fixed 2-stage 1F1B probe, its postings split into plain ones and
   receives met by a pending send of a computing peer, :class:`_PostProbe`);
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
   bracketing it (:func:`merak_sim.validation.block_errors`); and the cases take
   turns block by block (round-robin), so it affects every case alike too (the
   speed-up of one case over another is measured side by side);
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
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from merak_sim.rundir import combine_profiles
from merak_sim.validation_model import POST_BLOCK_WINDOW_S
from merak_sim.validation_profile import Tracker, measure_machine, profile_stage, sync

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


_PROBE_CONFIG = dict(pp=2, schedule="1f1b", recompute="none", micro_batch_size=2,
                     global_batch_size=8, dtype="fp32")


def _busy_spans(events: list[dict], origin: float) -> list[tuple[float, float]]:
    """Compute intervals of one rank's iteration on the absolute clock: each compute
    action from the end of the receive it consumed (if it waited) to its end."""
    recv_end = {(e["kind"], e["microbatch"]): e["end_s"] for e in events
                if e["stream"] == "p2p" and e["kind"].startswith("RECV")}
    out = []
    for e in events:
        if e["stream"] != "compute":
            continue
        start = e["start_s"]
        for k in ("RECV_ACT", "RECV_GRAD"):
            r = recv_end.get((k, e["microbatch"]))
            if e["kind"] in ("FORWARD", "BACKWARD") and r is not None \
                    and e["start_s"] <= r <= e["end_s"]:
                start = max(start, r)
        out.append((origin + start, origin + e["end_s"]))
    return out


def classify_posts(records: list[dict], spans: dict, window_s: float) -> dict:
    """Split timed posts into plain ones and receives posted against a pending send of
    a peer that computes within ``window_s`` of the post (the condition
    :func:`merak_sim.validation_model._refine` prices as blocked). ``records``: per
    post ``{"rank", "iter", "t0", "t1", "parts": [(kind, stage, microbatch)]}`` on one
    clock; ``spans``: ``{(rank, iter): [(start, end)]}`` compute intervals. Returns
    ``{"blocked": [(seconds, operations)], "plain": [(seconds, operations)]}``, one
    entry per posting (a fused posting holds several operations)."""
    sent = {}
    for r in records:
        for kind, stage, mb in r["parts"]:
            if kind.startswith("SEND"):
                sent[(r["iter"], kind, stage, mb)] = (r["rank"], r["t0"])
    out: dict[str, list[tuple[float, int]]] = {"blocked": [], "plain": []}
    for r in records:
        hit = False
        for kind, stage, mb in r["parts"]:
            if not kind.startswith("RECV"):
                continue
            src = (r["iter"], "SEND_ACT", stage - 1, mb) if kind == "RECV_ACT" else \
                (r["iter"], "SEND_GRAD", stage + 1, mb)
            if src not in sent:
                continue
            peer, t_send = sent[src]
            if t_send <= r["t0"] and any(s0 < r["t0"] + window_s and e0 > r["t0"]
                                         for s0, e0 in spans.get((peer, r["iter"]), ())):
                hit = True
        out["blocked" if hit else "plain"].append((r["t1"] - r["t0"], len(r["parts"])))
    return out


class _PostProbe:
    """Post costs measured through the runtime itself: a fixed 2-stage 1F1B pipeline of
    the suite's small GPT (not any case being validated) runs 2 + ``iterations``
    iterations per :meth:`run` with every posting timed, and :func:`classify_posts`
    splits the postings of the last ``iterations``. A synthetic probe (one ``irecv``
    against a pending ``isend`` while the peer runs a matmul loop) blocked in 0-90 % of
    tries from one minute to the next on the development machine, while the runtime's
    last stage met the block in most iterations: the figure has to come from the
    runtime's own posting pattern. It also drifts with the machine (0.43-2.98 ms per
    blocked receive from one suite to the next, and 0.43 ms at the start of a suite
    whose runs then took about 2 ms), so the worker runs the probe before every round
    of blocks and :meth:`figures` pools every run's postings. The window is the
    model's (:data:`merak_sim.validation_model.POST_BLOCK_WINDOW_S`). Does nothing
    where the world is not 2 ranks."""

    def __init__(self, rank: int, world: int, iterations: int = 8) -> None:
        self.rank, self.world, self.iterations, self.runs = rank, world, iterations, 0
        self.got: dict[str, list[tuple[float, int]]] = {"blocked": [], "plain": []}
        self.pm = None
        if world == 2:
            import torch

            from merak_exec.models import GPT, GPTConfig
            from merak_exec.parallel import parallelize
            from merak_sim.config import ParallelConfig

            model = small_gpt()
            torch.manual_seed(0)
            self.pm = parallelize(GPT(GPTConfig(**model)), ParallelConfig.from_dict(
                _PROBE_CONFIG), seq_len=model["n_positions"])
            self.data = _batches(model, _PROBE_CONFIG["global_batch_size"], iterations + 2)

    def run(self) -> None:
        """Time one round of the pipeline's postings (all ranks call it together)."""
        import torch.distributed as dist

        if self.pm is None:
            return
        rt = self.pm.runtime
        records: list[dict] = []
        spans: dict = {}
        box = {"iter": -1}
        post = rt._post

        def timed_post(parts, st):  # an instance attribute shadows the method
            t0 = time.perf_counter()
            post(parts, st)
            records.append({"rank": self.rank, "iter": box["iter"], "t0": t0,
                            "t1": time.perf_counter(),
                            "parts": [(p.kind.name, p.stage, p.microbatch) for p in parts]})
        rt._post = timed_post
        try:
            for i, (ids, lab) in enumerate(self.data):
                box["iter"] = i - 2
                dist.barrier()
                out = self.pm.train_step(ids, lab)
                if i >= 2:
                    spans[(self.rank, i - 2)] = _busy_spans(out.events, rt.recorder._t0)
        finally:
            del rt._post
        records = [r for r in records if r["iter"] >= 0]
        allv: list = [None] * self.world
        dist.all_gather_object(allv, (records, spans))
        recs = [r for rr, _ in allv for r in rr]
        sp = {k: v for _, ss in allv for k, v in ss.items()}
        got = classify_posts(recs, sp, POST_BLOCK_WINDOW_S)
        for k in self.got:
            self.got[k] += got[k]
        self.runs += 1

    def figures(self) -> dict:
        """The counts and, per operation, over every run so far: ``p2p_post_s`` (plain
        postings, through the runtime: it replaces the lockstep figure of
        :func:`~merak_sim.validation_profile.measure_machine`), ``p2p_post_blocked_s``
        (mean) and ``p2p_post_blocked_min_s``; {} where nothing ran."""
        if not self.runs:
            return {}
        got = self.got
        out: dict = {"p2p_post_probe": {"blocked": len(got["blocked"]),
                                        "plain": len(got["plain"]), "runs": self.runs}}
        if not got["plain"]:
            return out
        # The model charges every operation p2p_post_s and a blocked receive
        # p2p_post_blocked_s instead: per-operation figures from per-posting times.
        per_op = sum(t for t, _ in got["plain"]) / sum(n for _, n in got["plain"])
        out["p2p_post_s"] = per_op
        if got["blocked"]:
            blocked = [t - (n - 1) * per_op for t, n in got["blocked"]]
            out["p2p_post_blocked_s"] = statistics.fmean(blocked)
            out["p2p_post_blocked_min_s"] = min(blocked)
        return out


class _CaseRun:
    """One configuration's measurement on this rank: its model, data and what has been
    measured so far. The worker drives every case's :meth:`profile` and :meth:`block`
    round-robin (see :func:`measure_cases`), then :meth:`finish` each."""

    def __init__(self, case: Case, rank: int, world: int, opts: dict) -> None:
        import torch

        from merak_exec.models import GPT, GPTConfig
        from merak_exec.parallel import parallelize
        from merak_sim.config import ParallelConfig

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
        self.data = _batches(case.model, pc.global_batch_size,
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
        import torch.distributed as dist

        dist.barrier()
        self.profiles.append(profile_stage(self.pm, self.inputs, self.labels,
                                           self.opts["warmup"], self.opts["repeats"]))
        dist.barrier()

    def block(self, timed: int, warm: int) -> None:
        """``warm`` untimed then ``timed`` timed training iterations, a barrier before
        each; timed iterations keep their events on the rank's iteration origin."""
        import torch.distributed as dist

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
                self.origins.append(rt.recorder._t0)
                self.losses.append(out.loss)
                # block b runs between profiles b and b+1 (profile() precedes each block)
                self.step_block.append(len(self.profiles) - 1)
                self.rows += [dict(e, step=k) for e in out.events]

    def finish(self) -> dict:
        """Measure memory in one untimed iteration and gather every rank's figures."""
        import torch.distributed as dist

        pm = self.pm
        dist.barrier()
        params = list(pm.parameters())
        ids, lab = self.data[-1]
        with Tracker(params) as tr:
            pm.train_step(ids, lab)
            act_peak = tr.live.peak
        opt = pm.runtime.optimizer
        mem = {"activation_peak_bytes": act_peak,
               "param_bytes": sum(p.numel() * p.element_size() for p in params),
               "grad_bytes": sum(p.numel() * p.element_size() for p in params),
               "optimizer_bytes": sum(v.numel() * v.element_size()
                                      for s in opt.state.values() for v in s.values()
                                      if hasattr(v, "numel") and v.dim() > 0)}
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


def _worker(rank: int, world: int, port: int, cases: list, out_dir: str, opts: dict) -> None:
    from merak_exec.mesh import loopback_env

    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", str(opts.get("timeout_s", 120)))
    status: dict = {"rank": rank, "done": [], "error": None}
    try:
        from merak_exec.mesh import init_distributed

        init_distributed(backend=opts.get("backend", "gloo"))
        sizes = opts["p2p_sizes"]
        machine = measure_machine(rank, world, sizes, opts["warmup"], max(5, opts["repeats"]))
        machine["p2p_post_lockstep_s"] = machine.get("p2p_post_s", 0.0)
        probe = _PostProbe(rank, world)
        runs = [_CaseRun(Case(**c), rank, world, opts) for c in cases]
        # Round-robin over the cases, block by block: each case's profiles and timed
        # iterations are spread over the whole measurement, so a slow spell of the
        # shared machine falls on every case (and on profile and run) alike.
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
                from merak_sim.rundir import write_measured

                write_measured(Path(out_dir) / r.case.name, res, machine, opts)
            status["done"].append(r.case.name)
    except Exception:  # reported through the status file, judged by the parent
        status["error"] = traceback.format_exc()
    from merak_sim.io import atomic_write_text

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
