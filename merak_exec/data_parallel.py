"""Data-parallel gradient averaging in buckets, overlapped with the last backwards.

What the simulator prices as ``overlap_dp`` with ``buckets`` (merak_sim's evaluator
and engine): each chunk's gradients are split into ``buckets`` buckets of about equal
size, in reverse parameter order (the order a backward produces them, as PyTorch DDP
and Megatron bucket); during the chunk's *last* backward of the iteration (B, or W
under zero-bubble schedules) a bucket's all-reduce starts as soon as its gradients
are accumulated, and the AR action only waits for what is still in flight. Buckets
start strictly in index order on every replica, so all dp ranks issue the same
collectives in the same order.

Readiness comes from ``register_post_accumulate_grad_hook``; gradients that are
assigned rather than accumulated (zero-bubble's local weight step) or never produced
(unused parameters) are flushed when that last backward ends, and anything not yet
started (an action run outside :meth:`PipelineRuntime.step`) starts in
:meth:`BucketedReducer.finish`.
"""

from __future__ import annotations

import datetime
import itertools

import torch
import torch.distributed as dist

from merak_exec.hooks import RuntimeHooks
from merak_exec.mesh import peer_failure, peers_text
from merak_sim.schedule.ir import Action, Kind, iter_actions

__all__ = ["BucketedReducer", "split_buckets"]


def split_buckets(params: list, buckets: int) -> list[list]:
    """``params`` (already in production order) cut into ``min(buckets, len(params))``
    contiguous non-empty groups, each cut where the running element count first
    reaches the next equal share."""
    n = len(params)
    k = min(buckets, n)
    cum = list(itertools.accumulate(p.numel() for p in params))
    cuts = [0]
    for j in range(1, k):
        c = cuts[-1] + 1  # one parameter at least here, and one per bucket still to come
        while c < n - (k - j) and cum[c - 1] < cum[-1] * j / k:
            c += 1
        cuts.append(c)
    cuts.append(n)
    return [params[cuts[j]:cuts[j + 1]] for j in range(k)]


class BucketedReducer(RuntimeHooks):
    """Averages gradients over ``mesh.dp_group`` bucket by bucket (see the module
    docstring). Register with the runtime (``add_hooks``) and give it as the runtime's
    ``grad_reducer``; :meth:`finish` is what AR calls.

    Attributes:
        overlapped: buckets of the last finished iteration that started before AR.
    """

    def __init__(self, chunks, program, mesh, buckets: int = 4) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.mesh = mesh
        self.timeout = datetime.timedelta(seconds=mesh.timeout_s)
        self.last: dict[int, Action] = {}
        for a in iter_actions(program):
            if a.kind in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT):
                self.last[a.chunk] = a
        order = sorted(self.last, key=lambda c: _position(program, self.last[c]))
        self.buckets: list[list] = []
        self.chunk_buckets: dict[int, list[int]] = {}
        self.bucket_of: dict[int, int] = {}
        for c in order:
            params = [p for p in chunks[c].parameters() if p.requires_grad][::-1]
            ids = []
            for b in split_buckets(params, buckets):
                ids.append(len(self.buckets))
                for p in b:
                    self.bucket_of[id(p)] = len(self.buckets)
                self.buckets.append(b)
            self.chunk_buckets[c] = ids
        for b in self.buckets:
            for p in b:
                p.register_post_accumulate_grad_hook(self._ready)
        self.armed: set[int] = set()
        self.launched_in_backward = 0
        self.overlapped = 0
        self._reset()

    def _reset(self) -> None:
        self.pending = [len(b) for b in self.buckets]
        self.seen: set[int] = set()
        self.works: list = []  # (bucket index, work, flat buffer), in launch order
        self.next = 0

    # -- hooks -------------------------------------------------------------------------
    def on_action_start(self, action: Action) -> None:
        """Arm the chunk's buckets when its last backward begins."""
        if self.last.get(action.chunk) == action:
            self.armed.update(self.chunk_buckets[action.chunk])

    def on_action_end(self, action: Action) -> None:
        """Start the rest of the chunk's buckets when its last backward ends."""
        if self.last.get(action.chunk) == action:
            for i in self.chunk_buckets[action.chunk]:
                self.pending[i] = 0
            self.armed.difference_update(self.chunk_buckets[action.chunk])
            self._launch_ready(in_backward=True)

    def _ready(self, p: torch.Tensor) -> None:
        i = self.bucket_of[id(p)]
        if i not in self.armed or id(p) in self.seen:
            return
        self.seen.add(id(p))
        self.pending[i] -= 1
        self._launch_ready(in_backward=True)

    # -- collectives -------------------------------------------------------------------
    def _launch_ready(self, in_backward: bool) -> None:
        while self.next < len(self.buckets) and self.pending[self.next] <= 0:
            self._launch(self.next)
            self.launched_in_backward += in_backward
            self.next += 1

    def _launch(self, i: int) -> None:
        grads = []
        for p in self.buckets[i]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.reshape(-1))
        flat = torch.cat(grads)
        try:  # inside a backward hook: a lost peer must still be one line
            work = dist.all_reduce(flat, group=self.mesh.dp_group, async_op=True)
        except RuntimeError as e:
            peers = [r for r in dist.get_process_group_ranks(self.mesh.dp_group)
                     if r != self.mesh.rank]
            raise peer_failure(f"starting data-parallel gradient bucket {i}", peers,
                               self.mesh.timeout_s, e) from None
        self.works.append((i, work, flat))

    def finish(self, wait) -> None:
        """Start what has not started, wait for every bucket (``wait(work, what)``
        bounds each wait) and write the averages back into the gradients."""
        for i in range(self.next, len(self.buckets)):
            self.pending[i] = 0
        self._launch_ready(in_backward=False)
        dp, peers = self.mesh.dp, peers_text(self.mesh.dp_group)
        for i, work, flat in self.works:
            wait(work, f"data-parallel gradient bucket {i} with {peers}")
            flat.div_(dp)
            off = 0
            for p in self.buckets[i]:
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
        self.overlapped, self.launched_in_backward = self.launched_in_backward, 0
        self._reset()


def _position(program, action: Action) -> int:
    for k, a in enumerate(iter_actions(program)):
        if a == action:
            return k
    return -1
