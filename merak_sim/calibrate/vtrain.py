"""vTrain's published measurements as calibration runs.

vTrain (Bang et al., MICRO 2024; data/vtrain in the repository, MIT) publishes measured
iteration times of Megatron GPT training on A100 clusters: 1,440 single-node runs (1-8
GPUs, ``ground_truth_single.csv``) and 109 multi-node runs (64, 256, 512 GPUs,
``ground_truth_multi.csv``). The shipped A100 profile
(:data:`merak_sim.costs.profiles.SHIPPED`) is ``merak-sim calibrate`` fitted to the
single-node file with the multi-node file held out (docs/calibrate.md gives the
command). :func:`vtrain_runs` reads either file as
:class:`~merak_sim.calibrate.measured.MeasuredRun` values.

How a row becomes a simulation (assumptions, as stated in vTrain's description of its
data and the framework that measured it): GPT with the row's layers, hidden size, heads
and sequence length, fp16; cluster ``vtrain-a100`` (8 A100 per node, vTrain's link
figures); 1F1B, full recomputation, unfused attention (``attention="unfused"``:
Megatron-DeepSpeed's GPT runs the unfused core unless flash attention is asked for), no
overlap of the data-parallel all-reduce. The runs were "collected using
Megatron-DeepSpeed" (vTrain's data README), whose GPT pretraining uses the GPT-2 BPE
tokenizer (50,257 tokens) and pads the vocabulary to a multiple of 128 x tp
(Megatron's ``--make-vocab-size-divisible-by`` default 128, times the tensor-parallel
size): :func:`padded_vocab`, 50,304 at tp = 1 up to 51,200 at tp = 8 and 16.

Communication as the runs had it (:data:`merak_sim.costs.nccl.VTRAIN_A100`):
collectives inside a node priced from vTrain's measured NCCL all-reduce tables (bus
bandwidth per group size and message size); between nodes, vTrain's stated 800 Gb/s
per node (4 HDR adapters) as NCCL measures it on that node design, 91 GB/s of
all-reduce bus bandwidth per node (:data:`merak_sim.costs.nccl.HDR4_A100_NODES`), shared
by the node's GPUs. Pipeline communication as Megatron-DeepSpeed runs it, by DeepSpeed's
``PipelineEngine`` (:mod:`merak_sim.costs.deepspeed_pipe`: synchronous transfers,
activations and gradients partitioned over the TP group and rebuilt by all-gathers,
all on the compute stream): the ``megatron-deepspeed`` stack
(:mod:`merak_sim.calibrate.stacks`).

Framework kernels as Megatron runs them (:data:`VTRAIN_KERNELS`,
:mod:`merak_sim.costs.framework`): the fused softmax only where its
``is_kernel_available`` allows (else the eager fp32 softmax), and the fp32
vocab-parallel cross entropy.

Host issue: Megatron-LM runs eagerly, so every pass is at least its kernel count times
the host's cost per kernel (``host_op_s``,
:meth:`~merak_sim.costs.efficiency.Efficiency.host_bound`); the single-node rows at
micro-batch 1-2 are host bound (about 3.5 ms per layer and micro-batch whatever the
hidden size), so the fit sets ``host_op_s`` from them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from merak_sim.calibrate.measured import MeasuredRun, RunsError
from merak_sim.config import ParallelConfig
from merak_sim.hardware import Cluster, get_cluster
from merak_sim.model import ModelSpec

__all__ = ["GPT2_VOCAB", "VOCAB_MULTIPLE", "VTRAIN_COLUMNS", "VTRAIN_STACK", "VTrainRow",
           "load_vtrain", "padded_vocab", "row_label", "row_setup", "vtrain_runs"]

#: The stack that ran the vTrain rows (:mod:`merak_sim.calibrate.stacks`).
VTRAIN_STACK = "megatron-deepspeed"
#: GPT-2 BPE vocabulary (Megatron's GPT2BPETokenizer, Megatron-DeepSpeed's GPT default).
GPT2_VOCAB = 50257
#: Megatron's ``--make-vocab-size-divisible-by`` default.
VOCAB_MULTIPLE = 128
#: Columns both vTrain files have (how a file is recognised as vTrain's).
VTRAIN_COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads",
                  "# layers", "sequence length", "tensor parallelism", "data parallelism",
                  "pipeline parallelism", "iteration time (ms)")


@dataclass(frozen=True, slots=True)
class VTrainRow:
    """One measured run."""

    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq_len: int
    tp: int
    dp: int
    pp: int
    time_ms: float
    params_b: float | None = None


def _row(d: dict[str, str]) -> VTrainRow:
    return VTrainRow(
        gpus=int(d["# GPUs"]), global_batch=int(d["global batch"]),
        micro_batch=int(d["micro batch"]), hidden=int(d["hidden size"]),
        heads=int(d["attention heads"]), layers=int(d["# layers"]),
        seq_len=int(d["sequence length"]), tp=int(d["tensor parallelism"]),
        dp=int(d["data parallelism"]), pp=int(d["pipeline parallelism"]),
        time_ms=float(d["iteration time (ms)"]),
        params_b=float(d["Parameters (billion)"]) if "Parameters (billion)" in d else None)


def load_vtrain(path: str | Path) -> list[VTrainRow]:
    """Read a vTrain ground-truth CSV (either file; UTF-8 with byte-order mark); a row
    that is not vTrain's is one line naming it (RunsError)."""
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        for d in reader:
            try:
                rows.append(_row(d))
            except (KeyError, TypeError, ValueError) as e:
                raise RunsError(f"{Path(path).name}:{reader.line_num}: not a vTrain row "
                                f"({type(e).__name__}: {e}); the file is read as vTrain's "
                                "because of its header") from None
    return rows


def padded_vocab(tp: int) -> int:
    """Megatron's padded vocabulary: GPT-2's 50,257 tokens rounded up to a multiple of
    ``VOCAB_MULTIPLE * tp`` (so every TP rank holds an equal, aligned slice)."""
    m = VOCAB_MULTIPLE * tp
    return -(-GPT2_VOCAB // m) * m


def row_setup(row: VTrainRow) -> tuple[ModelSpec, Cluster, ParallelConfig]:
    """(ModelSpec, Cluster, ParallelConfig) of a vTrain row (module docstring)."""
    vocab = padded_vocab(row.tp)
    model = ModelSpec(name=f"vtrain-h{row.hidden}-L{row.layers}", family="gpt",
                      layers=row.layers, hidden=row.hidden, heads=row.heads,
                      seq_len=row.seq_len, vocab=vocab, dtype="fp16",
                      source=f"vTrain ground truth row (GPT-2 vocabulary padded to {vocab})")
    nodes = max(1, math.ceil(row.gpus / 8))
    cluster = get_cluster("vtrain-a100", nodes=nodes)
    # Pinned: the runs' attention was unfused, not the GPU default of flash (module
    # docstring).
    cfg = ParallelConfig(dp=row.dp, tp=row.tp, pp=row.pp, micro_batch_size=row.micro_batch,
                         global_batch_size=row.global_batch, schedule="1f1b",
                         recompute="full", dtype="fp16", attention="unfused")
    return model, cluster, cfg


def row_label(row: VTrainRow) -> str:
    """A short description of a row (for reports)."""
    return (f"h{row.hidden} L{row.layers} s{row.seq_len} gpus{row.gpus} tp{row.tp} "
            f"dp{row.dp} pp{row.pp} mbs{row.micro_batch} gbs{row.global_batch}")


def vtrain_runs(path: str | Path) -> list[MeasuredRun]:
    """The rows of a vTrain file as measured runs of the :data:`VTRAIN_STACK` stack."""
    out = []
    for row in load_vtrain(path):
        model, cluster, cfg = row_setup(row)
        out.append(MeasuredRun(row_label(row), model, cluster, cfg, row.time_ms / 1e3,
                               VTRAIN_STACK))
    return out
