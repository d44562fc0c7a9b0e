"""What ``merak-exec`` runs today: the one list of options it refuses.

The simulator prices every option of :class:`~merak_sim.config.ParallelConfig`; the
real backend executes a subset. :data:`NOT_EXECUTED` names, per configuration field,
the values the backend refuses and why (delete a row when the backend learns the
option). :func:`unsupported` reads it for one plan (``dispatch`` refuses such a plan,
``merak-exec train --plan`` too, before any work); :func:`executable_space` removes the
refused values from a planner search space (``merak-sim plan --executable``).

Model shapes the backend builds: family "gpt" (the built-in GPT, HuggingFace GPT-2
when ``ffn_hidden`` is not a multiple of ``hidden``; no grouped-query attention) and
"llama" (HuggingFace LLaMA, whose tensor parallelism splits key/value heads, so tp
must divide ``kv_heads``).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

from merak_sim.config import ParallelConfig
from merak_sim.model import ModelSpec
from merak_sim.planner.space import SearchSpace
from merak_sim.precision import LOW_PRECISION
from merak_sim.schedule import SCHEDULES

__all__ = ["NOT_EXECUTED", "EXECUTED_FAMILIES", "unsupported", "executable_space"]

#: field -> (values merak-exec refuses, the option, why it does not run).
NOT_EXECUTED: dict[str, tuple[Any, str, str]] = {
    "zero_group": (lambda v: v > 0, "HSDP shard groups", "ZeRO shards over all of dp"),
    "overlap_param_gather": ((True,), "the overlapped ZeRO parameter all-gather",
                             "ZeRO-1 all-gathers after the optimizer step"),
    "cp": (lambda v: v > 1, "context parallelism", "no ring attention for this runtime"),
    "cp_comm": (lambda v: v != "ring", "context-parallel all-gather / all-to-all",
                "no context parallelism in this runtime"),
    "dtype": (LOW_PRECISION, "FP8 / MX / FP4 GEMMs",
              "no FP8, MXFP8 or NVFP4 kernels in this runtime"),
    "ep": (lambda v: v > 1, "expert parallelism", "no expert all-to-all in this runtime"),
    "etp": (lambda v: v > 1, "expert-tensor parallelism", "no expert layers in this runtime"),
    "moe_a2a_overlap": ((True,), "the expert all-to-all overlap",
                        "no expert all-to-all in this runtime"),
}

#: model families merak-exec builds from a plan.
EXECUTED_FAMILIES = ("gpt", "llama")


#: the configuration's defaults, for configurations that do not carry every field
_DEFAULTS = {k: ParallelConfig.__dataclass_fields__[k].default for k in NOT_EXECUTED}


def _builds_sequence_parallel(model: ModelSpec) -> bool:
    """Sequence parallelism runs on the built-in GPT (family gpt, MLP width a multiple
    of hidden) only."""
    return model.family == "gpt" and model.ffn_hidden % model.hidden == 0


def _refused(rule, value) -> bool:
    return rule(value) if callable(rule) else value in rule


def unsupported(config: ParallelConfig, model: ModelSpec | None = None) -> str | None:
    """Why merak-exec cannot run ``config`` (on ``model``), or None if it can."""
    for name, (rule, what, why) in NOT_EXECUTED.items():
        value = getattr(config, name, _DEFAULTS[name])
        if _refused(rule, value):
            return (f"{what} ({name}={value!r}) is simulated but not executed by merak-exec "
                    f"({why})")
    why = _fsdp_unsupported(config)
    if why or model is None:
        return why
    if model.family not in EXECUTED_FAMILIES:
        return (f"model family {model.family!r} is simulate-only; merak-exec trains "
                f"{' and '.join(EXECUTED_FAMILIES)} models")
    if model.family == "gpt" and model.kv_heads != model.heads:
        return (f"a gpt model with kv_heads={model.kv_heads} != heads={model.heads} "
                "(grouped-query attention) is simulate-only; use family llama")
    if config.sequence_parallel and not _builds_sequence_parallel(model):
        return ("sequence parallelism runs on the built-in GPT only (family gpt with an MLP "
                "width a multiple of hidden)")
    if model.family == "llama" and model.kv_heads % config.tp:
        return (f"tp={config.tp} does not divide kv_heads={model.kv_heads}; merak-exec "
                "splits key/value heads over tp")
    return None


def _fsdp_unsupported(config: ParallelConfig) -> str | None:
    """ZeRO-2/3 runs through torch FSDP2, whose hooks follow whole backwards and own
    the dp reduction: no input/weight-split or no-grad-forward schedule, no sequence
    parallelism."""
    if getattr(config, "zero", 0) < 2:
        return None
    return fsdp_exclusion(getattr(config, "schedule", ""), config.zero,
                          getattr(config, "sequence_parallel", False)) or None


@cache
def _splitting_kinds(schedule: str) -> tuple[str, ...]:
    """The backward-splitting action kinds (I, W, F*) a registered schedule runs: read
    from a small build (pp 2, its fewest micro-batches, two chunks if interleaved)."""
    spec = SCHEDULES.get(schedule)
    if spec is None:
        return ()
    v = 2 if spec.interleaved else 1
    try:
        sched = spec.build(2, max(spec.min_microbatches(2), 4 if v > 1 else 1), v)
    except ValueError:
        return ()
    kinds = {a.kind.value for prog in sched.programs for st in prog for a in st.parts}
    return tuple(sorted(kinds & {"I", "W", "F*"}))


def fsdp_exclusion(schedule: str, zero: int, sequence_parallel: bool) -> str:
    """Why merak-exec's FSDP2 path cannot run ``zero`` with this schedule and sequence
    parallelism ("" when it can): the joint rule of :attr:`SearchSpace.exclude`."""
    if zero < 2:
        return ""
    head = f"ZeRO-{zero} (torch FSDP2) with"
    if sequence_parallel:
        return (f"{head} sequence parallelism is simulated but not executed by merak-exec "
                "(use zero=1 with sequence parallelism)")
    split = _splitting_kinds(schedule)
    if split:
        return (f"{head} schedule {schedule!r} is simulated but not executed by "
                f"merak-exec (its {'/'.join(split)} actions split the backward, and FSDP's "
                "hooks need whole backwards; use 1f1b or gpipe)")
    return ""


def executable_space(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """``space`` without the options merak-exec refuses; ValueError (one line) when
    nothing of it would run (a simulate-only model, or a space made only of refused
    options)."""
    why = unsupported(ParallelConfig(), model)  # the model's own rules (tp=1 always divides)
    if why:
        raise ValueError(f"--executable: {why}")
    changes: dict[str, Any] = {}
    for name, (rule, what, _why) in NOT_EXECUTED.items():
        allowed = getattr(space, name, None)
        if not isinstance(allowed, tuple):
            continue
        kept = tuple(v for v in allowed if not _refused(rule, v))
        if not kept:
            raise ValueError(f"--executable: the {space.name} space allows only "
                             f"{name}={', '.join(map(repr, allowed))}, and merak-exec does "
                             f"not execute {what}")
        changes[name] = kept
    if not _builds_sequence_parallel(model) and isinstance(space.sequence_parallel, tuple):
        changes["sequence_parallel"] = (False,)
    if model.family == "llama":
        tps = space.tp if space.tp is not None else tuple(
            t for t in range(1, model.kv_heads + 1) if model.kv_heads % t == 0)
        kept_tp = tuple(t for t in tps if model.kv_heads % t == 0)
        if not kept_tp:
            raise ValueError(f"--executable: no allowed tp divides kv_heads={model.kv_heads}")
        changes["tp"] = kept_tp
    changes["exclude"] = fsdp_exclusion
    return space.with_(**changes)
