"""The cost of posting sends and receives, measured inside a running pipeline.

:class:`PostProbe` times every posting of a fixed 2-stage 1F1B pipeline through the
runtime's hooks; :func:`classify_posts` splits the postings into plain ones and
receives posted against a pending send of a computing peer (the case
:mod:`merak_sim.validation.pricing` prices as blocked).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from merak_exec.hooks import RuntimeHooks
from merak_exec.models import GPT, GPTConfig
from merak_exec.parallel import parallelize
from merak_exec.profiling.cases import small_gpt, token_batches
from merak_sim.config import ParallelConfig
from merak_sim.validation.pricing import POST_BLOCK_WINDOW_S

__all__ = ["PostProbe", "busy_spans", "classify_posts"]

_PROBE_CONFIG = dict(pp=2, schedule="1f1b", recompute="none", micro_batch_size=2,
                     global_batch_size=8, dtype="fp32")


def busy_spans(events: list[dict], origin: float) -> list[tuple[float, float]]:
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
    :mod:`merak_sim.validation.pricing` prices as blocked). ``records``: per
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


class _PostTimer(RuntimeHooks):
    """Runtime hooks stamping every posting of the iterations numbered >= 0."""

    def __init__(self, rank: int) -> None:
        self.rank, self.iter, self.t0 = rank, -1, 0.0
        self.records: list[dict] = []

    def on_post_start(self, parts) -> None:
        self.t0 = time.perf_counter()

    def on_post_end(self, parts) -> None:
        t1 = time.perf_counter()
        if self.iter >= 0:
            self.records.append({"rank": self.rank, "iter": self.iter, "t0": self.t0,
                                 "t1": t1, "parts": [(p.kind.name, p.stage, p.microbatch)
                                                     for p in parts]})


class PostProbe:
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
    model's (:data:`merak_sim.validation.pricing.POST_BLOCK_WINDOW_S`). Does nothing
    where the world is not 2 ranks."""

    def __init__(self, rank: int, world: int, iterations: int = 8) -> None:
        self.rank, self.world, self.iterations, self.runs = rank, world, iterations, 0
        self.got: dict[str, list[tuple[float, int]]] = {"blocked": [], "plain": []}
        self.pm = None
        if world == 2:
            model = small_gpt()
            torch.manual_seed(0)
            self.pm = parallelize(GPT(GPTConfig(**model)), ParallelConfig.from_dict(
                _PROBE_CONFIG), seq_len=model["n_positions"])
            self.data = token_batches(model, _PROBE_CONFIG["global_batch_size"],
                                      iterations + 2)

    def run(self) -> None:
        """Time one round of the pipeline's postings (all ranks call it together)."""
        if self.pm is None:
            return
        rt = self.pm.runtime
        timer = _PostTimer(self.rank)
        spans: dict = {}
        handle = rt.add_hooks(timer)
        try:
            for i, (ids, lab) in enumerate(self.data):
                timer.iter = i - 2
                dist.barrier()
                out = self.pm.train_step(ids, lab)
                if i >= 2:
                    spans[(self.rank, i - 2)] = busy_spans(out.events, rt.recorder.origin_s)
        finally:
            handle.remove()
        allv: list = [None] * self.world
        dist.all_gather_object(allv, (timer.records, spans))
        recs = [r for rr, _ in allv for r in rr]
        sp = {k: v for _, ss in allv for k, v in ss.items()}
        got = classify_posts(recs, sp, POST_BLOCK_WINDOW_S)
        for k in self.got:
            self.got[k] += got[k]
        self.runs += 1

    def figures(self) -> dict:
        """The counts and, per operation, over every run so far: ``p2p_post_s`` (plain
        postings, through the runtime: it replaces the lockstep figure of
        :func:`~merak_exec.profiling.machine.measure_machine`), ``p2p_post_blocked_s``
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
