"""The one option vocabulary of both command lines for the parallel configuration.

Every :class:`~merak_sim.config.ParallelConfig` field a command line sets is declared
once here (:data:`CONFIG_FLAGS`): its flag (and hidden old spellings), its type and its
help, with the choices taken from the constants the config validates against
(:data:`~merak_sim.schedule.SCHEDULES`, ``RECOMPUTE_POLICIES``, ``DTYPES``,
``TP_OVERLAPS``, ``ZERO_STAGES``, ``ATTENTIONS``). Commands take them in groups
(:data:`GROUPS`: degrees, batch, schedule, precision, memory, overlap) with their own
defaults, build the config with the one :func:`config_from_options`, and refuse a
config flag given beside ``--plan`` with the one :func:`refuse_plan_clash`. A new
configuration field is one entry here and one field in ``ParallelConfig``.

``merak-exec train`` uses the same groups (merak_exec may import the simulator; the
simulator never imports merak_exec), so both command lines spell, type and check the
configuration alike; what merak-exec cannot run is refused by
:func:`merak_sim.executable.unsupported`, not by a narrower choice list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from merak_sim.config import (
    ATTENTIONS,
    CP_COMMS,
    DTYPES,
    RECOMPUTE_POLICIES,
    TP_OVERLAPS,
    ZERO_STAGES,
)
from merak_sim.schedule import SCHEDULES

from .options import NON_NEGATIVE, ORDER_HELP, POSITIVE, AliasOption, parse_recompute

__all__ = ["Flag", "CONFIG_FLAGS", "GROUPS", "config_options", "config_from_options",
           "refuse_plan_clash", "RECOMPUTE_HELP"]

RECOMPUTE_HELP = (f"{' | '.join(RECOMPUTE_POLICIES)} | stage-aware:C0 | "
                  "stage-aware:c0,c1,... (explicit per-stage fractions).")


@dataclass(frozen=True)
class Flag:
    """One configuration option: ``flags`` (the first is shown, the rest are hidden old
    spellings), the config ``field`` it sets, its click ``type`` (None for an on/off
    flag) and ``help``."""

    flags: tuple[str, ...]
    field: str
    type: Any
    help: str

    def option(self, default: Any) -> Callable:
        """The click option with this command's ``default`` (None: not given)."""
        kw: dict[str, Any] = {"help": self.help, "default": default}
        if self.type is None:
            kw.update(is_flag=True, default=bool(default))
        else:
            kw.update(type=self.type, show_default=default is not None)
        if len(self.flags) > 1:
            kw["cls"] = AliasOption
        return click.option(*self.flags, self.field, **kw)


#: Every configuration option, by ParallelConfig field.
CONFIG_FLAGS: dict[str, Flag] = {f.field: f for f in (
    Flag(("--dp",), "dp", POSITIVE, "Data-parallel degree."),
    Flag(("--tp",), "tp", POSITIVE, "Tensor-parallel degree."),
    Flag(("--pp",), "pp", POSITIVE, "Pipeline-parallel degree (stages)."),
    Flag(("--cp",), "cp", POSITIVE, "Context-parallel degree (ring attention)."),
    Flag(("--cp-comm",), "cp_comm", click.Choice(list(CP_COMMS)),
         "How context-parallel ranks exchange keys and values: ring (ring attention), "
         "all-gather (Llama 3), a2a (Ulysses) or a2a+ring (Megatron's --cp-comm-type)."),
    Flag(("--ep",), "ep", POSITIVE,
         "Expert-parallel degree of an MoE model: divides its experts, folds with --etp "
         "over each stage's tp x cp x dp ranks (Megatron's parallel folding)."),
    Flag(("--etp",), "etp", POSITIVE,
         "Expert-tensor-parallel degree of an MoE model's experts (1: whole experts)."),
    Flag(("--virtual-stages",), "virtual_stages", POSITIVE,
         "Model chunks per pipeline rank (interleaved and V schedules)."),
    Flag(("--order",), "order", str, ORDER_HELP),
    Flag(("--micro-batch-size", "--mbs"), "micro_batch_size", POSITIVE,
         "Samples per micro-batch."),
    Flag(("--global-batch-size",), "global_batch_size", POSITIVE,
         "Samples per iteration over all replicas (dp x micro-batch size x "
         "micro-batches)."),
    Flag(("--schedule",), "schedule", click.Choice(list(SCHEDULES)), "Pipeline schedule."),
    Flag(("--recompute",), "recompute", str, RECOMPUTE_HELP),
    Flag(("--dtype",), "dtype", click.Choice(list(DTYPES)),
         "Training precision (bf16/fp16: mixed precision on fp32 master weights)."),
    Flag(("--zero",), "zero", click.IntRange(min(ZERO_STAGES), max(ZERO_STAGES)),
         "ZeRO stage: 1 shards the optimizer state over dp, 2 the gradients too, 3 the "
         "parameters too (FSDP)."),
    Flag(("--zero-group", "--hsdp"), "zero_group", NON_NEGATIVE,
         "HSDP: shard inside groups of N data-parallel ranks, replicate across (0: shard "
         "over all)."),
    Flag(("--sequence-parallel",), "sequence_parallel", None,
         "Megatron sequence parallelism (needs --tp > 1)."),
    Flag(("--tp-overlap",), "tp_overlap", click.Choice(list(TP_OVERLAPS)),
         "Tensor-parallel communication overlap (sub-pipelined: Merak's T3; te-chunked / "
         "async-tp: TE userbuffers / torch async TP, chunked, need --sequence-parallel)."),
    Flag(("--tp-overlap-parts",), "tp_overlap_parts", POSITIVE,
         "Parts a micro-batch is split into for sub-pipelined TP."),
    Flag(("--attention",), "attention", click.Choice(list(ATTENTIONS)),
         "Attention kernel (auto: flash on GPU presets, the measured profile on CPU)."),
    Flag(("--overlap-param-gather",), "overlap_param_gather", None,
         "Overlap the DP gradient reduction and the ZeRO 1/2 parameter all-gather with "
         "compute (implies --overlap-dp where the command has it)."),
    Flag(("--moe-a2a-overlap",), "moe_a2a_overlap", None,
         "Hide an MoE model's expert all-to-alls behind another micro-batch's compute "
         "(Megatron's 1F1B A2A overlap)."),
)}

#: The groups commands take, by meaning.
GROUPS: dict[str, tuple[str, ...]] = {
    "degrees": ("dp", "tp", "pp", "cp", "cp_comm", "ep", "etp", "virtual_stages", "order"),
    "batch": ("micro_batch_size", "global_batch_size"),
    "schedule": ("schedule", "recompute"),
    "precision": ("dtype",),
    "memory": ("zero", "zero_group", "sequence_parallel"),
    "overlap": ("tp_overlap", "tp_overlap_parts", "attention", "overlap_param_gather",
                "moe_a2a_overlap"),
}


def config_options(*groups: str, defaults: dict[str, Any] | None = None,
                   skip: tuple[str, ...] = ()) -> Callable:
    """A decorator adding the options of ``groups`` (in :data:`GROUPS` order) with this
    command's ``defaults`` (a field missing there defaults to None: not given), less the
    fields in ``skip``."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown option group(s) {unknown}; choose from {sorted(GROUPS)}")
    defaults = defaults or {}
    fields = [f for g in groups for f in GROUPS[g] if f not in skip]

    def deco(f: Callable) -> Callable:
        for field in reversed(fields):
            f = CONFIG_FLAGS[field].option(defaults.get(field))(f)
        return f
    return deco


def config_from_options(values: dict[str, Any], **fixed: Any):
    """The ParallelConfig of the options' ``values`` (ParallelConfig fields; None means
    not given, the config's default), ``fixed`` fields added; ``recompute`` in the
    :func:`~merak_sim.cli.options.parse_recompute` syntax. A bad value is one
    :class:`click.UsageError` line naming it."""
    from merak_sim.config import ParallelConfig

    kw = {k: v for k, v in {**values, **fixed}.items() if v is not None}
    if "recompute" in kw:
        rc = parse_recompute(kw.pop("recompute"))
        kw.update(recompute=rc.policy, recompute_c0=rc.c0,
                  recompute_fractions=rc.fractions)
    try:
        return ParallelConfig(**kw)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e)) from None


def refuse_plan_clash(ctx: click.Context, fields=tuple(CONFIG_FLAGS)) -> None:
    """With ``--plan``, a configuration option given on the command line (or in a
    config file) beside it is refused in one line: the plan fixes the configuration."""
    given = [CONFIG_FLAGS[f].flags[0] for f in fields if f in ctx.params and
             ctx.get_parameter_source(f) in (click.core.ParameterSource.COMMANDLINE,
                                             click.core.ParameterSource.DEFAULT_MAP)]
    if given:
        raise click.UsageError(f"--plan fixes {', '.join(given)}: give the plan or the "
                               "options, not both")
