"""ParallelConfig: the one validated description of how a job is parallelised.

The simulator, the planner and the real backend (merak_exec) all take this type, so a
configuration evaluated in simulation is exactly the one dispatched to a cluster.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from merak_sim.layout import DEFAULT_ORDER, RankLayout
from merak_sim.schedule import SCHEDULES

__all__ = ["ParallelConfig", "RECOMPUTE_POLICIES", "TP_OVERLAPS", "DTYPES", "ATTENTIONS",
           "ZERO_STAGES", "CP_COMMS"]

RECOMPUTE_POLICIES = ("none", "full", "selective", "stage-aware")
#: "sub-pipelined": Merak T3 (micro-batch parts); "te-chunked" / "async-tp": Transformer
#: Engine's userbuffers and torch's async TP, chunked with the GEMMs at any micro-batch
#: (:mod:`merak_sim.costs.tp_overlap`; they need sequence parallelism).
TP_OVERLAPS = ("none", "sub-pipelined", "te-chunked", "async-tp")
#: Training precisions (:mod:`merak_sim.precision`: GEMM rates, casts, state memory):
#: fp8 per-tensor scaling, fp8-block (128-element blocks), mxfp8 and nvfp4 (Blackwell).
DTYPES = ("bf16", "fp16", "fp32", "fp8", "fp8-block", "mxfp8", "nvfp4")
#: "auto": flash on CUDA GPU presets, the measured PyTorch profile on the CPU cluster
#: (:func:`merak_sim.costs.attention_choice.resolve_attention`, the one place that
#: decides, for both time and memory); "flash" / "unfused" force one kernel.
ATTENTIONS = ("auto", "flash", "unfused")
ZERO_STAGES = (0, 1, 2, 3)
#: How context-parallel ranks exchange keys and values (:mod:`merak_sim.costs.cp`):
#: ring attention (Megatron's p2p), all-gather (Llama 3), a2a (Ulysses), a2a+ring.
CP_COMMS = ("ring", "all-gather", "a2a", "a2a+ring")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    """Degrees of parallelism, batch split, schedule and Merak technique choices.

    Attributes:
        dp, tp, pp: data, tensor and pipeline parallel degrees.
        virtual_stages: model chunks per pipeline rank (interleaved schedules only).
        micro_batch_size: samples per micro-batch per data-parallel replica.
        global_batch_size: samples per iteration over all replicas; the number of
            micro-batches is ``global_batch_size // (dp * micro_batch_size)``.
        schedule: a name from :data:`merak_sim.schedule.SCHEDULES`.
        recompute: "none", "full" (every layer checkpointed), "selective"
            (Korthikanti et al. 2022: only the attention core recomputed) or
            "stage-aware" (Merak T2: fractions from ``recompute_c0`` or explicit
            ``recompute_fractions``, one per pipeline rank).
        sequence_parallel: Megatron sequence parallelism with tp.
        tp_overlap: "none", "sub-pipelined" (Merak T3, ``tp_overlap_parts`` parts), or
            "te-chunked" / "async-tp" (sequence parallelism's collectives pipelined
            chunk by chunk with their GEMMs: :mod:`merak_sim.costs.tp_overlap`).
        zero: ZeRO stage over the data-parallel ranks: 0 (replicated), 1 (optimizer
            states sharded; gradients reduce-scattered and weights all-gathered after
            the step, Megatron's distributed optimizer), 2 (gradients sharded too), 3
            (parameters sharded too: FSDP, a per-layer all-gather in forward and again
            in backward and a per-layer gradient reduce-scatter).
        zero_group: ranks one shard group spans (HSDP: shard inside groups of this
            many data-parallel ranks, replicate across them); 0 = all of dp x cp.
        cp: context-parallel degree (ring attention over the sequence).
        cp_comm: how the cp ranks exchange keys and values, one of :data:`CP_COMMS`
            (Megatron's --cp-comm-type; :mod:`merak_sim.costs.cp`); "ring" by default.
        attention: one of :data:`ATTENTIONS`.
        overlap_param_gather: overlap the data-parallel gradient reduction with the
            last backwards and, under ZeRO 1/2, the distributed optimizer's parameter
            all-gather with compute (Megatron's --overlap-grad-reduce
            --overlap-param-gather; the engine runs the all-gather in the buckets).
        dtype: training precision: bf16 / fp16 / fp32, or fp8 / fp8-block / mxfp8 /
            nvfp4 (GEMMs in that format with 16-bit activations and mixed-precision
            master weights and optimizer: :mod:`merak_sim.precision`).
        fused_elementwise: the norms, rotary embedding and activation run as fused
            kernels (Megatron, Transformer Engine, torch.compile); False: one eager
            PyTorch kernel per op (:mod:`merak_sim.costs.fusion`).
        order: placement of ranks, the four axes fastest varying first
            (:class:`merak_sim.layout.RankLayout`; Megatron's "tp-cp-dp-pp" by default).
        ep, etp: expert-parallel and expert-tensor-parallel degrees of an MoE model's
            expert layers, folded over each pipeline stage's tp x cp x dp ranks
            (Megatron's parallel folding: :class:`~merak_sim.layout.RankLayout`; the
            expert-data-parallel degree is the rest). etp defaults to 1, as Megatron-
            Bridge's MoE recipes set it.
        moe_a2a_overlap: hide the expert all-to-alls behind another micro-batch's
            compute (Megatron's 1F1B A2A overlap; :mod:`merak_sim.costs.moe`).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    virtual_stages: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"
    recompute_c0: float = 0.75
    recompute_fractions: tuple[float, ...] | None = None
    sequence_parallel: bool = False
    tp_overlap: str = "none"
    tp_overlap_parts: int = 2
    zero: int = 0
    zero_group: int = 0
    cp: int = 1
    cp_comm: str = "ring"
    attention: str = "auto"
    overlap_param_gather: bool = False
    dtype: str = "bf16"
    fused_elementwise: bool = True
    order: str = DEFAULT_ORDER
    ep: int = 1
    etp: int = 1
    moe_a2a_overlap: bool = False
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def world_size(self) -> int:
        """dp * cp * tp * pp GPUs."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def shard_group(self) -> int:
        """Ranks a ZeRO shard group spans (dp * cp unless ``zero_group`` is set)."""
        return self.zero_group or self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per iteration per pipeline."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    def validate(self) -> None:
        """Raise ValueError naming the offending numbers; never assert."""
        for name in ("dp", "tp", "pp", "virtual_stages", "micro_batch_size",
                     "global_batch_size", "tp_overlap_parts", "cp"):
            val = getattr(self, name)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if self.global_batch_size % (self.dp * self.micro_batch_size):
            raise ValueError(
                f"global batch {self.global_batch_size} is not divisible by dp * micro-batch "
                f"size = {self.dp} * {self.micro_batch_size}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {self.schedule!r}; choose one of: {', '.join(SCHEDULES)}"
            )
        if self.recompute not in RECOMPUTE_POLICIES:
            raise ValueError(
                f"unknown recompute policy {self.recompute!r}; choose one of: "
                f"{', '.join(RECOMPUTE_POLICIES)}"
            )
        if not 0.0 <= self.recompute_c0 <= 1.0:
            raise ValueError(f"recompute_c0 must lie in [0, 1], got {self.recompute_c0}")
        if self.recompute_fractions is not None:
            if len(self.recompute_fractions) != self.pp:
                raise ValueError(
                    f"recompute_fractions has {len(self.recompute_fractions)} entries for "
                    f"pp={self.pp}"
                )
            if any(not 0.0 <= c <= 1.0 for c in self.recompute_fractions):
                raise ValueError(f"recompute_fractions must lie in [0, 1]: "
                                 f"{self.recompute_fractions}")
        if self.tp_overlap not in TP_OVERLAPS:
            raise ValueError(
                f"unknown tp overlap {self.tp_overlap!r}; choose one of: {', '.join(TP_OVERLAPS)}"
            )
        if self.tp_overlap == "sub-pipelined" and self.micro_batch_size % self.tp_overlap_parts:
            raise ValueError(
                f"sub-pipelined TP splits a micro-batch into {self.tp_overlap_parts} parts: "
                f"micro-batch size {self.micro_batch_size} is not divisible by it"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence parallelism needs tp > 1")
        if self.tp_overlap in ("te-chunked", "async-tp") and not self.sequence_parallel:
            raise ValueError(f"tp overlap {self.tp_overlap} chunks sequence parallelism's "
                             "all-gathers and reduce-scatters: add sequence_parallel "
                             "(--sequence-parallel, tp > 1)")
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ValueError(f"zero stage {self.zero!r} unknown; choose 0, 1, 2 or 3")
        if (not isinstance(self.zero_group, int) or isinstance(self.zero_group, bool)
                or self.zero_group < 0 or (self.zero_group
                                           and (self.dp * self.cp) % self.zero_group)):
            raise ValueError(
                f"zero group {self.zero_group!r} must divide dp * cp = {self.dp * self.cp} "
                "(0: shard over all of them)")
        if self.zero_group and not self.zero:
            raise ValueError(f"zero group {self.zero_group} needs a ZeRO stage (zero >= 1)")
        if self.cp_comm not in CP_COMMS:
            raise ValueError(f"unknown cp comm {self.cp_comm!r}; choose one of: "
                             f"{', '.join(CP_COMMS)}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {self.attention!r}; choose one of: "
                             f"{', '.join(ATTENTIONS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}")
        if not isinstance(self.fused_elementwise, bool):
            raise ValueError(f"fused_elementwise must be true or false, got "
                             f"{self.fused_elementwise!r}")
        # Names a bad order, or expert degrees that do not fold over the ranks.
        RankLayout(self.dp, self.tp, self.pp, self.cp, self.order, self.ep, self.etp)
        if not isinstance(self.moe_a2a_overlap, bool):
            raise ValueError(f"moe_a2a_overlap must be true or false, got "
                             f"{self.moe_a2a_overlap!r}")
        if self.virtual_stages > 1 and not SCHEDULES[self.schedule].interleaved:
            interleaving = ", ".join(n for n, s in SCHEDULES.items() if s.interleaved)
            raise ValueError(
                f"virtual stages {self.virtual_stages} need an interleaved schedule "
                f"({interleaving}), not {self.schedule}"
            )

    @property
    def placement(self) -> str:
        """Where the schedule puts model stages (its spec's ``placement``)."""
        spec = SCHEDULES.get(self.schedule)
        return spec.placement if spec is not None else "loop"

    def to_dict(self) -> dict:
        """Plain-JSON form (stable keys), the inverse of :meth:`from_dict`."""
        d = asdict(self)
        d.pop("extra")
        if d["recompute_fractions"] is not None:
            d["recompute_fractions"] = list(d["recompute_fractions"])
        return d

    @staticmethod
    def from_dict(d: dict) -> ParallelConfig:
        """Build from :meth:`to_dict` output; unknown keys are an error naming the key."""
        known = set(ParallelConfig.__dataclass_fields__) - {"extra"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown parallel-config field(s): {', '.join(sorted(unknown))}")
        d = dict(d)
        if d.get("recompute_fractions") is not None:
            d["recompute_fractions"] = tuple(float(x) for x in d["recompute_fractions"])
        return ParallelConfig(**d)


