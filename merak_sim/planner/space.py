"""SearchSpace: which options the planner may combine, and the candidate enumeration.

The full space is the cross product of tp (dividing the GPUs of a node and the
model's heads), cp (context parallelism, dividing the rest and the sequence; 1 unless
asked), pp (dividing the rest, at most the layers), dp = GPUs / (tp cp pp),
micro-batch size (dividing the per-replica batch), schedule (with virtual stages for
interleaved 1F1B), recompute policy, sequence parallelism, TP overlap, ZeRO stage (and
HSDP shard group), attention kernel and overlap of the data-parallel synchronisation.
An MoE model's candidates also carry the expert-parallel degree ep (etp 1, as
Megatron-Bridge's MoE recipes): every divisor of the expert count that folds onto the
stage's tp x cp x dp ranks (:func:`expert_degrees`); a dense model's ep is 1.
The defaults keep the space of the paper reproduction (no cp, ZeRO 0/1, no DP overlap)
but with the cost model's attention ("auto": flash on GPUs; the paper's systems pin
the unfused kernel); the newer options are opt-in.
A restricted :class:`SearchSpace` expresses a system: the Megatron-LM-like baseline is
1F1B + full recompute + synchronous TP, the DeepSpeed-like one adds ZeRO-1, Merak is the
shifted critical path + stage-aware recompute + sub-pipelined TP (Lai et al., TPDS
2023, "Baselines").

Options that cannot apply to a candidate collapse instead of multiplying: sequence
parallelism and TP overlap need tp > 1 (sub-pipelined TP also an even micro-batch), ZeRO
needs dp > 1; when every allowed value is inapplicable the candidate runs without the
technique (Merak at tp = 1 simply has no TP to overlap). Each schedule's declared
:class:`~merak_sim.schedule.ScheduleSpec` says which degrees it accepts (a violation is a
pruned row naming it) and which recompute policies it is paired with (Merak's schedules,
with explicit F* / R re-forwards, only with one that checkpoints); with pp = 1 every
schedule is 1F1B, so only one is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import product

from merak_sim.config import ATTENTIONS, RECOMPUTE_POLICIES, TP_OVERLAPS, ZERO_STAGES
from merak_sim.costs.ring import check_cp
from merak_sim.costs.tp_overlap import CHUNKED_OVERLAPS
from merak_sim.layout import DEFAULT_ORDER, RankLayout
from merak_sim.schedule import SCHEDULES

__all__ = ["SearchSpace", "Candidate", "Block", "enumerate_candidates", "candidate_blocks",
           "SYSTEMS", "divisors", "expert_degrees"]


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """Options the planner may combine (None = every valid value).

    Attributes:
        tp, pp: allowed degrees (None: every divisor that fits).
        micro_batch_sizes: allowed micro-batch sizes (None: divisors of the
            per-replica batch up to ``max_micro_batch_size``).
        max_micro_batch_size: bound used when ``micro_batch_sizes`` is None.
        schedules: schedule names (:data:`merak_sim.schedule.SCHEDULES`).
        virtual_stages: model chunks per rank tried with interleaved-1f1b.
        recompute: policies; "stage-aware" has its per-stage fractions chosen by the
            planner from the memory model (the smallest layer-granular fraction per
            stage that fits).
        sequence_parallel, tp_overlap, zero: allowed values of those switches.
        cp: allowed context-parallel degrees.
        zero_groups: allowed HSDP shard-group sizes (0: shard over all of dp x cp).
        attention: allowed attention kernels (:data:`merak_sim.config.ATTENTIONS`).
        overlap_param_gather: allowed values of
            ``ParallelConfig.overlap_param_gather``.
        dtype: training precision.
        order: rank placement of every candidate (``ParallelConfig.order``).
        ep: allowed expert-parallel degrees of an MoE model (None: every divisor of its
            experts; :func:`expert_degrees` keeps those folding onto a stage's ranks).
        name: a label for reports.
        exclude: a joint restriction the per-option tuples cannot state, (schedule,
            zero, sequence_parallel) -> why that combination is left out ("" when it is
            allowed); excluded candidates are kept as pruned rows naming the reason
            (:func:`merak_sim.executable.executable_space` sets it).
    """

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch_sizes: tuple[int, ...] | None = None
    max_micro_batch_size: int = 16
    schedules: tuple[str, ...] = tuple(SCHEDULES)
    virtual_stages: tuple[int, ...] = (2, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full", "stage-aware")
    sequence_parallel: tuple[bool, ...] = (False, True)
    tp_overlap: tuple[str, ...] = ("none", "sub-pipelined")
    zero: tuple[int, ...] = (0, 1)
    cp: tuple[int, ...] = (1,)
    zero_groups: tuple[int, ...] = (0,)
    attention: tuple[str, ...] = ("auto",)
    overlap_param_gather: tuple[bool, ...] = (False,)
    dtype: str = "bf16"
    order: str = DEFAULT_ORDER
    name: str = "full"
    exclude: Callable[[str, int, bool], str] | None = None
    ep: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for s in self.schedules:
            if s not in SCHEDULES:
                raise ValueError(f"search space: unknown schedule {s!r}; choose from "
                                 f"{', '.join(SCHEDULES)}")
        for r in self.recompute:
            if r not in RECOMPUTE_POLICIES:
                raise ValueError(f"search space: unknown recompute policy {r!r}")
        for o in self.tp_overlap:
            if o not in TP_OVERLAPS:
                raise ValueError(f"search space: unknown tp overlap {o!r}")
        for z in self.zero:
            if z not in ZERO_STAGES:
                raise ValueError(f"search space: zero stage {z!r} unknown; choose 0, 1, 2 "
                                 "or 3")
        for a in self.attention:
            if a not in ATTENTIONS:
                raise ValueError(f"search space: unknown attention {a!r}; choose one of: "
                                 f"{', '.join(ATTENTIONS)}")
        for c in self.cp:
            if not isinstance(c, int) or c < 1:
                raise ValueError(f"search space: cp must be a positive integer, got {c!r}")
        for e in self.ep or ():
            if not isinstance(e, int) or isinstance(e, bool) or e < 1:
                raise ValueError(f"search space: ep must be a positive integer, got {e!r}")
        if self.ep == ():
            raise ValueError("search space: ep must not be empty")
        for what in ("schedules", "recompute", "sequence_parallel", "tp_overlap", "zero",
                     "cp", "zero_groups", "attention", "overlap_param_gather"):
            if not getattr(self, what):
                raise ValueError(f"search space: {what} must not be empty")
        try:
            RankLayout(1, 1, 1, 1, self.order)
        except ValueError as e:
            raise ValueError(f"search space: {e}") from None
        if self.max_micro_batch_size < 1:
            raise ValueError("search space: max_micro_batch_size must be >= 1")

    def with_(self, **changes) -> SearchSpace:
        """A copy with some options changed."""
        return replace(self, **changes)


_BASE = dict(sequence_parallel=(False,), virtual_stages=(2,), attention=("unfused",))

#: The systems of the paper reproduction as search spaces (module docstring). Sequence
#: parallelism (Megatron, 2022) postdates the systems Merak compared with, so it is off;
#: Merak and those systems computed attention unfused (flash attention, 2022, was not in
#: them), so the kernel is pinned rather than left to the GPU default of flash.
SYSTEMS: dict[str, SearchSpace] = {
    "megatron": SearchSpace(schedules=("1f1b",), recompute=("full",), tp_overlap=("none",),
                            zero=(0,), name="Megatron-LM-like", **_BASE),
    "deepspeed": SearchSpace(schedules=("1f1b",), recompute=("full",), tp_overlap=("none",),
                             zero=(1,), name="DeepSpeed-like", **_BASE),
    # The same systems free to choose their own recompute (as a user would when memory
    # allows), besides their degrees and micro-batch size.
    "megatron-free": SearchSpace(schedules=("1f1b",), recompute=("none", "selective", "full"),
                                 tp_overlap=("none",), zero=(0,), name="Megatron-LM-like (free)",
                                 **_BASE),
    "deepspeed-free": SearchSpace(schedules=("1f1b",), recompute=("none", "selective", "full"),
                                  tp_overlap=("none",), zero=(1,), name="DeepSpeed-like (free)",
                                  **_BASE),
    # Ablation: start from the union of the two baselines, add one technique at a time.
    "baseline": SearchSpace(schedules=("1f1b",), recompute=("full",), tp_overlap=("none",),
                            zero=(0, 1), name="1F1B + full recompute", **_BASE),
    "+T1": SearchSpace(schedules=("shifted-critical-path",), recompute=("full",),
                       tp_overlap=("none",), zero=(0, 1), name="+ shifted critical path (T1)",
                       **_BASE),
    "+T2": SearchSpace(schedules=("shifted-critical-path",), recompute=("stage-aware",),
                       tp_overlap=("none",), zero=(0, 1),
                       name="+ stage-aware recompute (T1+T2)", **_BASE),
    "merak": SearchSpace(schedules=("shifted-critical-path",), recompute=("stage-aware",),
                         tp_overlap=("sub-pipelined",), zero=(0, 1),
                         name="Merak (T1+T2+T3)", **_BASE),
}


@dataclass(frozen=True, slots=True)
class Candidate:
    """One point of the space (before recompute fractions are chosen).

    ``pruned`` names the divisibility rule it breaks, or is empty.
    """

    dp: int
    tp: int
    pp: int
    virtual_stages: int
    micro_batch_size: int
    microbatches: int
    schedule: str
    recompute: str
    sequence_parallel: bool
    tp_overlap: str
    zero: int
    pruned: str = ""
    cp: int = 1
    zero_group: int = 0
    attention: str = "auto"
    overlap_param_gather: bool = False
    ep: int = 1

    def table_key(self) -> tuple:
        """What the cost table depends on (not the schedule or the checkpointed
        fraction; selective recompute changes the backward and the kept bytes; the
        placement decides which model stages share a rank, hence the sends and the
        per-rank gradient reduction)."""
        spec = SCHEDULES.get(self.schedule)
        return (self.dp, self.tp, self.pp, self.virtual_stages, self.micro_batch_size,
                self.sequence_parallel, self.tp_overlap, self.zero,
                self.recompute == "selective", self.cp, self.zero_group, self.attention,
                spec.placement if spec is not None else "", self.ep)


def _collapse(values, applicable: bool, off):
    vals = tuple(dict.fromkeys(values))
    if applicable:
        return vals
    return (off,)


#: One variant of a block: (recompute, sequence parallelism, TP overlap, ZeRO stage,
#: shard group, attention, overlap of the DP synchronisation).
Variant = tuple[str, bool, str, int, int, str, bool]


@dataclass(frozen=True, slots=True)
class Block:
    """Candidates sharing (dp, tp, pp, virtual stages, micro-batch, schedule, cp): the
    product of their variants in enumeration order, so a large search handles them as
    arrays instead of one object each.

    ``variants`` is shared between blocks of one option set (intern it, do not copy);
    ``rules`` maps (ZeRO stage, sequence parallelism) to the rule that prunes those
    variants ("" when none).
    """

    dp: int
    tp: int
    pp: int
    virtual_stages: int
    micro_batch_size: int
    microbatches: int
    schedule: str
    cp: int
    variants: tuple[Variant, ...]
    rules: tuple[tuple[tuple[int, bool], str], ...]
    ep: int = 1

    def candidate(self, i: int) -> Candidate:
        """The ``i``-th candidate of the block."""
        rc, sp, ov, z, zg, att, odp = self.variants[i]
        return Candidate(self.dp, self.tp, self.pp, self.virtual_stages,
                         self.micro_batch_size, self.microbatches, self.schedule, rc, sp, ov,
                         z, dict(self.rules)[z, sp], self.cp, zg, att, odp, self.ep)

    def candidates(self) -> Iterator[Candidate]:
        """Every candidate of the block, in enumeration order."""
        rules = dict(self.rules)
        for rc, sp, ov, z, zg, att, odp in self.variants:
            # Positional, in field order (pruned, cp, zero_group, attention, overlap).
            yield Candidate(self.dp, self.tp, self.pp, self.virtual_stages,
                            self.micro_batch_size, self.microbatches, self.schedule, rc, sp,
                            ov, z, rules[z, sp], self.cp, zg, att, odp, self.ep)


def enumerate_candidates(model, gpus: int, gpus_per_node: int, global_batch_size: int,
                         space: SearchSpace) -> Iterator[Candidate]:
    """Every candidate of ``space`` for ``model`` on ``gpus`` GPUs, those breaking a
    divisibility rule included (with ``pruned`` set) so reports can say why they lost."""
    for item in candidate_blocks(model, gpus, gpus_per_node, global_batch_size, space):
        if isinstance(item, Block):
            yield from item.candidates()
        else:
            yield item


def candidate_blocks(model, gpus: int, gpus_per_node: int, global_batch_size: int,
                     space: SearchSpace) -> Iterator[Candidate | Block]:
    """:func:`enumerate_candidates` grouped: the candidates pruned before a block is
    formed (a degree or batch rule) one by one, the rest as :class:`Block` values, in
    the same order."""
    tps = space.tp if space.tp is not None else tuple(divisors(gpus_per_node))
    interned: dict[tuple, tuple[Variant, ...]] = {}
    for tp in tps:
        try:
            if gpus % tp or gpus_per_node % tp:
                raise ValueError(f"tp={tp} does not divide the {gpus_per_node} GPUs of a node")
            model.check_tp(tp)
        except ValueError as e:
            yield Candidate(0, tp, 0, 1, 0, 0, "-", "-", False, "none", 0, pruned=str(e))
            continue
        for cp in space.cp:
            yield from _with_cp(model, gpus, tp, cp, global_batch_size, space, interned)


def _with_cp(model, gpus: int, tp: int, cp: int, global_batch_size: int,
             space: SearchSpace, interned: dict) -> Iterator[Candidate | Block]:
    """The candidates of one (tp, cp) pair."""
    try:
        if (gpus // tp) % cp:
            raise ValueError(f"cp={cp} does not divide {gpus // tp} = GPUs / tp")
        check_cp(model, cp)
    except ValueError as e:
        yield Candidate(0, tp, 0, 1, 0, 0, "-", "-", False, "none", 0, pruned=str(e), cp=cp)
        return
    rest = gpus // (tp * cp)
    pps = space.pp if space.pp is not None else tuple(divisors(rest))
    for pp in pps:
        if rest % pp:
            what = "GPUs / tp" if cp == 1 else "GPUs / (tp cp)"
            yield Candidate(0, tp, pp, 1, 0, 0, "-", "-", False, "none", 0,
                            pruned=f"pp={pp} does not divide {rest} = {what}", cp=cp)
            continue
        dp = rest // pp
        if pp > model.layers:
            yield Candidate(dp, tp, pp, 1, 0, 0, "-", "-", False, "none", 0,
                            pruned=f"pp={pp} exceeds the model's {model.layers} layers", cp=cp)
            continue
        if global_batch_size % dp:
            yield Candidate(dp, tp, pp, 1, 0, 0, "-", "-", False, "none", 0,
                            pruned=f"global batch {global_batch_size} is not divisible "
                                   f"by dp={dp}", cp=cp)
            continue
        per_replica = global_batch_size // dp
        if space.micro_batch_sizes is not None:
            mbss = space.micro_batch_sizes
        else:
            mbss = tuple(d for d in divisors(per_replica)
                         if d <= space.max_micro_batch_size)
        for mbs in mbss:
            if per_replica % mbs:
                yield Candidate(dp, tp, pp, 1, mbs, 0, "-", "-", False, "none", 0,
                                pruned=f"micro-batch {mbs} does not divide the "
                                       f"per-replica batch {per_replica}", cp=cp)
                continue
            M = per_replica // mbs
            scheds = space.schedules
            if pp == 1:
                keep = [s for s in scheds if not SCHEDULES[s].interleaved]
                scheds = tuple(keep[:1]) if keep else ()
            for ep in expert_degrees(model, tp * cp * dp, space.ep):
                for sched in scheds:
                    spec = SCHEDULES[sched]
                    vs = space.virtual_stages if spec.interleaved else (1,)
                    for v in vs:
                        yield _block(model, dp, tp, pp, v, mbs, M, sched, space, cp,
                                     interned, ep)


def expert_degrees(model, ranks: int, allowed: tuple[int, ...] | None) -> tuple[int, ...]:
    """The expert-parallel degrees of ``allowed`` (None: every divisor of the experts)
    that divide ``model``'s experts and fold onto a stage's ``ranks`` (tp x cp x dp,
    etp 1); (1,) for a dense model or when none folds (the candidate runs without
    expert parallelism, as an inapplicable option collapses)."""
    moe = getattr(model, "moe", None)
    if moe is None:
        return (1,)
    es = allowed if allowed is not None else tuple(divisors(moe.experts))
    return tuple(dict.fromkeys(e for e in es if moe.experts % e == 0 and ranks % e == 0)) or (1,)


def _block(model, dp, tp, pp, v, mbs, M, sched, space, cp, interned: dict,
           ep: int = 1) -> Block:
    spec = SCHEDULES[sched]
    if pp * v > model.layers:
        rule = f"pp={pp} x virtual stages {v} exceeds the model's {model.layers} layers"
    else:
        rule = spec.violation(pp, M, v)
    # What the variants and their rules read of the block: blocks alike in it share
    # them (most blocks differ only in pp, micro-batches and virtual stages).
    shared = ("block", sched, tp > 1, mbs % 2 == 0, dp * cp, rule)
    got = interned.get(shared)
    if got is None:
        got = interned[shared] = _variants(spec, sched, tp, mbs, dp * cp, rule, space,
                                           interned)
    return Block(dp, tp, pp, v, mbs, M, sched, cp, *got, ep)


def _variants(spec, sched: str, tp: int, mbs: int, replicas: int, rule: str,
              space: SearchSpace, interned: dict) -> tuple[tuple, tuple]:
    """(variants, rules) of a block (:class:`Block`); ``replicas``: dp x cp."""
    rcs = tuple(r for r in space.recompute if spec.pairs_with(r))
    sps = _collapse(space.sequence_parallel, tp > 1, False)
    # Sub-pipelined TP needs an even micro-batch; the chunked overlaps any micro-batch
    # but sequence parallelism (paired below).
    ovs = tuple(dict.fromkeys(o if (o == "none" or (tp > 1 and (o in CHUNKED_OVERLAPS
                                                                 or mbs % 2 == 0)))
                              else "none" for o in space.tp_overlap))
    zgs = []
    for z in _collapse(space.zero, replicas > 1, 0):
        groups = tuple(dict.fromkeys(
            g for g in (space.zero_groups if z else (0,))
            if g == 0 or (g < replicas and replicas % g == 0)))
        zgs.extend((z, zg) for zg in groups or (0,))
    odps = _collapse(space.overlap_param_gather, replicas > 1, False)
    excluded = tuple(((z, sp), space.exclude(sched, z, sp) if space.exclude and not rule
                      else rule) for z in dict.fromkeys(z for z, _ in zgs) for sp in sps)
    # Recompute outermost, the attention and DP overlap innermost: the row order.
    key = (rcs, sps, ovs, tuple(zgs), space.attention, odps)
    variants = interned.get(key)
    if variants is None:
        variants = interned[key] = tuple(
            (rc, sp, ov, z, zg, att, odp)
            for rc, sp, ov, (z, zg), att, odp in product(rcs, sps, ovs, zgs, space.attention,
                                                        odps)
            if sp or ov not in CHUNKED_OVERLAPS)
    return variants, excluded
