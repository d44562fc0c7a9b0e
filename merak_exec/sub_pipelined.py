"""Sub-pipelined tensor parallelism (Merak T3): a stage's micro-batch in k parts.

:class:`SubPipelined` splits a stage's micro-batch into k parts along the batch
dimension and every part runs with its own tp process group. The code path follows the device:

- CUDA: one Python thread; each part runs on its own side stream and its
  all-reduces are asynchronous work handles waited by the stream that consumes them
  (``work.wait()`` orders the stream, it does not block the host), so one part's
  all-reduce overlaps the next part's kernels; events join every part back into the
  caller's stream, and autograd runs each backward op on its forward op's stream, so
  the backward overlaps the same way.
- CPU (gloo): a collective's wait blocks the thread that issued it, so one thread
  cannot overlap anything; each part runs in its own worker thread instead (gloo
  and torch's kernels release the GIL), which measured faster than running the parts
  in turn (benchmarks/bench_exec_tp_overlap.py).

Each part's collectives are issued in program order on its own group, so ranks
never disagree on collective order; the result is the concatenation of the parts,
numerically the same as plain TP.

The tensor-parallel layers (:mod:`merak_exec.tensor_parallel`) ask
:func:`current_tp_group` for the running part's group and :func:`on_side_stream`
for how to wait for their all-reduces.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn

from merak_exec.mesh import ExecError

__all__ = ["SubPipelined", "current_tp_group", "on_side_stream", "running_part"]

_part = threading.local()  # the sub-pipelined part this thread runs: group, on_stream


def current_tp_group(default):
    """The tp group of the sub-pipelined part being run, else ``default``."""
    return getattr(_part, "group", None) or default


def on_side_stream() -> bool:
    """Whether the calling thread runs a sub-pipelined part on a CUDA side stream."""
    return getattr(_part, "on_stream", False)


@contextlib.contextmanager
def running_part(group, on_stream: bool):
    """Within the block, this thread runs the part of ``group`` (on a side stream or
    not)."""
    saved = (getattr(_part, "group", None), on_side_stream())
    _part.group, _part.on_stream = group, on_stream
    try:
        yield
    finally:
        _part.group, _part.on_stream = saved


class SubPipelined(nn.Module):
    """Run a stage's layers on k batch parts, one tp group per part: on CUDA in this
    thread, one side stream per part; on CPU one worker thread per part (see the
    module docstring).

    Args:
        groups: k tp process groups (same members, distinct communicators).
    """

    def __init__(self, groups: list) -> None:
        super().__init__()
        self.groups = groups
        self._streams: list = []

    def run(self, fn, x: torch.Tensor) -> torch.Tensor:
        """``fn`` applied to each of k batch parts; outputs concatenated."""
        k = len(self.groups)
        if x.shape[0] % k:
            raise ExecError(f"sub-pipelined TP splits the micro-batch into {k} parts: batch "
                            f"{x.shape[0]} is not divisible")
        parts = x.chunk(k, dim=0)
        run = self._run_on_streams if x.is_cuda else self._run_in_threads
        return torch.cat(run(fn, parts), dim=0)

    def _run_in_threads(self, fn, parts) -> list:
        """Each part in its own worker thread (the CPU path)."""
        outs: list = [None] * len(parts)
        errs: list = []
        grad = torch.is_grad_enabled()

        def work(i: int) -> None:
            try:
                with running_part(self.groups[i], on_stream=False), \
                        torch.set_grad_enabled(grad):
                    outs[i] = fn(parts[i])
            except BaseException as e:  # surfaced in the caller's thread below
                errs.append(e)

        threads = [threading.Thread(target=work, args=(i,), daemon=True)
                   for i in range(len(parts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errs:
            raise errs[0]
        return outs

    def _run_on_streams(self, fn, parts) -> list:
        """Each part on its own side stream, started after the caller's stream reached
        this point and joined back into it by an event at its end."""
        main = torch.cuda.current_stream(parts[0].device)
        while len(self._streams) < len(parts):
            self._streams.append(torch.cuda.Stream(device=parts[0].device))
        ready = torch.cuda.Event()
        ready.record(main)
        outs = []
        for group, part, stream in zip(self.groups, parts, self._streams, strict=True):
            stream.wait_event(ready)
            part.record_stream(stream)  # allocated on main, read on the side stream
            with torch.cuda.stream(stream), running_part(group, on_stream=True):
                out = fn(part)
            done = torch.cuda.Event()
            done.record(stream)
            main.wait_event(done)
            out.record_stream(main)
            outs.append(out)
        return outs
