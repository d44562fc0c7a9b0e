"""The models ``merak-exec train`` builds: from its shape flags, or from a plan's
:class:`~merak_sim.model.ModelSpec` with every field the simulator priced.

A plan's "gpt" model is the built-in GPT when its MLP width is a multiple of the hidden
size, else HuggingFace GPT-2 (``n_inner``); "llama" is HuggingFace LLaMA with the
plan's ``ffn_hidden`` (``intermediate_size``) and ``kv_heads`` (grouped-query
attention). :func:`parameter_count` of the result equals
:meth:`ModelSpec.total_params` (``merak-exec train --plan`` refuses otherwise).

Before anything is built or trained, :func:`check_shape` refuses a shape the backend
cannot split (heads, kv heads, tp) and :func:`check_resources` a run that cannot fit
or would run for minutes without a line: the model's state and one micro-batch's
activations per rank, priced by the simulator's memory model
(:mod:`merak_sim.memory`), against this rank's free memory, and one step's FLOPs
against the measured CPU peak (:data:`CPU_STEP_LIMIT_S`).
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from merak_exec.mesh import ExecError
from merak_sim.model import ModelSpec

__all__ = ["build_model", "model_from_spec", "parameter_count", "MODEL_KINDS", "spec_from_flags",
           "spec_of", "check_shape", "check_resources", "CPU_STEP_LIMIT_S", "CPU_LAYER_PASS_S"]

#: One training step estimated longer than this on CPU is refused before any work: it
#: would run for minutes without printing a line. The estimate takes the measured CPU
#: peak (merak_sim's "CPU-2core" preset, per core), so it errs on the short side.
CPU_STEP_LIMIT_S = 300.0

MODEL_KINDS = ("gpt", "gpt2", "llama")


def build_model(kind: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
                dropout: float, meta: bool, *, ffn_hidden: int | None = None,
                kv_heads: int | None = None, max_positions: int | None = None) -> nn.Module:
    """A ``kind`` model of this shape (``ffn_hidden`` default 4h, ``kv_heads`` default
    ``heads``, ``max_positions`` default ``seq``), on the meta device if ``meta``."""
    ffn = ffn_hidden or 4 * hidden
    kv = kv_heads or heads
    positions = max_positions or seq
    if kind not in MODEL_KINDS:
        raise ExecError(f"unknown model {kind!r}; choose {', '.join(MODEL_KINDS)}")
    if kind != "llama" and kv != heads:
        raise ExecError(f"{kind} has no grouped-query attention (kv_heads={kv}, "
                        f"heads={heads}); use llama")
    with torch.device("meta") if meta else torch.device("cpu"):
        if kind == "gpt" and ffn % hidden == 0:
            from merak_exec.models import GPT, GPTConfig

            return GPT(GPTConfig(vocab_size=vocab, n_positions=positions, n_embd=hidden,
                                 n_layer=layers, n_head=heads, ffn_mult=ffn // hidden,
                                 dropout=dropout))
        import transformers

        transformers.logging.set_verbosity_error()
        if kind in ("gpt", "gpt2"):
            from transformers import GPT2Config, GPT2LMHeadModel

            return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=positions,
                                              n_embd=hidden, n_layer=layers, n_head=heads,
                                              n_inner=ffn, resid_pdrop=dropout,
                                              embd_pdrop=dropout, attn_pdrop=dropout,
                                              bos_token_id=0, eos_token_id=0))
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                                            intermediate_size=ffn, num_hidden_layers=layers,
                                            num_attention_heads=heads,
                                            num_key_value_heads=kv,
                                            max_position_embeddings=positions,
                                            bos_token_id=0, eos_token_id=0, pad_token_id=0))


def model_from_spec(spec: ModelSpec, dropout: float, meta: bool) -> nn.Module:
    """The model a plan's ``spec`` describes (family gpt or llama)."""
    if spec.family not in ("gpt", "llama"):
        raise ExecError(f"model family {spec.family!r} is simulate-only; merak-exec trains "
                        "gpt and llama plans")
    return build_model(spec.family, spec.layers, spec.hidden, spec.heads, spec.vocab,
                       spec.seq_len, dropout, meta, ffn_hidden=spec.ffn_hidden,
                       kv_heads=spec.kv_heads,
                       max_positions=spec.max_positions if spec.family == "gpt" else None)


def parameter_count(model: nn.Module) -> int:
    """Parameters of ``model``, tied ones counted once (meta tensors count too)."""
    return sum(p.numel() for p in model.parameters())


def spec_from_flags(kind: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
                    dropout: float) -> ModelSpec:
    """The shape :func:`build_model` makes from these (command-line) values, as the
    simulator's :class:`ModelSpec`; a shape it cannot describe is one ExecError line."""
    from merak_sim.model import ModelSpecError

    if kind not in MODEL_KINDS:
        raise ExecError(f"unknown model {kind!r}; choose {', '.join(MODEL_KINDS)}")
    check_shape(kind, hidden, heads, heads, 4 * hidden, vocab, tp=1)
    try:
        return ModelSpec(name=f"{kind}-cli", family="llama" if kind == "llama" else "gpt",
                         layers=layers, hidden=hidden, heads=heads, seq_len=seq, vocab=vocab,
                         dtype="fp32", dropout=dropout)
    except ModelSpecError as e:
        raise ExecError(f"{e}; change the model flags") from None


def check_shape(kind: str, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                tp: int) -> None:
    """Refuse, in one line naming the numbers and the fix, a model shape that cannot
    be built or split over ``tp`` ranks (before transformers or torch say it in
    dozens of lines)."""
    fix = "choose a head count (and tp) that divides the hidden size"
    if hidden % heads:
        raise ExecError(f"hidden size {hidden} is not divisible by {heads} attention heads; "
                        f"{fix}")
    if heads % kv_heads:
        raise ExecError(f"{heads} attention heads are not divisible by {kv_heads} kv heads; "
                        "use a kv-head count that divides the heads")
    if kind == "llama" and (hidden // heads) % 2:
        raise ExecError(f"llama's rotary embedding needs an even head size, got hidden "
                        f"{hidden} / {heads} heads = {hidden // heads}; choose a head count "
                        "that leaves an even head size")
    for what, n in (("attention heads", heads), ("kv heads", kv_heads), ("MLP width", ffn),
                    ("vocabulary", vocab)):
        if n % tp:
            raise ExecError(f"tp={tp} does not divide the {what} ({n}); tensor parallelism "
                            "splits it evenly: pick a tp that divides it")


def spec_of(model: nn.Module, seq: int) -> ModelSpec | None:
    """The shape of a built-in GPT, HuggingFace GPT-2 or LLaMA model at sequence length
    ``seq`` (None for any other model, or one whose config is not understood)."""
    cfg = getattr(model, "config", None)

    def get(*names):
        return next((getattr(cfg, n) for n in names
                     if isinstance(getattr(cfg, n, None), int)), None)

    hidden, layers = get("n_embd", "hidden_size"), get("n_layer", "num_hidden_layers")
    heads, vocab = get("n_head", "num_attention_heads"), get("vocab_size")
    if None in (hidden, layers, heads, vocab) or seq < 1:
        return None
    llama = get("num_key_value_heads") is not None
    ffn = get("intermediate_size", "n_inner") or (get("ffn_mult") or 4) * hidden
    try:
        return ModelSpec(name="model", family="llama" if llama else "gpt", layers=layers,
                         hidden=hidden, heads=heads, seq_len=seq, vocab=vocab,
                         ffn_hidden=ffn, kv_heads=get("num_key_value_heads") or heads,
                         max_positions=0 if llama else (get("n_positions") or seq),
                         dtype="fp32", dropout=0.0)
    except ValueError:
        return None


def available_memory_bytes(device: torch.device) -> tuple[float, str]:
    """Free memory this rank may use and how it was found: the device's free memory on
    CUDA; on CPU the kernel's MemAvailable shared by the ranks of this host
    (LOCAL_WORLD_SIZE, as torchrun sets it)."""
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
        except (RuntimeError, AssertionError):  # no such device: the mesh will say so
            return math.inf, f"free on {device}"
        return float(free), f"free on {device}"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
        avail = kib * 1024.0
    except (OSError, StopIteration, ValueError):
        avail = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    share = f" shared by {ranks} ranks" if ranks > 1 else ""
    return avail / ranks, f"available in this machine's memory{share}"


def _state_and_activation_bytes(spec: ModelSpec, config, device: torch.device) -> float:
    """The largest pipeline stage's model state (fp32 weights, gradients and AdamW
    state: autocast keeps fp32 masters) plus one micro-batch's activations: what
    must fit at the least."""
    from merak_sim.memory import (
        CPU_EAGER,
        KORTHIKANTI,
        last_stage_extra_bytes,
        layer_activation_bytes,
        model_state_bytes,
        stage_params,
    )

    pp, tp = config.pp, config.tp
    per_stage = math.ceil(spec.layers / pp)
    params = max(stage_params(spec, per_stage, first, last, tp)
                 for first, last in ((True, pp == 1), (pp == 1, True)))
    state = model_state_bytes(params, "fp32", config.shard_group, config.zero).total_bytes
    profile = KORTHIKANTI if device.type == "cuda" else CPU_EAGER
    recompute = config.recompute if config.recompute in ("none", "selective") else "full"
    act = per_stage * layer_activation_bytes(spec, config.micro_batch_size, tp,
                                             config.sequence_parallel, recompute, profile,
                                             dtype="fp32")
    logits = last_stage_extra_bytes(spec, config.micro_batch_size, tp, profile=profile,
                                    dtype="fp32")
    return state + act + logits


def check_resources(config, device: torch.device | str, *, spec: ModelSpec | None = None,
                    params: int | None = None, resident: bool = False,
                    repeats: int = 1) -> None:
    """Refuse, before any work, a run that cannot fit this rank's memory or whose one
    step (times ``repeats``) would take over :data:`CPU_STEP_LIMIT_S` on CPU. ``spec``
    (preferred) prices state and activations with the simulator's memory model; else
    ``params`` gives the state alone. ``resident``: the weights are already in this
    memory."""
    from merak_sim.memory import model_state_bytes

    device = torch.device(device)
    ranks = config.tp * config.pp
    if spec is not None:
        need = _state_and_activation_bytes(spec, config, device)
    else:
        need = model_state_bytes((params or 0) / ranks, "fp32", config.shard_group,
                                 config.zero).total_bytes
    if resident:
        need -= 4.0 * (spec.total_params() if spec is not None else params or 0) / ranks
    avail, where = available_memory_bytes(device)
    if need > avail:
        gib = 2.0 ** 30
        raise ExecError(f"this run needs at least {need / gib:.1f} GiB per rank (model state "
                        f"and one micro-batch's activations, as merak-sim prices them) but "
                        f"{avail / gib:.1f} GiB is {where}; use a smaller model or shorter "
                        "sequences, more ranks (--tp/--pp) or ZeRO (--zero)")
    if device.type == "cpu":
        _check_cpu_step(config, spec, repeats)


#: Eager PyTorch's fixed cost of one layer's forward and backward on a CPU, beyond its
#: FLOPs (a few dozen operator calls of ~10 us each, rounded up): what makes ten
#: thousand micro-batches of a tiny model take minutes.
CPU_LAYER_PASS_S = 1e-3


def _check_cpu_step(config, spec: ModelSpec | None, repeats: int) -> None:
    """Refuse a step longer than CPU_STEP_LIMIT_S on one CPU core: FLOPs at the measured
    peak plus the per-layer cost of every micro-batch pass (both lower bounds)."""
    from merak_sim.hardware import get_gpu

    peak = get_gpu("CPU-2core").peak("fp32" if config.dtype == "fp32" else "bf16") / 2
    flops = 0.0 if spec is None else \
        spec.training_flops(config.global_batch_size) / config.world_size
    layers = 0 if spec is None else math.ceil(spec.layers / config.pp)
    passes = config.num_microbatches * (layers + 2) * repeats  # + embedding and head
    step_s = flops * repeats / peak + passes * CPU_LAYER_PASS_S
    if step_s > CPU_STEP_LIMIT_S:
        raise ExecError(f"this would run at least {step_s / 60:.0f} min on a CPU core before "
                        f"printing a line ({flops * repeats:.2g} FLOPs per rank at "
                        f"{peak / 1e9:.0f} GFLOP/s, {passes:,} layer passes); use a GPU, "
                        "shorter sequences, fewer micro-batches or a smaller model")
