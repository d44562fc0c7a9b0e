"""The runtime: interprets a :class:`merak_sim.schedule.ir.Schedule` on real ranks.

There is no second copy of any schedule here: each rank walks its program from the
schedule object and performs each action, obeying the semantics written down in
:mod:`merak_sim.schedule.ir`:

- sends and receives are *posted* when the program reaches them, and never block:
  every operation is one ``batch_isend_irecv`` on its channel's two-rank group, the
  rule :func:`merak_sim.schedule.posting.runtime_postings` states and
  :func:`merak_sim.schedule.validate.validate` proves safe on NCCL (both ends of every
  transfer post alike; one communicator, hence one stream, per channel);
- a compute action waits (with a timeout) only for the receive it consumes (the V
  placement's turn between two chunks of one rank passes tensors in memory);
- sends are awaited at the end of the iteration, before their buffers are dropped.

Actions: F (forward with the stage's checkpoint fraction), F* (forward under no-grad,
keeping only the stage input and the RNG state), R (re-forward from that input with
the RNG state restored, so dropout masks match), B (backward), I / W (zero-bubble:
input gradient, then weight gradient), AR (sum tied-embedding gradients across the
ranks holding the first and the last model stage, none under the V placement where
rank 0 holds both, then average every gradient over data parallel), OPT
(optimizer step). Matching tags come from :func:`merak_sim.schedule.lowering.comm_key`,
so both ends derive the same tag from the same schedule.

Every wait and collective is bounded by the mesh's timeout (MERAK_TIMEOUT_S): a lost
peer ends the rank with one :class:`~merak_exec.mesh.RankTimeoutError` line naming the
rank, the operation and the peer, also when posting a transfer fails (the peer's
connection is gone) and when a collective inside a compute action fails (tensor
parallel, or FSDP's all-gathers and reduce-scatters in its forward and backward
hooks). A loss that is not finite stops the run on every rank with one
:class:`~merak_exec.mesh.NonFiniteError` line naming the iteration, except under an
fp16 loss scaler, whose skipped steps decide (:mod:`merak_exec.optim`). The middle of
each training iteration's program is the fault point ``step@N``
(:func:`merak_exec.mesh.fault_point`). At construction the parameters that
tensor-parallel ranks hold replicated (norms, biases added after a row-parallel sum,
position tables) are made equal (tp rank 0's), since the ranks compute those parts
redundantly; a program with an action kind this runtime does not execute is refused.

Every action's start and end is recorded by a :class:`~merak_exec.result.Recorder`
(perf_counter on CPU, CUDA events on GPU) into the simulator's events schema.

Extension points (:meth:`PipelineRuntime.add_hooks`, :class:`merak_exec.hooks.RuntimeHooks`)
let profilers observe every action, posting and saved tensor; :meth:`PipelineRuntime.run_action`
performs one compute action on a :class:`~merak_exec.step_state.StepState`, so a stage
can be timed action by action through the code :meth:`PipelineRuntime.step` runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from merak_exec.fsdp import FsdpSync, local_tensor
from merak_exec.hooks import HookHandle, RuntimeHooks, register
from merak_exec.mesh import (
    ExecError,
    Mesh,
    NonFiniteError,
    RankTimeoutError,
    all_reduce_gradients,
    fault_point,
    is_comm_failure,
    peer_failure,
    timed_collective,
    wait_for,
)
from merak_exec.replicas import sync_tp_replicas
from merak_exec.result import Recorder
from merak_exec.stages import StageModule, trainable_parameters
from merak_exec.step_state import MicroBatchState, StepState
from merak_sim.schedule.evaluation import is_forward_only
from merak_sim.schedule.ir import Action, Fused, Kind, Schedule, iter_actions
from merak_sim.schedule.lowering import comm_key, peer_of
from merak_sim.schedule.posting import runtime_postings

__all__ = ["PipelineRuntime", "StepOutput"]

@dataclass
class StepOutput:
    """Result of one training iteration on this rank.

    Attributes:
        loss: mean loss over the iteration's micro-batches and dp replicas (same on
            every rank).
        losses: per-micro-batch losses of this pipeline (last stage; empty elsewhere).
        events: recorded action rows (dicts in the shared events schema).
    """

    loss: float
    losses: list[float] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


def _tag(key: tuple[str, int, int], num_model_stages: int) -> int:
    kind, g, mb = key
    return (mb * num_model_stages + g) * 2 + (1 if kind == "G" else 0)


class PipelineRuntime:
    """Executes one rank's program of ``schedule`` each :meth:`step`.

    Args:
        chunks: this rank's stage modules, indexed by chunk (virtual stage).
        schedule: lowered schedule; ``schedule.num_stages`` must equal ``mesh.pp``.
        mesh: process groups and coordinates.
        optimizer: stepped by OPT.
        boundary_specs: for every model stage g but the last, the (shape, dtype) of each
            tensor leaving it for one micro-batch (usually just the residual stream
            ``(mbs, seq, hidden)``; captured models may add broadcast values).
        tied_params: this rank's copies of tied parameters (summed over the tied group).
        record: keep per-action events.
        grad_sync: called by AR after the tied sum with the local parameters (sums of
            sequence-parallel partial gradients, ZeRO's reduce-scatter); it returns
            True when it also did the data-parallel reduction, else the flat dp
            all-reduce follows.
        grad_reducer: averages the gradients over dp at AR instead of one flat
            all-reduce (:class:`~merak_exec.data_parallel.BucketedReducer`).
    """

    def __init__(self, chunks: list[StageModule], schedule: Schedule, mesh: Mesh,
                 optimizer: torch.optim.Optimizer | None,
                 boundary_specs: dict[int, list[tuple[tuple[int, ...], torch.dtype]]],
                 tied_params: list[torch.nn.Parameter] | None = None,
                 record: bool = True, grad_sync=None, grad_reducer=None) -> None:
        self.chunks = chunks
        self.schedule = schedule
        self.mesh = mesh
        self.optimizer = optimizer
        self.boundary_specs = boundary_specs
        self.tied_params = tied_params or []
        self.grad_sync = grad_sync
        self.grad_reducer = grad_reducer
        self.program = schedule.programs[mesh.pp_rank]
        # an evaluation schedule (forwards only): F* on the last stage gives the loss
        self.evaluating = is_forward_only(schedule)
        self.recorder = Recorder(mesh, enabled=record)
        self.params = trainable_parameters(chunks)
        self.cuda = mesh.device.type == "cuda"
        self.hooks: list[RuntimeHooks] = []
        self._handlers = {
            Kind.FORWARD: self._forward, Kind.FORWARD_NOGRAD: self._forward_nograd,
            Kind.RECOMPUTE: self._recompute, Kind.BACKWARD: self._backward,
            Kind.BACKWARD_INPUT: self._backward_input,
            Kind.BACKWARD_WEIGHT: self._backward_weight, Kind.ALL_REDUCE: self._all_reduce,
            Kind.OPTIMIZER: self._optimizer_step,
        }
        for a in iter_actions(self.program):
            if not a.kind.is_comm and a.kind not in self._handlers:
                raise ExecError(f"rank {mesh.rank}: action {a} ({a.kind.name}) is not executed "
                                "by merak_exec; use a schedule of F, F*, R, B, I, W, AR, OPT")
        # Which group each posted operation travels on (the proven posting rule).
        self._postings: dict[int, list] = {}
        if schedule.lowered:
            for p in runtime_postings(schedule)[mesh.pp_rank]:
                self._postings.setdefault(p.step, []).append(p)
        self.iteration = 0  # iterations run by this runtime (the fault point's N)
        sync_tp_replicas(mesh, chunks)
        # Zero-bubble split (I then W): record the outputs of every module that owns
        # parameters during forwards, so I can return their gradients along with the
        # input gradient in one backward pass and W only runs each module's local
        # weight-gradient step (not a second full backward).
        self._capture: list | None = None
        self._zb = any(x.kind is Kind.BACKWARD_INPUT for x in iter_actions(self.program))
        self._shared: set[int] = set()
        if self._zb:
            seen: set[int] = set()
            for c in chunks:
                for m in c.modules():
                    own = list(m.parameters(recurse=False))
                    if own:
                        m.register_forward_hook(self._record_output)
                    for p in own:
                        # a parameter owned by two modules (tied embedding and head on
                        # one rank) also reaches the later module's output through its
                        # input: its gradient needs the full backward, not a local step
                        (self._shared if id(p) in seen else seen).add(id(p))

    # -- extension points --------------------------------------------------------------
    def add_hooks(self, hooks: RuntimeHooks) -> HookHandle:
        """Register ``hooks`` with the runtime and every chunk; the handle removes them."""
        handles = [register(self.hooks, hooks)] + [c.add_hooks(hooks) for c in self.chunks]

        def remove() -> None:
            for h in handles:
                h.remove()
        return HookHandle(remove)

    def run_action(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        """Perform compute or collective action ``a`` (F, F*, R, B, I, W, AR, OPT) on
        ``state``, as :meth:`step` does, but neither recorded nor announced to the
        action start/end hooks (the saved-tensor and F*-input hooks still apply).
        ``inputs`` and ``labels``: the iteration's micro-batches, where needed."""
        self._handlers[a.kind](a, state, inputs, labels)

    # -- helpers ---------------------------------------------------------------------
    def _peer_global(self, a: Action) -> int:
        return self.mesh.global_rank(peer_of(self.schedule, a))

    def _local_chunk(self, a: Action, kind: Kind) -> int | None:
        """This rank's chunk handing ``a`` its input (``RECV_ACT``) or output gradient
        (``RECV_GRAD``) in memory (the V placement's turn, IR rule 5), else None."""
        sched, g = self.schedule, self.schedule.model_stage(a)
        src = g - 1 if kind is Kind.RECV_ACT else g + 1
        ok = 0 <= src < sched.num_model_stages and sched.is_local(min(g, src))
        return sched.rank_of(src)[1] if ok else None

    def _wait(self, work, what: str) -> None:
        wait_for(work, what, self.mesh.timeout_s, self.mesh.rank)

    def _spec(self, a: Action) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of every tensor a receive gets: the activation tuple leaving
        model stage g-1, or the gradients of the floating entries of stage g's output."""
        g = self.schedule.model_stage(a)
        if a.kind is Kind.RECV_ACT:
            return self.boundary_specs[g - 1]
        return [sd for sd in self.boundary_specs[g] if sd[1].is_floating_point]

    def _post(self, index: int, state: StepState) -> None:
        """Post the sends/receives of program step ``index``: each operation one batch
        on its channel's group (see the module docstring). A boundary may carry several
        tensors (the residual stream and broadcast values): one P2P op each, tagged
        ``tag * 8 + i``, in the same batch."""
        G = self.schedule.num_model_stages
        for posting in self._postings[index]:
            self._post_batch(posting.ops, self.mesh.p2p_groups[posting.group], state, G)

    def _post_batch(self, parts: tuple[Action, ...], group, state: StepState, G: int) -> None:
        ops, recs = [], []
        for a in parts:
            key = comm_key(self.schedule, a)
            peer = self._peer_global(a)
            mb = state.microbatch(a.chunk, a.microbatch)
            if a.kind.is_send:
                ts = mb.act if a.kind is Kind.SEND_ACT else mb.gx
                if ts is None:
                    raise RuntimeError(f"{a} on rank {self.mesh.rank}: nothing to send yet")
                ts = tuple(t.contiguous() for t in ts)
                fn = dist.isend
            else:
                ts = tuple(torch.empty(shape, dtype=dt, device=self.mesh.device)
                           for shape, dt in self._spec(a))
                fn = dist.irecv
            for i, t in enumerate(ts):
                ops.append(dist.P2POp(fn, t, peer, group=group, tag=_tag(key, G) * 8 + i))
            recs.append((a, ts, len(ts)))
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as e:  # the peer's connection is already gone
            if not is_comm_failure(e):
                raise
            peer = self._peer_global(parts[0])
            raise peer_failure(f"posting {' '.join(map(str, parts))} on the pipeline channel",
                               [peer], self.mesh.timeout_s, e) from None
        if len(works) != len(ops):  # backends that coalesce return one handle
            works = [works[-1]] * len(ops)
        i = 0
        for a, ts, n in recs:
            ws = works[i:i + n]
            i += n
            ev = self.recorder.comm_posted(a, sum(t.numel() * t.element_size() for t in ts))
            if a.kind.is_send:
                state.sends.append((a, ws, ev))
            else:
                state.recvs[(a.chunk, a.microbatch, a.kind)] = (ws, ts, ev)

    def _take_recv(self, a: Action, kind: Kind, state: StepState) -> tuple[torch.Tensor, ...]:
        ws, ts, ev = state.recvs.pop((a.chunk, a.microbatch, kind))
        what = (f"{'activation' if kind is Kind.RECV_ACT else 'gradient'} of micro-batch "
                f"{a.microbatch} (chunk {a.chunk}) from rank "
                f"{self._peer_global(Action(kind, a.stage, a.microbatch, a.chunk))}")
        for w in ws:
            self._wait(w, what)
        self.recorder.comm_done(ev)
        return ts

    # -- actions ---------------------------------------------------------------------
    def _input(self, a: Action, state: StepState, inputs) -> tuple[torch.Tensor, ...]:
        chunk = self.chunks[a.chunk]
        if chunk.is_first:
            return (inputs[a.microbatch].to(self.mesh.device, non_blocking=True),)
        local = self._local_chunk(a, Kind.RECV_ACT)
        if local is not None:  # the V's turn: chunk 0's output is chunk 1's input
            prev = state.microbatches[(local, a.microbatch)]
            xs, prev.act = prev.act, None
        else:
            xs = self._take_recv(a, Kind.RECV_ACT, state)
        return tuple(x.requires_grad_() if x.is_floating_point() else x for x in xs)

    def _finish_forward(self, a: Action, state: StepState, mb: MicroBatchState, out,
                        labels) -> None:
        chunk = self.chunks[a.chunk]
        if chunk.is_last:
            loss = chunk.loss_fn(out[0], labels[a.microbatch].to(self.mesh.device))
            state.losses[a.microbatch] = loss.detach()
            mb.out = (loss / self.schedule.num_microbatches,)
        else:
            mb.out = out
            mb.act = tuple(t.detach() for t in out)

    def _forward(self, a: Action, state: StepState, inputs, labels) -> None:
        mb = state.microbatch(a.chunk, a.microbatch)
        mb.x = self._input(a, state, inputs)
        self._capture = [] if self._zb else None
        out = self.chunks[a.chunk](*mb.x)
        mb.modouts, self._capture = self._capture, None
        self._finish_forward(a, state, mb, out, labels)

    def _forward_nograd(self, a: Action, state: StepState, inputs, labels) -> None:
        mb = state.microbatch(a.chunk, a.microbatch)
        mb.x = self._input(a, state, inputs)
        mb.rng = (torch.get_rng_state(),
                  torch.cuda.get_rng_state(self.mesh.device) if self.cuda else None)
        chunk = self.chunks[a.chunk]
        with torch.no_grad():
            out = chunk(*mb.x, use_checkpoint=False)
            if chunk.is_last and self.evaluating:  # an evaluation schedule's loss
                labels_mb = labels[a.microbatch].to(self.mesh.device)
                state.losses[a.microbatch] = chunk.loss_fn(out[0], labels_mb).detach()
        if not chunk.is_last:
            mb.act = tuple(t.detach() for t in out)
        for h in self.hooks:
            h.on_nograd_input(a, mb.x)

    def _recompute(self, a: Action, state: StepState, inputs, labels) -> None:
        mb = state.microbatches[(a.chunk, a.microbatch)]
        if mb.rng is None:
            raise RuntimeError(f"{a}: no F* ran for micro-batch {a.microbatch}")
        devices = [self.mesh.device] if self.cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(mb.rng[0])
            if self.cuda:
                torch.cuda.set_rng_state(mb.rng[1], self.mesh.device)
            self._capture = [] if self._zb else None
            out = self.chunks[a.chunk](*mb.x, use_checkpoint=False)
            mb.modouts, self._capture = self._capture, None
        self._finish_forward(a, state, mb, out, labels)
        mb.act = None  # already sent by F*

    def _grad_pairs(self, a: Action, state: StepState, mb: MicroBatchState
                    ) -> tuple[list, list | None]:
        """(outputs, their incoming gradients) to differentiate: the loss on the last
        stage, else the floating outputs that require grad."""
        if self.chunks[a.chunk].is_last:
            return list(mb.out), None
        if mb.gout is None:
            local = self._local_chunk(a, Kind.RECV_GRAD)
            if local is not None:
                nxt = state.microbatches[(local, a.microbatch)]
                mb.gout, nxt.gx = nxt.gx, None
            else:
                mb.gout = self._take_recv(a, Kind.RECV_GRAD, state)
        floats = [t for t in mb.out if t.is_floating_point()]
        pairs = [(t, g) for t, g in zip(floats, mb.gout, strict=True) if t.requires_grad]
        return [t for t, _ in pairs], [g for _, g in pairs]

    def _input_grads(self, mb: MicroBatchState, grads) -> tuple[torch.Tensor, ...]:
        """Gradients to send upstream: one per floating input (zeros where unused)."""
        return tuple(g if g is not None else torch.zeros_like(x)
                     for x, g in zip(mb.x, grads, strict=True) if x.is_floating_point())

    def _backward(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        mb = state.microbatches[(a.chunk, a.microbatch)]
        if mb.out is None:
            raise RuntimeError(f"{a} on rank {self.mesh.rank}: no forward graph (F* without R?)")
        outs, grads = self._grad_pairs(a, state, mb)
        if outs:
            torch.autograd.backward(outs, grads)
        if not self.chunks[a.chunk].is_first:
            mb.gx = self._input_grads(mb, [x.grad if x.is_floating_point() else None
                                           for x in mb.x])
        mb.out = mb.x = mb.gout = None

    def _split_ok(self, a: Action, mb: MicroBatchState) -> bool:
        """The fast I/W split applies when every parameter-owning module of the stage
        produced one tensor output in this micro-batch's forward and nothing was
        checkpointed (a checkpointed layer's tensors are rebuilt inside I)."""
        chunk = self.chunks[a.chunk]
        return bool(mb.modouts) and chunk.recompute_layers == 0 and chunk.subpipe is None \
            and all(isinstance(o, torch.Tensor) for _, o in mb.modouts)

    def _backward_input(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        mb = state.microbatches[(a.chunk, a.microbatch)]
        outs, grads = self._grad_pairs(a, state, mb)
        first = self.chunks[a.chunk].is_first
        xs = [] if first else [x for x in mb.x if x.is_floating_point()]
        mods = ([(m, o) for m, o in mb.modouts if o.requires_grad]
                if self._split_ok(a, mb) else [])
        wanted = xs + [o for _, o in mods]
        gs = (torch.autograd.grad(outs, wanted, grads, retain_graph=True, allow_unused=True)
              if outs and wanted else [None] * len(wanted))
        mb.mod_grads = [(m, o, g) for (m, o), g in zip(mods, gs[len(xs):], strict=True)
                        if g is not None] if mods else None
        if not first:
            it = iter(gs[:len(xs)])
            mb.gx = self._input_grads(mb, [next(it) if x.is_floating_point() else None
                                           for x in mb.x])

    def _backward_weight(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        mb = state.microbatches[(a.chunk, a.microbatch)]
        params = [p for p in self.chunks[a.chunk].parameters() if p.requires_grad]
        if mb.mod_grads is not None:
            # each module's local weight-gradient step from its output gradient
            for m, o, g in mb.mod_grads:
                ps = [p for p in m.parameters(recurse=False)
                      if p.requires_grad and id(p) not in self._shared]
                if not ps:
                    continue
                for p, gp in zip(ps, torch.autograd.grad(o, ps, g, retain_graph=True,
                                                          allow_unused=True), strict=True):
                    if gp is not None:
                        p.grad = gp if p.grad is None else p.grad + gp
            shared = [p for p in params if id(p) in self._shared]
            if shared:
                outs, grads = self._grad_pairs(a, state, mb)
                torch.autograd.backward(outs, grads, inputs=shared)
        else:
            outs, grads = self._grad_pairs(a, state, mb)
            if outs and params:
                torch.autograd.backward(outs, grads, inputs=params)
        mb.out = mb.x = mb.gout = mb.modouts = mb.mod_grads = None

    def _drain_sends(self, state: StepState) -> None:
        for sa, ws, sev in state.sends:
            for w in ws:
                self._wait(w, f"send {sa} to rank {self._peer_global(sa)} to complete")
            self.recorder.comm_done(sev)
        state.sends = []

    def _all_reduce(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        self._drain_sends(state)
        self._all_reduce_grads()

    def _optimizer_step(self, a: Action, state: StepState, inputs=None, labels=None) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def _record_output(self, module, args, output) -> None:
        if self._capture is not None and torch.is_grad_enabled():
            self._capture.append((module, output))

    def _all_reduce_grads(self) -> None:
        """Tied-parameter sum over the tied group, then mean over dp (one flat buffer);
        with a grad reducer, its (bucketed, mostly finished) dp mean comes first."""
        m = self.mesh
        if self.grad_reducer is not None and m.dp_group is not None:
            self.grad_reducer.finish(self._wait)
        if m.tied_group is not None and self.tied_params:
            for p in self.tied_params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                timed_collective(dist.all_reduce, local_tensor(p.grad), group=m.tied_group,
                                 what="the tied-embedding gradient all-reduce",
                                 timeout_s=m.timeout_s)
        if self.grad_sync is not None and self.grad_sync(self.params):
            return
        if m.dp_group is None or self.grad_reducer is not None:
            return
        all_reduce_gradients(self.params, m.dp_group, "the data-parallel gradient all-reduce",
                             mean_over=m.dp, timeout_s=m.timeout_s)

    # -- the iteration ---------------------------------------------------------------
    def step(self, inputs: list[torch.Tensor] | None, labels: list[torch.Tensor] | None
             ) -> StepOutput:
        """Run this rank's program once over M micro-batches.

        ``inputs`` (needed where chunk 0 is model stage 0) and ``labels`` (needed on the
        rank holding the last model stage) are lists of M micro-batch tensors.
        """
        state = StepState()
        rec, hooks = self.recorder, self.hooks
        rec.start_step()
        self.iteration += 1
        middle = len(self.program) // 2 if not self.evaluating else -1
        for index, step in enumerate(self.program):
            if index == middle:
                fault_point(f"step@{self.iteration}")
            if isinstance(step, Fused) or step.kind.is_comm:
                for h in hooks:
                    h.on_post_start(step.parts)
                self._post(index, state)
                for h in hooks:
                    h.on_post_end(step.parts)
                continue
            for h in hooks:
                h.on_action_start(step)
            ev = rec.begin(step)
            try:
                self._handlers[step.kind](step, state, inputs, labels)
            except RuntimeError as e:  # a tp or FSDP collective inside the action
                if not is_comm_failure(e):
                    raise
                raise self._lost(step, e) from None
            rec.end(ev)
            for h in hooks:
                h.on_action_end(step)
        self._drain_sends(state)  # programs without AR still drain their sends
        loss = self._reduce_loss(state)
        if not self.evaluating:  # an evaluation reports its loss, whatever it is
            self._check_finite(loss)
        losses = state.losses
        return StepOutput(loss=loss, losses=[losses[m].item() for m in sorted(losses)],
                          events=rec.finish_step())

    def _lost(self, a: Action, e: BaseException) -> RankTimeoutError:
        """The one-line error of a collective that failed inside compute action ``a``:
        its peers are those of the groups such a collective runs on (tensor parallel,
        and data parallel under FSDP, whose hooks gather and reduce-scatter there)."""
        m = self.mesh
        fsdp = m.dp_group if isinstance(self.grad_sync, FsdpSync) else None
        named = [(n, g) for n, g in (("tensor-parallel", m.tp_group), ("FSDP", fsdp))
                 if g is not None]
        peers = sorted({r for _, g in named for r in dist.get_process_group_ranks(g)} - {m.rank})
        kinds = f" ({' and '.join(n for n, _ in named)})" if named else ""
        return peer_failure(f"a collective of {a}{kinds}", peers or None, m.timeout_s, e)

    def _check_finite(self, loss: float) -> None:
        """Stop on a loss that is not finite (every rank has the same value, so every
        rank stops at the same iteration); an fp16 loss scaler decides instead."""
        if math.isfinite(loss) or getattr(self.optimizer, "scaler", None) is not None:
            return
        step = getattr(self.optimizer, "iteration", self.iteration)
        raise NonFiniteError(f"merak_exec: training diverged at step {step}: the loss is "
                             f"{loss}; lower the learning rate or check the inputs")

    def _reduce_loss(self, state: StepState) -> float:
        """Mean loss of the iteration, made known to every rank (one small all-reduce)."""
        M = self.schedule.num_microbatches
        total = torch.zeros((), dtype=torch.float64, device=self.mesh.device)
        if state.losses:
            total += sum(v.double() for v in state.losses.values()) / M
        m = self.mesh
        if m.pp_group is not None:
            timed_collective(dist.all_reduce, total, group=m.pp_group,
                             what="the loss all-reduce over the pipeline", timeout_s=m.timeout_s)
        if m.dp_group is not None:
            timed_collective(dist.all_reduce, total, group=m.dp_group,
                             what="the loss all-reduce over data parallel",
                             timeout_s=m.timeout_s)
            total /= m.dp
        return float(total.item())
