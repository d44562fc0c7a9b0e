"""Bytes PyTorch's CUDA caching allocator reserves beyond the tensors a training step
keeps alive at its peak (what ``torch.cuda.max_memory_reserved`` sees and a model of
the live tensors does not).

Each term is a documented behaviour of PyTorch or of a library it calls, priced from
the run's shapes; nothing here is fitted. Block rounding is left out: with
``expandable_segments:True`` (torchtitan's launch script sets it) a stream's segment
grows in 2 MiB pages, well under 0.1 % of these peaks.

- Per-stream pools: the allocator hands a freed block only to later requests on the
  stream the block was allocated on (PyTorch's CUDA semantics notes, "memory
  management"; the caching allocator keys its free blocks by stream). FSDP2 allocates
  each unit's all-gather buffer (the gathered 16-bit, or with FSDP's float8 all-gather
  8-bit, weights of the unit) on its own all-gather copy-in stream and keeps two in
  flight (the unit being copied out and the prefetched next one), so that stream's pool
  holds the two largest units' gathered bytes for the whole step
  (:func:`fsdp_stream_pool_bytes`; the default stream's copies of the unsharded
  weights are the cost model's, :func:`merak_sim.costs.sharded_dp.fsdp_working_bytes`).
  The same rule explains why the ZeRO 3 state the cost model counts (16 bytes per
  parameter / g) is what FSDP2 reserves at the loss's peak although its gradients are
  freed by then: its sharded gradients are views of the reduce-scatter outputs, which
  it allocates on its reduce-scatter stream, so after ``zero_grad`` their 4 bytes per
  parameter / g stay reserved in that stream's pool beside the fp32 sharded weights
  and Adam's moments (12 / g); no term is added for them.
- cuBLAS workspace: PyTorch allocates one workspace per cuBLAS handle and stream
  through the caching allocator; its default size (``CUBLAS_WORKSPACE_CONFIG`` unset)
  is 4096 KiB x 8 = 32 MiB on Hopper (sm90) and 4096 KiB x 2 + 16 KiB x 8 elsewhere
  (:func:`cublas_workspace_bytes`; one stream runs the matmuls).
- Pipeline buffers: ``torch.distributed.pipelining`` allocates, when a stage first
  runs, one activation receive buffer per micro-batch (stages after the first) and one
  gradient receive buffer per micro-batch (stages before the last), each the size of
  the tensor crossing the stage boundary, and keeps them between steps; it also keeps
  each in-flight micro-batch's stage output for that micro-batch's backward (its
  forward cache). The receive buffer of an in-flight micro-batch is the stage input
  the stash already holds, so it is not counted twice
  (:func:`pipeline_buffer_bytes`). On the last stage it also appends every
  micro-batch's model output to ``output_chunks``, which the schedule's ``step``
  merges and returns when all micro-batches are done (its releases before the
  ``return_outputs`` switch of 2025): the output, the logits (torchtitan's 2024 model
  returns them cast to fp32), stays alive after its backward, so at the last
  micro-batch's backward the M - 1 earlier ones are held beside the stash
  (:func:`output_chunks_bytes`).
- The freed logits: an eager cross entropy on fp32 logits frees the 16-bit logits and
  their fp32 copy at the end of forward; the loss backward then asks for fp32
  vocabulary-sized blocks, which the hole the two leave (2V + 4V bytes per token, V the
  vocabulary per tensor-parallel rank) serves once (4V), leaving the 16-bit logits'
  2V per token reserved and unused at the loss backward's peak,
  since the allocator never moves live blocks (:func:`freed_logits_bytes`). A fused
  loss (16-bit logits, one 16-bit gradient) leaves none.

Which terms apply depends on the software stack (:class:`AllocatorStack`);
:func:`reserved_bytes` prices a stack's terms per pipeline rank, for the cost table
(the simulator's and the planner's peaks, :data:`BACKEND`) and for the public-runs
comparison (each source's stack) alike. Nothing is reserved off a GPU: on CPU PyTorch
has no caching allocator and no cuBLAS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from merak_sim.memory import (
    DTYPE_BYTES,
    KORTHIKANTI,
    ActivationProfile,
    stage_input_bytes,
    stage_params,
)
from merak_sim.model import ModelSpec
from merak_sim.sim.from_config import stage_rank

__all__ = ["CUBLAS_WORKSPACE_BYTES", "cublas_workspace_bytes", "fsdp_stream_pool_bytes",
           "pipeline_buffer_bytes", "output_chunks_bytes", "freed_logits_bytes",
           "AllocatorStack", "BACKEND", "MEGATRON", "TORCHTITAN_STACK", "on_cuda",
           "rank_stages", "reserved_bytes"]

KiB = 1024
#: PyTorch's default cuBLAS workspace per handle and stream: Hopper (sm90), others.
CUBLAS_WORKSPACE_BYTES = {"sm90": 4096 * KiB * 8, "other": 4096 * KiB * 2 + 16 * KiB * 8}
_HOPPER = ("H100", "H200", "GH200")


def cublas_workspace_bytes(gpu_name: str, streams: int = 1) -> float:
    """Bytes of cuBLAS workspace the allocator holds for ``streams`` matmul streams on
    ``gpu_name`` (a GPU preset name such as "H100-80GB")."""
    if streams < 0:
        raise ValueError(f"streams must be >= 0, got {streams}")
    arch = "sm90" if gpu_name.upper().startswith(_HOPPER) else "other"
    return float(CUBLAS_WORKSPACE_BYTES[arch] * streams)


def fsdp_stream_pool_bytes(unit_params: Sequence[float], gather_bytes: int) -> float:
    """Bytes FSDP2's all-gather copy-in stream keeps in its pool: the gathered weights
    (``gather_bytes`` per parameter) of the two largest units of ``unit_params``
    (parameters per GPU of each unit)."""
    if gather_bytes < 0:
        raise ValueError(f"gather_bytes must be >= 0, got {gather_bytes}")
    top = sorted((float(u) for u in unit_params), reverse=True)[:2]
    return sum(top) * gather_bytes


def pipeline_buffer_bytes(boundary_bytes: float, micro_batches: int, in_flight: int,
                          first: bool, last: bool) -> float:
    """Bytes of ``torch.distributed.pipelining``'s buffers on one stage beyond the stash
    (module docstring): the activation receive buffers of the micro-batches not in
    flight (unless ``first``), a gradient receive buffer per micro-batch and the
    forward cache's stage output per in-flight micro-batch (unless ``last``), each
    ``boundary_bytes``."""
    if micro_batches < 1 or not 0 <= in_flight <= micro_batches:
        raise ValueError(f"need 1 <= micro_batches and 0 <= in_flight <= micro_batches, "
                         f"got {micro_batches} and {in_flight}")
    recv = 0 if first else micro_batches - in_flight
    sent = 0 if last else micro_batches + in_flight
    return float((recv + sent) * boundary_bytes)


def output_chunks_bytes(output_bytes: float, micro_batches: int) -> float:
    """Bytes of the last stage's earlier model outputs ``torch.distributed.pipelining``
    keeps for the step's merged result at the last micro-batch's backward (module
    docstring): ``micro_batches`` - 1 outputs of ``output_bytes`` each."""
    if micro_batches < 1:
        raise ValueError(f"need 1 <= micro_batches, got {micro_batches}")
    return float((micro_batches - 1) * output_bytes)


def freed_logits_bytes(tokens: float, vocab_per_rank: float, act_bytes: int) -> float:
    """Bytes the loss backward of an eager fp32 cross entropy leaves reserved and
    unused (module docstring): the 16-bit logits' share of the hole they and their
    fp32 copy leave, ``act_bytes`` x V/t per token (``tokens`` of one micro-batch)."""
    return float(tokens * vocab_per_rank * act_bytes)


def on_cuda(gpu_name: str) -> bool:
    """Whether ``gpu_name`` (a GPU preset name) is a CUDA device (CPU presets: not)."""
    return not gpu_name.upper().startswith("CPU")


@dataclass(frozen=True, slots=True)
class AllocatorStack:
    """Which reservations of the module docstring a software stack makes.

    Attributes:
        name: label.
        fsdp2_from_zero: the lowest ZeRO stage the stack runs through FSDP2's
            ``fully_shard`` (its all-gather stream pool); 4: none.
        pipelining_buffers: pipeline stages run under ``torch.distributed.pipelining``
            (its receive buffers and forward cache).
        output_chunks: its schedules keep the last stage's outputs for the merged
            result (releases before ``return_outputs``).
        eager_fp32_loss: the loss is an eager cross entropy on fp32 logits (its freed
            logits, when the loss backward is the rank's peak; a fused loss profile
            leaves none).
        fp8_all_gather: FSDP's float8 all-gather (8-bit gathered weights under fp8).
        root_unit: the embedding, final norm and head form one FSDP unit (the root
            module, as torchtitan wraps it); False: the embedding and the head are
            units of their own, as the cost model prices them.
    """

    name: str
    fsdp2_from_zero: int = 4
    pipelining_buffers: bool = False
    output_chunks: bool = False
    eager_fp32_loss: bool = False
    fp8_all_gather: bool = False
    root_unit: bool = False


#: The backend plans are dispatched to (merak_exec): ZeRO 2 and 3 through FSDP2
#: (``merak_exec.fsdp``); its pipeline runtime posts each receive into a tensor of its
#: own, alive only until the action consuming it (the stash counts it), so no
#: persistent receive buffers; its loss is an eager fp32 cross entropy, whose hole
#: sits on top of the loss backward's transient working set, which the simulator's
#: peak (the stash) does not count either, so it is not counted here.
BACKEND = AllocatorStack("merak-exec", fsdp2_from_zero=2)
#: Megatron-LM and its forks: their own distributed optimizer, no FSDP2 pool.
MEGATRON = AllocatorStack("megatron")
#: torchtitan: FSDP2 for every sharded stage (its pipelined FSDP is mapped to ZeRO 1),
#: ``torch.distributed.pipelining``, an eager fp32 loss unless compiled.
TORCHTITAN_STACK = AllocatorStack("torchtitan", fsdp2_from_zero=1, pipelining_buffers=True,
                                  eager_fp32_loss=True, root_unit=True)


def _end_units(model: ModelSpec, tp: int, first: bool, last: bool, root: bool) -> list[float]:
    """Parameters per GPU of the FSDP units beside the layers on one stage: the
    embedding, final norm and head as one ``root`` unit, else the embedding and the
    head (with the final norm) each as its own, as the cost model prices ZeRO 3."""
    ends = stage_params(model, 0, first, last, tp) if first or last else 0.0
    if root or not (first and last):
        return [ends] if first or last else []
    emb = stage_params(model, 0, True, False, tp)
    return [emb, ends - emb]


def rank_stages(cfg: Any, stage_layers: Sequence[int]) -> list[list[tuple[int, bool, bool]]]:
    """(layers, first, last) of the model stages on each pipeline rank of ``cfg`` (a
    ParallelConfig; ``stage_layers``: transformer layers per model stage)."""
    n = len(stage_layers)
    ranks: list[list[tuple[int, bool, bool]]] = [[] for _ in range(cfg.pp)]
    for g, layers in enumerate(stage_layers):
        ranks[stage_rank(cfg, g)].append((int(layers), g == 0, g == n - 1))
    return ranks


def reserved_bytes(model: ModelSpec, gpu_name: str, cfg: Any, stage_layers: Sequence[int],
                   stack: AllocatorStack = BACKEND, *,
                   profile: ActivationProfile = KORTHIKANTI,
                   in_flight: Sequence[int] | None = None,
                   loss_peak: Sequence[bool] | None = None) -> tuple[float, ...]:
    """Bytes the caching allocator reserves beyond the live tensors on each pipeline
    rank of ``cfg`` (a ParallelConfig; ``stage_layers``: transformer layers per model
    stage) under ``stack``: the cuBLAS workspace of one matmul stream, FSDP2's
    all-gather stream pool over the rank's units (each layer, and the stack's units of
    embedding, final norm and head) at ZeRO stages the stack shards with FSDP2,
    pipelining's buffers (``in_flight``: most micro-batches alive per rank; the
    boundary tensor of ``profile``; the last stage's output chunks, logits stored as
    ``profile``'s loss keeps them) and the freed logits of an eager fp32 loss on the
    ranks whose ``loss_peak`` says the loss backward is their peak. All 0 off a GPU."""
    if not on_cuda(gpu_name):
        return (0.0,) * cfg.pp
    e = DTYPE_BYTES[cfg.dtype]
    tok = cfg.micro_batch_size * model.seq_len / cfg.cp
    workspace = cublas_workspace_bytes(gpu_name)
    out = []
    for r, stages in enumerate(rank_stages(cfg, stage_layers)):
        total = workspace
        if cfg.zero >= stack.fsdp2_from_zero:
            units = [stage_params(model, 1, False, False, cfg.tp)] * sum(n for n, _, _ in stages)
            units += [u for _, first, last in stages for u in _end_units(model, cfg.tp, first,
                                                                         last, stack.root_unit)]
            total += fsdp_stream_pool_bytes(units, 1 if stack.fp8_all_gather
                                            and cfg.dtype == "fp8" else e)
        if stack.pipelining_buffers and cfg.pp > 1:
            boundary = stage_input_bytes(model, cfg.micro_batch_size, cfg.tp,
                                         cfg.sequence_parallel, profile, cfg.dtype, cfg.cp)
            m = cfg.num_microbatches
            k = min(in_flight[r] if in_flight is not None else 1, m)
            total += sum(pipeline_buffer_bytes(boundary, m, k, first, last)
                         for _, first, last in stages)
            if stack.output_chunks and any(last for _, _, last in stages):
                logits = tok * model.vocab / cfg.tp * (e if profile.loss == "fused" else 4)
                total += output_chunks_bytes(logits, m)
        if (stack.eager_fp32_loss and profile.loss != "fused" and loss_peak is not None
                and loss_peak[r]):
            total += freed_logits_bytes(tok, model.vocab / cfg.tp, e)
        out.append(total)
    return tuple(out)
