"""Mapping of published training runs (data/public-runs) onto the simulator's inputs.

Each CSV row is one published measurement (torchtitan, NeMo / Megatron-Bridge,
llm-foundry, Sailor). :func:`skip_reason` says why a row cannot be expressed (one line;
None when it can), :func:`row_setup` turns an expressible row into (ModelSpec, Cluster,
ParallelConfig), :func:`measured_step_s` and :func:`published_peak_bytes` read what was
measured.

How a row maps (assumptions stated once, here):
- Model: the preset named by the row's model (:data:`PRESET_BY_NAME`: LLaMA 2 / 3,
  MPT, NeMo GPT-3), with the row's sequence length and vocabulary where stated; the
  row's shape must equal the preset's. Rows without a preset take the row's shape
  (SwiGLU for LLaMA names, a GELU MLP otherwise; Nemotron: 256k vocabulary, Nemotron-4
  technical report; its squared-ReLU MLP has the FLOPs of a GELU one).
- Cluster: H100 -> ``dgx-h100`` (torchtitan's power-capped 96 GB Grand Teton H100s
  included: their lower clock is not modelled), H200 -> ``dgx-h200``, A100 40/80 GB ->
  ``dgx-a100-40g`` / ``-80g``, GH200 -> ``alps-gh200``; nodes = GPUs / GPUs per node.
- Sharding: FSDP / Megatron FSDP (``dp_shard`` > 1, llm-foundry FULL_SHARD) -> ZeRO 3
  over dp_shard x cp ranks (HSDP when ``dp`` replicates across shard groups), except
  torchtitan's FSDP under pipelining -> ZeRO 1 over the same ranks: torchtitan turns
  resharding after forward off when pp > 1 and the pipeline schedule syncs gradients
  on the last micro-batch only, so parameters and gradients stay unsharded through the
  step and only the fp32 master weights and optimizer state are sharded (its fp32
  gradient accumulation, 2 bytes more per parameter, is added to the memory column's
  prediction, :func:`comparable_peak_bytes`);
  Megatron / NeMo DDP -> ZeRO 1 (NeMo's recipes enable the distributed optimizer) with
  the gradient reduce and parameter gather overlapped (its performance recipes' default).
- Cluster (Blackwell): B200 -> ``dgx-b200``, B300 -> ``dgx-b300``, GB200 / GB300 ->
  ``gb200-nvl72`` / ``gb300-nvl72`` (trays of 4 GPUs in NVLink domains of 72).
- Precision: bf16 (also llm-foundry's amp_bf16 / PURE), FP8 with current (per-tensor)
  scaling (torchtitan Float8 tensorwise, NeMo FP8, FP8-CS), MXFP8 (NeMo's MXFP8,
  FP8-MX and "FP8 32x32 blocks (MX-style)"), NVFP4 (:mod:`merak_sim.precision`);
  torchao's row-wise scaling is not modelled. Sailor's runs
  state none: its run script passes neither --fp16 nor --bf16, so Megatron trains in
  fp32, and the measured throughput (about 90 TFLOP/s per GPU for GPT-Neo 2.7B) exceeds
  the GH200's 67 TFLOP/s FP32 peak: the matmuls ran on TF32 tensor cores (NVIDIA's
  PyTorch containers enable TF32 by default), so these rows are fp32 with the GPU's
  TF32 dense peak (494 TFLOP/s, half of the datasheet's 989 with sparsity) as its fp32
  peak, an assumption.
- Attention: flash (every source's default kernel for 16-bit training); unfused in fp32
  (the flash kernels need 16-bit inputs).
- Sequence parallelism with tp > 1 (Megatron's and torchtitan's default), except in
  Sailor's Megatron-DeepSpeed fork. Sailor's uneven layers per stage are kept
  (:func:`stage_layers`): its pipeline counts the embedding and the LM head as one
  layer each of the first and last stages (7/9/9/9 for GPT-Neo's 32 layers).
- Recompute: "full" -> full; "selective (op ...)" -> selective; "selective layer"
  (torchtitan's every second layer) -> stage-aware with half the layers; "none"/"no" or
  unstated -> none.
- Elementwise kernels: torchtitan rows without torch.compile run their RMSNorm, rotary
  embedding and SwiGLU one eager PyTorch op at a time (``fused_elementwise=False``,
  :mod:`merak_sim.costs.fusion`); compiled when the flags say torch.compile, when they
  use async TP (an Inductor pass, so it needs compile) or when the notes say the run's
  config sets ``compile=true``. Every other stack fuses them (Megatron and Transformer
  Engine kernels) or calls one native kernel per op (llm-foundry's MPT: LayerNorm,
  GELU), which is what the default charges.
- Batch: micro-batch from the row; a pipelined torchtitan row without one uses
  torchtitan's default of as many micro-batches as stages. Schedules: 1F1B, or
  interleaved 1F1B with the row's virtual stages.
- Activation storage: torchtitan's own (:data:`merak_sim.memory.TORCHTITAN`,
  :func:`activation_profile`: its op-level selective policy and its loss), the cost
  model's default elsewhere; the memory columns: :func:`comparable_peak_bytes`.
- MoE (NeMo / Megatron-Bridge rows): the model's MoE preset (:data:`PRESET_BY_NAME`;
  the row's experts, top-k and expert FFN must equal it), the row's ep with etp 1,
  dropless with the benchmarks' force-balanced routing (imbalance 1), capacity factor 1
  for the "(tokendrop)" rows, the all-to-all overlapped with compute (the choice made
  on the declared MoE fit rows, :data:`merak_sim.validation.fidelity.MOE_FIT`).
Not expressible: MoE models without an MoE preset (Nemotron 3, Kimi K2, DeepSeek V4:
their expert shapes are not in the rows),
fine-tuning, heterogeneous clusters,
rows the data flags as likely copy errors, unstated precision or virtual stages, rows
without a measured time or throughput (the long-sequence NeMo table publishes model
TFLOP/s only), and rows whose degrees do not multiply to the GPU count.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import replace
from pathlib import Path

from merak_sim.allocator_memory import MEGATRON, TORCHTITAN_STACK, rank_stages, reserved_bytes
from merak_sim.config import ParallelConfig
from merak_sim.costs.attention_choice import attention_profile
from merak_sim.costs.base import CostTable
from merak_sim.hardware import Cluster, get_cluster
from merak_sim.memory import (
    TORCHTITAN,
    TORCHTITAN_COMPILED,
    TORCHTITAN_COMPILED_LOSS,
    ActivationProfile,
    backward_working_bytes,
    peak_memory,
    stage_params,
)
from merak_sim.model import ModelSpec, get_model
from merak_sim.precision import is_low_precision
from merak_sim.runtime_memory import runtime_memory_bytes

__all__ = ["PRESET_BY_NAME", "load_rows", "skip_reason", "row_setup", "measured_step_s",
           "published_peak_bytes", "preset_for", "cluster_name", "precision_of",
           "row_label", "MEMORY_MEASURE", "comparable_peak_bytes", "stage_layers",
           "eager_elementwise", "activation_profile"]

GiB = 1 << 30

#: Model-name patterns (lower case, regular expressions) -> model preset.
PRESET_BY_NAME: tuple[tuple[str, str], ...] = (
    (r"llama[ _-]?3(\.1)?[ _-]+8b", "llama3-8b"),
    (r"llama[ _-]?3(\.1)?[ _-]+70b", "llama3-70b"),
    (r"llama[ _-]?3(\.1)?[ _-]+405b", "llama3-405b-like"),
    (r"llama[ _-]?2[ _-]+7b", "llama2-7b"),
    (r"llama[ _-]?2[ _-]+13b", "llama2-13b"),
    (r"llama[ _-]?2[ _-]+70b", "llama2-70b"),
    (r"mpt-(1b|3b|7b|13b|30b|70b)$", "mpt-{0}"),
    (r"gpt3-5b$", "nemo-gpt3-5b"),
    (r"gpt3-20b$", "nemo-gpt3-20b"),
    (r"gpt3-175b$", "gpt3-175b"),
    (r"qwen3[ _-]+30b[ _-]+a3b", "qwen3-30b-a3b"),
    (r"qwen3[ _-]+235b[ _-]+a22b", "qwen3-235b-a22b"),
    (r"gpt[ _-]?oss[ _-]+120b", "gpt-oss-120b"),
    (r"deepseek[ _-]?v3", "deepseek-v3"),
    (r"mixtral[ _-]+8x7b", "mixtral-8x7b"),
    (r"mixtral[ _-]+8x22b", "mixtral-8x22b"),
)
#: MoE columns of a row -> the preset's MoESpec field they must equal.
_MOE_SHAPE = (("num_experts", "experts"), ("moe_topk", "top_k"),
              ("moe_ffn_hidden", "expert_ffn"))
_NEMOTRON_VOCAB = 256000
_SHAPE = (("n_layers", "layers"), ("hidden_size", "hidden"), ("n_heads", "heads"),
          ("n_kv_heads", "kv_heads"), ("ffn_hidden", "ffn_hidden"))


def load_rows(path: str | Path) -> list[dict]:
    """The rows of one public-runs CSV as dicts of strings."""
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _int(v: str | None, default: int = 1) -> int:
    v = (v or "").strip()
    return int(float(v)) if v else default


def row_label(row: dict) -> str:
    """What a row is, for tables: model, GPUs, degrees, sequence, precision, flags."""
    flags = row.get("other_flags", "")
    extra = "".join(f" {k}" for k, pat in (("compile", "compile"), ("asyncTP", "asynctp"))
                    if pat in flags.lower())
    return (f"{row.get('model', '?')} {row.get('gpu_type', '?').split(' (')[0]} "
            f"x{row.get('num_gpus', '?')} tp{row.get('tp') or 1} pp{row.get('pp') or 1} "
            f"cp{row.get('cp') or 1} s{row.get('seq_len', '?')} "
            f"{precision_of(row) or row.get('precision', '?')}{extra}")


def cluster_name(gpu_type: str) -> str | None:
    """Cluster preset of a row's GPU type (None: no preset)."""
    g = gpu_type.upper()
    if g.startswith("GH200"):
        return "alps-gh200"
    if g.startswith("H100"):
        return "dgx-h100"
    if g.startswith("H200"):
        return "dgx-h200"
    if g.startswith("A100"):
        return "dgx-a100-40g" if "40GB" in g.replace(" ", "") else "dgx-a100-80g"
    # Blackwell: HGX/DGX nodes of 8, NVL72 racks of 18 trays x 4 GPUs.
    for prefix, name in (("GB200", "gb200-nvl72"), ("GB300", "gb300-nvl72"),
                         ("B200", "dgx-b200"), ("B300", "dgx-b300")):
        if g.startswith(prefix):
            return name
    return None


def _sailor(row: dict) -> bool:
    return row.get("framework", "").lower().startswith("sailor")


def precision_of(row: dict) -> str | None:
    """The simulator's dtype of a row's published precision (None: not modelled)."""
    p = row.get("precision", "").lower()
    if not p:
        return "fp32" if _sailor(row) else None
    if "nvfp4" in p:
        return "nvfp4"
    # NeMo's "FP8-MX" and "FP8 32x32 blocks (MX-style)" name its MXFP8 recipe.
    if "mx" in p:
        return "mxfp8"
    if "block" in p:
        return "fp8-block"
    if "fp4" in p or "rowwise" in p:
        return None
    if p.startswith("fp8"):
        return "fp8"
    if "bf16" in p:
        return "bf16"
    if "fp16" in p:
        return "fp16"
    return None


def preset_for(model_name: str) -> str | None:
    """The model preset a published model name maps to (None: none)."""
    name = model_name.strip().lower()
    for pat, preset in PRESET_BY_NAME:
        m = re.search(pat, name)
        if m:
            return preset.format(*m.groups())
    return None


def measured_step_s(row: dict) -> float | None:
    """Measured iteration seconds: the published step time, else global batch x sequence
    / (tokens per second per GPU x GPUs)."""
    if row.get("step_time_s", "").strip():
        return float(row["step_time_s"])
    tps = row.get("tokens_per_sec_per_gpu", "").strip()
    if tps and row.get("global_batch_size") and row.get("seq_len") and row.get("num_gpus"):
        return (_int(row["global_batch_size"]) * _int(row["seq_len"])
                / (float(tps) * _int(row["num_gpus"])))
    return None


def published_peak_bytes(row: dict) -> float | None:
    """Published peak memory per GPU in bytes (torchtitan GiB, Sailor bytes)."""
    if row.get("peak_mem_gib", "").strip():
        return float(row["peak_mem_gib"]) * GiB
    if row.get("peak_mem_bytes", "").strip():
        return float(row["peak_mem_bytes"])
    return None


#: What each source's memory column measures (read from the source's code and notes).
MEMORY_MEASURE: dict[str, str] = {
    "torchtitan": ("peak memory reserved by PyTorch's caching allocator (torchtitan logs "
                   "torch.cuda's max_reserved as 'memory'), max across GPUs"),
    "sailor": ("device total used memory (nvidia-smi memory.used after every pipeline "
               "instruction; max over ranks, last line of the memory log)"),
}


def _year(row: dict) -> int:
    """The year in a torchtitan benchmark's file name (``..._202412_...``; 0: none)."""
    m = re.search(r"_(20\d\d)(\d\d)_", row.get("source_path", ""))
    return int(m.group(1)) if m is not None else 0


def activation_profile(row: dict) -> ActivationProfile | None:
    """How the row's framework stores activations, where it differs from the cost
    model's default (None): torchtitan's op-level selective checkpointing, eager
    without ``torch.compile``; compiled, its blocks keep only what their backward
    reads, and its 2025 releases compile the loss too (the 2024 benchmark's training
    loop calls an uncompiled loss)."""
    if "torchtitan" not in row.get("framework", "").lower():
        return None
    compiled = "torch.compile" in row.get("other_flags", "")
    if compiled and _year(row) >= 2025:
        return TORCHTITAN_COMPILED_LOSS
    return TORCHTITAN_COMPILED if compiled else TORCHTITAN


def _measure(row: dict) -> str:
    return "sailor" if _sailor(row) else "torchtitan"


def comparable_peak_bytes(row: dict, model: ModelSpec, cluster: Cluster, cfg: ParallelConfig,
                          table: CostTable, stage_peaks: tuple[float, ...]) -> float:
    """The prediction of a row's published memory column (:data:`MEMORY_MEASURE`), the
    max over pipeline ranks of the simulated peak (``stage_peaks``: state, stash, FSDP
    buffers; one per rank) plus the terms below, each priced from the layers and
    parameters of the model stages the cost ``table`` puts on that rank (its chunks
    under virtual stages, :func:`~merak_sim.sim.from_config.stage_rank`):

    - the transient working set of the stage's largest backward step
      (:func:`merak_sim.memory.backward_working_bytes`), which an allocator-level peak
      sees and the stash does not;
    - torchtitan's FSDP under pipelining: gradients accumulate unsharded over the
      micro-batches in FSDP2's reduce dtype, torchtitan's default fp32 (FSDP2 upcasts
      an unsynchronised unsharded gradient to the reduce dtype), 2 bytes per parameter
      more than the 16-bit gradients of the ZeRO 1 mapping;
    - torchtitan's fp8 (torchao's Float8Linear) casts the weights to FP8 at every use
      and saves the 16-bit ones for backward: none of the cached FP8 copy the fp8 state
      counts (1 byte per parameter, sharded like the weights);
    - what the caching allocator reserves beyond the live tensors under the row's
      stack (:func:`merak_sim.allocator_memory.reserved_bytes`, in place of the
      backend's that the simulated peaks hold, :attr:`CostTable.reserved_bytes`): the
      cuBLAS workspace (every row) and, for torchtitan's PyTorch stack, FSDP2's
      all-gather stream pool, pipelining's receive buffers and forward cache, and the
      freed logits of an eager fp32 loss when the loss backward is the rank's peak;
    - for a device-level reading (Sailor), the memory the runtime holds outside the
      allocator (:func:`merak_sim.runtime_memory.runtime_memory_bytes`).
    Fragmentation beyond those terms is not modelled (torchtitan runs with expandable
    segments; nothing is fitted to the memory columns)."""
    prof = attention_profile(activation_profile(row), cfg, cluster.gpu.name)
    titan = "torchtitan" in row.get("framework", "").lower()
    fp32_accum = titan and cfg.pp > 1 and cfg.zero > 0
    no_fp8_copy = titan and cfg.dtype == "fp8"
    shard = cfg.shard_group if cfg.zero >= 3 else 1
    outside = runtime_memory_bytes(cluster.gpu.name) if _measure(row) == "sailor" else 0.0
    layers = [st.layers for st in table.stages]
    in_flight = ([m.peak_in_flight for m in peak_memory(table, cfg)] if titan and cfg.pp > 1
                 else [1] * len(stage_peaks))
    extra, loss_peak = [], []
    for stages in rank_stages(cfg, layers):
        params = sum(stage_params(model, n, first, last, cfg.tp) for n, first, last in stages)
        last = any(lst for _, _, lst in stages)
        work = [backward_working_bytes(model, cfg.micro_batch_size, cfg.tp,
                                       cfg.sequence_parallel, cfg.recompute, prof, cfg.dtype,
                                       cfg.cp, last=lst) for lst in (False, last)]
        loss_peak.append(work[1] > work[0])
        extra.append(work[1] + (2 * params if fp32_accum else 0.0)
                     - (params / shard if no_fp8_copy else 0.0))
    # The simulated peaks hold the backend's reservations (the table's); the row's stack
    # replaces them.
    stack = (replace(TORCHTITAN_STACK, output_chunks=_year(row) < 2025,
                     fp8_all_gather="float8_all_gather" in row.get("other_flags", ""))
             if titan else MEGATRON)
    res = reserved_bytes(model, cluster.gpu.name, cfg, layers, stack, profile=prof,
                         in_flight=in_flight, loss_peak=loss_peak)
    return max(peak - table.reserved(r) + res[r] + extra[r] + outside
               for r, peak in enumerate(stage_peaks))


def stage_layers(row: dict) -> tuple[int, ...] | None:
    """Transformer layers per pipeline stage where the row states them (Sailor's
    ``layers_per_stage=a/b/...``, whose first and last counts include the embedding and
    the LM head as one layer each); None where it states none or the counts do not add
    up to the model's layers over pp stages."""
    m = re.search(r"layers_per_stage=([\d/]+)", row.get("other_flags", ""))
    if m is None:
        return None
    counts = [int(x) for x in m.group(1).split("/")]
    counts[0] -= 1
    counts[-1] -= 1
    ok = (len(counts) == _int(row.get("pp")) and min(counts) >= 1
          and sum(counts) == _int(row.get("n_layers"), 0))
    return tuple(counts) if ok else None


def _sharded(row: dict) -> bool:
    flags = row.get("other_flags", "").lower()
    return _int(row.get("dp_shard")) > 1 or ("fsdp" in flags and "fsdp=0" not in flags)


def _degrees(row: dict) -> tuple[int, int, int, int]:
    """(data-parallel ranks, tp, pp, cp) with FSDP's shard degree in the data ranks."""
    dp = _int(row.get("dp")) * _int(row.get("dp_shard"))
    return dp, _int(row.get("tp")), _int(row.get("pp")), _int(row.get("cp"))


def skip_reason(row: dict) -> str | None:
    """Why a row cannot be expressed (module docstring); None when it can."""
    flags = row.get("other_flags", "").lower()
    if row.get("task", "pretrain") != "pretrain":
        return f"task {row['task']} (fine-tuning is not modelled)"
    moe = bool(row.get("num_experts") or _int(row.get("ep")) > 1)
    name = preset_for(row.get("model", ""))
    if moe and (name is None or get_model(name).moe is None):
        return "MoE model without an MoE preset (its experts' shape is not in the row)"
    gpu = row.get("gpu_type", "")
    if gpu.lower().startswith("heterogeneous"):
        return "heterogeneous cluster (mixed GPU types per pipeline) not modelled"
    if cluster_name(gpu) is None:
        return f"no cluster preset for {gpu.split(' (')[0] or '?'}"
    if "copy error" in row.get("notes", "").lower():
        return "flagged in the data's notes as a likely copy error in the source"
    if not row.get("precision", "").strip() and not _sailor(row):
        return "precision not stated"
    dtype = precision_of(row)
    if dtype is None:
        return (f"precision {row['precision']} (FP8 per-tensor and blockwise, MXFP8 and "
                "NVFP4 are modelled; torchao's row-wise scaling is not)")
    try:
        get_cluster(cluster_name(gpu)).gpu.peak(dtype)
    except ValueError as e:
        return str(e)
    for k in ("n_layers", "hidden_size", "n_heads", "seq_len", "num_gpus",
              "global_batch_size", "tp", "pp"):
        if not row.get(k, "").strip():
            return f"{k} not stated"
    if measured_step_s(row) is None:
        return "no measured step time or throughput (model TFLOP/s only)"
    dp, tp, pp, cp = _degrees(row)
    if dp * tp * pp * cp != _int(row["num_gpus"]):
        return "dp x tp x pp x cp does not equal the GPU count"
    if "interleaved" in flags and not row.get("vp", "").strip():
        return "interleaved 1F1B with unstated virtual stages"
    if _micro_batch(row, dp, pp) is None:
        return "micro-batch size not stated"
    if name is not None:
        pre = get_model(name)
        for col, attr in _SHAPE:
            if row.get(col, "").strip() and _int(row[col]) != getattr(pre, attr):
                return f"{col} {row[col]} differs from preset {name} ({getattr(pre, attr)})"
        for col, attr in _MOE_SHAPE if pre.moe is not None else ():
            if row.get(col, "").strip() and _int(row[col]) != getattr(pre.moe, attr):
                return f"{col} {row[col]} differs from preset {name}"
    elif not row.get("vocab_size", "").strip() and "nemotron" not in row["model"].lower():
        return "vocab_size not stated and no preset"
    return None


def eager_elementwise(row: dict) -> bool:
    """Whether a row's elementwise ops run as eager PyTorch kernels (module docstring:
    torchtitan without torch.compile)."""
    if "torchtitan" not in row.get("framework", "").lower():
        return False
    flags = row.get("other_flags", "").lower()
    return not ("compile" in flags or "asynctp" in flags
                or "compile=true" in row.get("notes", "").lower())


def _micro_batch(row: dict, dp: int, pp: int) -> int | None:
    if row.get("micro_batch_size", "").strip():
        return _int(row["micro_batch_size"])
    gbs = _int(row["global_batch_size"])
    if pp > 1 and "torchtitan" in row.get("framework", "").lower() and gbs % (dp * pp) == 0:
        return gbs // (dp * pp)
    return None


def _model(row: dict) -> ModelSpec:
    # Low-precision recipes keep 16-bit weights and activations (merak_sim.precision).
    dtype = "bf16" if is_low_precision(precision_of(row) or "") else precision_of(row)
    seq = _int(row["seq_len"])
    name = preset_for(row["model"])
    if name is not None:
        pre = get_model(name)
        if pre.moe is not None and "tokendrop" in row["model"].lower():
            # Megatron-Bridge's token-dropping MoE recipes: capacity factor 1.
            pre = pre.with_(moe=replace(pre.moe, capacity_factor=1.0))
        return pre.with_(seq_len=seq, vocab=_int(row.get("vocab_size"), pre.vocab),
                         max_positions=seq if pre.family == "gpt" else 0, dtype=dtype)
    llama = "llama" in row["model"].lower()
    return ModelSpec(name=row["model"], family="llama" if llama else "gpt",
                     layers=_int(row["n_layers"]), hidden=_int(row["hidden_size"]),
                     heads=_int(row["n_heads"]), seq_len=seq,
                     vocab=_int(row.get("vocab_size"), _NEMOTRON_VOCAB),
                     ffn_hidden=_int(row.get("ffn_hidden"), 0),
                     kv_heads=_int(row.get("n_kv_heads"), 0), dtype=dtype,
                     dropout=0.0, source=f"public-runs row ({row.get('shape_source', '')})")


def _recompute(row: dict, pp: int) -> dict:
    rc = row.get("activation_recompute", "").lower()
    if rc.startswith("full"):
        return {"recompute": "full"}
    if rc.startswith("selective layer"):
        return {"recompute": "stage-aware", "recompute_fractions": (0.5,) * pp}
    if rc.startswith("selective"):
        return {"recompute": "selective"}
    return {"recompute": "none"}


def _tf32(cluster: Cluster) -> Cluster:
    """``cluster`` with fp32 matmuls at the TF32 tensor-core rate (half the 16-bit)."""
    gpu = replace(cluster.gpu, peak_flops={**cluster.gpu.peak_flops,
                                           "fp32": cluster.gpu.peak("bf16") / 2})
    return replace(cluster, gpu=gpu, notes=cluster.notes + (
        "fp32 training with TF32 tensor-core matmuls (assumption: half the bf16 peak)",))


def row_setup(row: dict) -> tuple[ModelSpec, Cluster, ParallelConfig]:
    """(ModelSpec, Cluster, ParallelConfig) of an expressible row (module docstring)."""
    why = skip_reason(row)
    if why is not None:
        raise ValueError(f"row not expressible: {why}")
    model = _model(row)
    dp, tp, pp, cp = _degrees(row)
    gpus = _int(row["num_gpus"])
    name = cluster_name(row["gpu_type"])
    per_node = get_cluster(name).gpus_per_node
    cluster = get_cluster(name, nodes=max(1, math.ceil(gpus / per_node)))
    if model.dtype == "fp32":
        cluster = _tf32(cluster)
    vp = _int(row.get("vp"))
    sharded = _sharded(row)
    titan_pp = pp > 1 and "torchtitan" in row.get("framework", "").lower()
    zero = {"zero": 1 if titan_pp else 3,
            "zero_group": (_int(row.get("dp_shard")) * cp
                           if _int(row.get("dp")) > 1 else 0)} if sharded else (
        {"zero": 1, "overlap_param_gather": True} if "nemo" in row.get("framework", "").lower()
        else {})
    # MoE on NeMo / Megatron-Bridge: the expert all-to-all overlapped with compute, the
    # choice made on the declared MoE fit rows (merak_sim.validation.fidelity.MOE_FIT).
    moe_overlap = model.moe is not None and "nemo" in row.get("framework", "").lower()
    cfg = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, virtual_stages=vp, ep=_int(row.get("ep")),
                         moe_a2a_overlap=moe_overlap,
                         schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                         micro_batch_size=_micro_batch(row, dp, pp),
                         global_batch_size=_int(row["global_batch_size"]),
                         attention="unfused" if model.dtype == "fp32" else "flash",
                         dtype=precision_of(row),
                         sequence_parallel=tp > 1 and not _sailor(row),
                         fused_elementwise=not eager_elementwise(row),
                         **_recompute(row, pp), **zero)
    return model, cluster, cfg
