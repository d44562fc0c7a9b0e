"""AnalyticCostModel: per-layer, per-action costs from FLOPs, bytes and link models.

Compute: per-layer costs (GEMMs, memory-bound kernels, backward halves, recompute,
sub-pipelined TP) in :mod:`merak_sim.costs.layers`. Communication: alpha-beta ring /
hierarchical collectives and Megatron rank placement, in :mod:`merak_sim.costs.comm`.
Memory capacity: the GPU's memory less what the runtime holds outside the allocator
(:mod:`merak_sim.runtime_memory`); the allocator's reservations per rank, the backend's
(:func:`merak_sim.allocator_memory.reserved_bytes`), go with the table.

Tensor parallelism adds 2 all-reduces of b*s*h activations per layer in forward and 2
in backward (sequence parallel: an all-gather and a reduce-scatter in place of each,
same bytes); the embedding adds one in forward, the LM head one in backward.
Data-parallel gradient all-reduce of the stage's 16-bit gradients (ZeRO-1: reduce-
scatter of gradients + all-gather of updated weights) goes to ``grad_allreduce_s``, plus,
on the first and last stage of a model with tied embeddings, the all-reduce that sums
the word-embedding gradient between those two stages (the TP collectives' timing and
overlap: :mod:`merak_sim.costs.tp_comm`).
Optimizer: Adam reads and writes fp32 master weights, m and v (24 bytes) and reads the
16-bit gradient and writes the 16-bit weight (4 bytes) per (sharded) parameter, memory
bound; fp8 training also casts the updated weights to their cached FP8 copy (3 bytes
per parameter).

ZeRO 1-3, FSDP and HSDP: :mod:`merak_sim.costs.sharded_dp` (ZeRO-3's per-layer
all-gathers and reduce-scatters are exposed inside ``forward_s`` / ``backward_s`` as far
as prefetching cannot hide them). Context parallelism: :mod:`merak_sim.costs.cp` (ring,
all-gather, a2a or a2a+ring; the ring in :mod:`merak_sim.costs.ring`: the exposed part
of the K/V exchange inside the same times). FP8 and flash
attention: :mod:`merak_sim.costs.layers` and :mod:`merak_sim.costs.kernels`; which
attention kernel a configuration runs: :mod:`merak_sim.costs.attention_choice`. MFU of
a low-precision configuration is quoted against the 16-bit peak (``CostTable.peak_flops``)
and the table's notes name it (:mod:`merak_sim.precision`).

Fixed costs per iteration (optimizer step, gradient-norm all-reduce, pipeline fill /
drain latency, slowest of N GPUs): :mod:`merak_sim.costs.fixed`, told as notes and
charged only where the cluster sets ``gpu_jitter_cv``.

Speed: layer costs are cached per (model, GPU, efficiency, dtype, micro-batch, tp,
sequence parallel, overlap) and communication per (cluster, group shape), so a
cost table for a new (pp, partition) costs O(stages).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from merak_sim.allocator_memory import reserved_bytes
from merak_sim.costs.attention_choice import attention_profile, resolve_attention
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.costs.comm import (
    CostModelError,
    check_pipeline_send,
    collective_time,
    group_ranks,
    pipeline_send_time,
    stage_placement,
)
from merak_sim.costs.cp import check_cp_comm, cp_notes, cp_pass
from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.fixed import charge_fixed, fixed_costs, fixed_notes
from merak_sim.costs.framework import DEFAULT_FRAMEWORK, FrameworkKernels
from merak_sim.costs.kernels import KernelEfficiency, default_kernels
from merak_sim.costs.layers import LayerCost, LayerOptions, edge_costs, layer_cost
from merak_sim.costs.moe import check_moe, moe_layers_in, moe_notes, moe_stage
from merak_sim.costs.param_balance import parameter_balanced
from merak_sim.costs.ring import check_cp
from merak_sim.costs.sharded_dp import (
    fsdp_collectives,
    fsdp_pass,
    fsdp_working_bytes,
    grad_sync_seconds,
    sixteen_bit_bytes,
    sync_groups,
)
from merak_sim.costs.tp_comm import tp_pass
from merak_sim.hardware import Cluster
from merak_sim.layout import DEFAULT_ORDER, RankLayout
from merak_sim.memory import (
    DTYPE_BYTES,
    ActivationProfile,
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
    layer_checkpoint_bytes,
    model_state_bytes,
    stage_input_bytes,
    stage_params,
)
from merak_sim.model import ModelSpec
from merak_sim.partition import (
    Partition,
    PartitionLike,
    as_ranges,
    time_balanced,
    uniform,
)
from merak_sim.precision import (
    get_precision,
    is_low_precision,
    mfu_notes,
    mfu_reference,
    optimizer_cast_bytes,
)
from merak_sim.runtime_memory import usable_memory_bytes
from merak_sim.sim.from_config import stage_rank

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig

#: Seconds of a collective: (kind, bytes, global ranks, cluster) -> seconds.
CollectiveTime = Callable[[str, float, tuple[int, ...], Cluster], float]

__all__ = ["AnalyticCostModel", "parameter_balanced"]


# ---------------------------------------------------------------- the model
class AnalyticCostModel:
    """Roofline-with-efficiency cost model (module docstring).

    Args:
        efficiency: the curve; None = the GPU type's default
            (:data:`merak_sim.costs.efficiency.DEFAULT_EFFICIENCY`).
        profile: activation storage profile (Korthikanti's with the attention kernel's
            storage on GPUs, ``cpu-eager`` on the CPU cluster when None:
            :mod:`merak_sim.costs.attention_choice`).
        partition_method: default partitioner when ``cost_table`` gets none:
            "uniform" (Megatron's default) or "time".
        collectives: how the cost table prices a collective, with
            :func:`~merak_sim.costs.comm.collective_time`'s signature; None: that
            alpha-beta model (TraceCostModel passes measured timings).
        pipeline_send: how activations cross a pipeline boundary, "full" or
            "scatter-gather" (:func:`~merak_sim.costs.comm.pipeline_send_time`;
            scatter-gather applies without sequence parallelism only).
        kernels: flash-attention / FP8 efficiency; None = the GPU type's default.
        framework: the framework's softmax / cross-entropy kernels
            (:mod:`merak_sim.costs.framework`; default: the fused charges).
    """

    def __init__(self, efficiency: Efficiency | None = None,
                 profile: ActivationProfile | None = None,
                 partition_method: str = "uniform",
                 collectives: CollectiveTime | None = None,
                 pipeline_send: str = "full",
                 kernels: KernelEfficiency | None = None,
                 framework: FrameworkKernels = DEFAULT_FRAMEWORK) -> None:
        if partition_method not in ("uniform", "time", "parameters"):
            raise CostModelError(f"unknown partition method {partition_method!r}; choose "
                                 "uniform, parameters or time")
        self.efficiency = efficiency
        self.profile = profile
        self.partition_method = partition_method
        self._comm = collectives or collective_time
        check_pipeline_send(pipeline_send)
        self.pipeline_send = pipeline_send
        self.kernels = kernels
        self.framework = framework

    def with_profile(self, profile: ActivationProfile) -> AnalyticCostModel:
        """The same model storing activations as ``profile`` says."""
        return AnalyticCostModel(self.efficiency, profile, self.partition_method,
                                 self._comm, self.pipeline_send, self.kernels, self.framework)

    def with_collectives(self, collectives: CollectiveTime) -> AnalyticCostModel:
        """The same model with collectives priced by ``collectives``."""
        return AnalyticCostModel(self.efficiency, self.profile, self.partition_method,
                                 collectives, self.pipeline_send, self.kernels, self.framework)

    # -- helpers shared with TraceCostModel
    def efficiency_for(self, cluster: Cluster) -> Efficiency:
        """The efficiency curve used on ``cluster``."""
        return self.efficiency or default_efficiency(cluster.gpu.name)

    def profile_for(self, cluster: Cluster, config: ParallelConfig | None = None
                    ) -> ActivationProfile:
        """The activation profile used on ``cluster`` for ``config``'s attention kernel
        (:func:`~merak_sim.costs.attention_choice.attention_profile`)."""
        return attention_profile(self.profile, config, cluster.gpu.name)

    @staticmethod
    def attention_kernel(cluster: Cluster, config: ParallelConfig) -> str:
        """The attention kernel timed for ``config`` on ``cluster``
        (:func:`~merak_sim.costs.attention_choice.resolve_attention`)."""
        return resolve_attention(config, cluster.gpu.name)

    @staticmethod
    def peak16(cluster: Cluster, config: ParallelConfig) -> float:
        """Peak FLOP/s of the 16-bit (or fp32) tensor operations: the attention and
        head kernels, and the reference of MFU (low-precision training: the bf16 peak,
        :func:`merak_sim.precision.mfu_reference`)."""
        return cluster.gpu.peak(mfu_reference(config.dtype))

    def layer_costs(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig
                    ) -> tuple[LayerCost, LayerCost, LayerCost]:
        """(transformer layer, embedding, head) compute costs for ``config``."""
        eff = self.efficiency_for(cluster)
        e = DTYPE_BYTES[config.dtype]
        peak = self.peak16(cluster, config)
        bw = cluster.gpu.mem_bandwidth_Bps
        parts = config.tp_overlap_parts if (config.tp_overlap == "sub-pipelined"
                                            and config.tp > 1) else 1
        prec = get_precision(config.dtype)
        opts = LayerOptions(attention=self.attention_kernel(cluster, config), cp=config.cp,
                            fp8_peak=(cluster.gpu.peak(config.dtype) * prec.gemm_factor
                                      if prec.low else 0.0),
                            cast_bytes=prec.cast_bytes(e) if prec.low else 0.0,
                            fused_elementwise=config.fused_elementwise,
                            kernels=self.kernels or default_kernels(cluster.gpu.name),
                            framework=self.framework)
        if opts == LayerOptions(kernels=opts.kernels):
            lay = layer_cost(model, peak, bw, eff, e, config.micro_batch_size, config.tp,
                             config.sequence_parallel, parts)
        else:
            lay = layer_cost(model, peak, bw, eff, e, config.micro_batch_size, config.tp,
                             config.sequence_parallel, parts, opts)
        emb, head = edge_costs(model, peak, bw, eff, e, config.micro_batch_size,
                                config.tp, config.sequence_parallel, config.cp, self.framework)
        return lay, emb, head

    def layer_breakdown(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                        costs: tuple[LayerCost, LayerCost, LayerCost] | None = None
                        ) -> dict[str, dict[str, Any]]:
        """Per layer kind ("embedding", "layer", "head") for one micro-batch on one GPU:
        compute seconds of forward / backward-input / backward-weight / recompute,
        exposed TP communication in forward and backward, FLOPs, achieved FLOP/s and
        activation bytes (first pipeline stage's TP group for the communication)."""
        self.check(model, cluster, config)
        lay, emb, head = costs or self.layer_costs(model, cluster, config)
        prof = self.profile_for(cluster, config)
        mbs, tp, sp, cp = (config.micro_batch_size, config.tp, config.sequence_parallel,
                           config.cp)
        rc = "selective" if config.recompute == "selective" else "none"
        acts = {
            "embedding": first_stage_extra_bytes(model, mbs, tp, sp, prof, config.dtype, cp),
            "layer": layer_activation_bytes(model, mbs, tp, sp, rc, prof, config.dtype, cp),
            "head": last_stage_extra_bytes(model, mbs, tp, sp, prof, config.dtype, cp),
        }
        params = {
            "embedding": stage_params(model, 0, True, False, tp),
            "layer": model.layer_params_sharded() / tp + model.layer_params_replicated(),
            "head": stage_params(model, 0, False, True, tp) - (
                model.vocab * model.hidden / tp if model.tied_embeddings else 0),
        }
        rows = {}
        for kind, c in (("embedding", emb), ("layer", lay), ("head", head)):
            f_comm = tp_pass(self._comm, c, "fwd", cluster, config, 0,
                             c.forward_s if kind == "layer" else 0.0)[1]
            b_comm = tp_pass(self._comm, c, "bwd", cluster, config, 0,
                             c.backward_input_s + c.backward_weight_s
                             if kind == "layer" else 0.0)[1]
            rec = c.forward_s if c.recompute_s is None else c.recompute_s
            total = c.forward_s + c.backward_input_s + c.backward_weight_s
            act = acts[kind] if c.activation_bytes is None else c.activation_bytes
            rows[kind] = {
                "forward_s": c.forward_s, "backward_input_s": c.backward_input_s,
                "backward_weight_s": c.backward_weight_s, "recompute_s": rec,
                "selective_recompute_s": c.attn_core_s if kind == "layer" else 0.0,
                "tp_comm_fwd_s": f_comm, "tp_comm_bwd_s": b_comm, "flops": c.flops,
                "achieved_flops": c.flops / total if total > 0 else 0.0,
                "activation_bytes": act,
                "checkpoint_bytes": (layer_checkpoint_bytes(model, mbs, tp, sp, prof,
                                                            config.dtype, cp)
                                     if kind == "layer" else act),
                "params": params[kind], "source": c.source,
            }
        return rows

    def comm_time(self, collective: str, nbytes: float, ranks: tuple[int, ...],
                  cluster: Cluster) -> float:
        """Seconds for ``collective`` of ``nbytes`` among global ``ranks``."""
        return collective_time(collective, nbytes, tuple(ranks), cluster)

    def check(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig) -> None:
        """Raise a one-line ValueError if ``config`` cannot run ``model`` on ``cluster``."""
        model.check_tp(config.tp)
        model.check_pp(config.pp, config.virtual_stages)
        check_moe(model, config)
        try:
            check_cp(model, config.cp)
            check_cp_comm(model, config)
        except ValueError as e:
            raise CostModelError(str(e)) from None
        if config.world_size > cluster.world_size:
            raise CostModelError(
                f"config needs {'dp*cp*tp*pp' if config.cp > 1 else 'dp*tp*pp'} = "
                f"{config.world_size} GPUs but cluster "
                f"{cluster.name} has {cluster.world_size} (raise --nodes)")
        if is_low_precision(config.dtype):
            cluster.gpu.peak(config.dtype)  # refuses a format the GPU lacks, one line

    def default_partition(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig
                          ) -> Partition:
        """The partition used when ``cost_table`` gets none."""
        n = config.pp * config.virtual_stages
        if self.partition_method == "uniform":
            return uniform(model.layers, n)
        if self.partition_method == "parameters":
            return parameter_balanced(model, n, config.tp)
        return self.time_partition(model, cluster, config)

    def time_partition(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig
                       ) -> Partition:
        """Stages balanced by this model's forward + backward time per layer."""
        lay, emb, head = self.layer_costs(model, cluster, config)
        t = lay.forward_s + lay.backward_input_s + lay.backward_weight_s
        return time_balanced([t] * model.layers, config.pp * config.virtual_stages,
                             emb.forward_s + emb.backward_weight_s,
                             head.forward_s + head.backward_input_s + head.backward_weight_s)

    def cost_table(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                   partition: PartitionLike | None = None) -> CostTable:
        """Per-model-stage costs (see :class:`~merak_sim.costs.base.StageCost`)."""
        self.check(model, cluster, config)
        n_st = config.pp * config.virtual_stages
        if partition is None:
            partition = self.default_partition(model, cluster, config)
        ranges = as_ranges(partition, model.layers, n_st)
        lay, emb, head = self.layer_costs(model, cluster, config)
        return self.table_from_layers(model, cluster, config, ranges, lay, emb, head)

    def table_from_layers(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                          ranges: tuple[tuple[int, int], ...], lay: LayerCost,
                          emb: LayerCost, head: LayerCost,
                          extra_notes: tuple[str, ...] = (),
                          extra_meta: dict | None = None) -> CostTable:
        """The cost table of ``ranges`` from the per-layer costs ``lay``, ``emb`` and
        ``head`` (how TraceCostModel prices measured layers the same way)."""
        # Stages that agree in layer count, position (first/last) and the placement of
        # their groups cost the same: price each distinct one once.
        n_st = len(ranges)
        layout = RankLayout.of(config)
        memo: dict[tuple, StageCost] = {}
        stages_l = []
        for g, (s, e) in enumerate(ranges):
            here = stage_rank(config, g)
            nxt = stage_rank(config, g + 1) if g < n_st - 1 else here
            # The next stage's rank joins the key: under the V placement two stages of
            # one rank send in opposite directions (or locally, at the turn).
            key = (e - s, g == 0, g == n_st - 1,
                   stage_placement(cluster, layout, here, g == n_st - 1),
                   nxt - here, here if config.cp > 1 else None, moe_layers_in(model, s, e))
            st = memo.get(key)
            if st is None:
                st = memo[key] = moe_stage(  # MoE layers priced as such (costs.moe)
                    self.stage_cost(model, cluster, config, g, e - s, lay, emb, head), model,
                    cluster, config, here, key[-1],
                    stage_params(model, e - s, g == 0, g == n_st - 1, config.tp), self)
            stages_l.append(st)
        fixed = fixed_costs(self._comm, cluster, config, tuple(stages_l))  # costs.fixed
        stages = charge_fixed(fixed, config, tuple(stages_l))
        eff = self.efficiency_for(cluster)
        placed = ((f"ranks placed {config.order} (fastest varying first; Megatron's is "
                   f"{DEFAULT_ORDER})",) if config.order != DEFAULT_ORDER else ())
        notes = tuple(cluster.notes) + ((f"model: {model.source}",) if model.source else ()) \
            + tuple(extra_notes) + placed + cp_notes(model, cluster, config, lay.cp_kv_bytes) \
            + moe_notes(
                model, cluster, config, self,
                max(moe_layers_in(model, s, e) for s, e in ranges) * config.virtual_stages)
        return CostTable(
            stages=stages,
            memory_capacity_bytes=usable_memory_bytes(cluster.gpu),
            peak_flops=self.peak16(cluster, config),
            notes=notes + mfu_notes(cluster.gpu, config.dtype) + fixed_notes(fixed),
            meta={"source": "analytic", "mfu_reference": mfu_reference(config.dtype),
                  "efficiency": eff.to_dict(),
                  "profile": self.profile_for(cluster, config).name, "ranges": ranges,
                  "cluster": cluster.name, "model": model.name, **(extra_meta or {})},
            tied_embeddings=model.tied_embeddings and config.pp > 1,
            reserved_bytes=reserved_bytes(model, cluster.gpu.name, config,
                                          [st.layers for st in stages]),
        )

    # Stage assembly is cheap arithmetic over the cached layer costs.
    def stage_cost(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig, g: int,
                   n: int, lay: LayerCost, emb: LayerCost, head: LayerCost) -> StageCost:
        """The StageCost of model stage ``g`` holding ``n`` transformer layers (``lay``),
        plus the embedding (``emb``) on the first and the head (``head``) on the last."""
        n_st = config.pp * config.virtual_stages
        pp_rank = stage_rank(config, g)
        first, last = g == 0, g == n_st - 1
        tp = config.tp
        lay_f = tp_pass(self._comm, lay, "fwd", cluster, config, pp_rank, lay.forward_s)
        lay_b = tp_pass(self._comm, lay, "bwd", cluster, config, pp_rank,
                              lay.backward_input_s + lay.backward_weight_s)
        lay_f_comm, lay_b_comm = lay_f[1], lay_b[1]
        ring = cp_pass(self._comm, cluster, config, pp_rank, model, lay.cp_kv_bytes,
                       lay.attn_fwd_s, lay.attn_bwd_s)
        fwd_layer = lay.forward_s + lay_f_comm + ring.fwd_exposed_s
        rec_layer = ((lay.forward_s if lay.recompute_s is None else lay.recompute_s)
                     + lay_f_comm + ring.fwd_exposed_s)
        fwd = n * fwd_layer
        bin_ = n * (lay.backward_input_s + lay_b_comm + ring.bwd_exposed_s)
        bw = n * lay.backward_weight_s
        flops = n * lay.flops
        # TP collectives of the stage: (total, exposed, bytes) per pass; the exposed
        # parts are exactly what the times above include.
        tp_f = [n * lay_f[0], n * lay_f_comm, n * lay_f[2]]
        tp_b = [n * lay_b[0], n * lay_b_comm, n * lay_b[2]]
        tp_r = tuple(tp_f)  # the re-forward repeats the layers' collectives
        if first:
            emb_c = tp_pass(self._comm, emb, "fwd", cluster, config, pp_rank, 0.0)
            fwd += emb.forward_s + emb_c[1]
            bw += emb.backward_weight_s
            tp_f = [a + b for a, b in zip(tp_f, emb_c, strict=True)]
        if last:
            head_c = tp_pass(self._comm, head, "bwd", cluster, config, pp_rank, 0.0)
            fwd += head.forward_s
            bin_ += head.backward_input_s + head_c[1]
            bw += head.backward_weight_s
            flops += head.flops
            tp_b = [a + b for a, b in zip(tp_b, head_c, strict=True)]
        back = bin_ + bw
        if config.recompute == "selective":
            back += n * lay.attn_core_s
            bin_ += n * lay.attn_core_s
        act, ckpt, inp, p2p = self._stage_activations(model, cluster, config, n, first, last,
                                                      lay, emb, head)
        dt = config.dtype
        params = stage_params(model, n, first, last, tp)
        shard = config.shard_group if config.zero else 1
        state = model_state_bytes(params, dt, shard, config.zero)
        # Working buffers of the cp exchange, held one layer at a time (costs.cp).
        weight_b, grad_b = state.weight_bytes + ring.working_bytes, state.grad_bytes
        fsdp = {}
        if config.zero == 3:
            fsdp, (gw, gg) = self._zero3(model, cluster, config, pp_rank, n, first, last,
                                         params, lay, emb, head)
            fwd += fsdp["fsdp_exposed_fwd_s"]
            bin_ += fsdp["fsdp_exposed_bwd_s"]
            back += fsdp["fsdp_exposed_bwd_s"]
            weight_b += gw
            grad_b += gg
        send = self._send_time(cluster, config, g, pp_rank, last, p2p)
        grad_ar = self._grad_sync_time(model, cluster, config, pp_rank, first or last, params,
                                       state.grad_bytes, shard)
        eff = self.efficiency_for(cluster)
        opt_params = params / (shard if config.zero >= 1 else 1)
        per_param = (28 if dt != "fp32" else 36) + optimizer_cast_bytes(dt)
        optimizer = eff.mem_time(opt_params * per_param, cluster.gpu.mem_bandwidth_Bps, 4)
        return StageCost(
            forward_s=fwd, backward_s=back, backward_input_s=bin_, backward_weight_s=bw,
            recompute_s=n * rec_layer, send_activation_s=send, grad_allreduce_s=grad_ar,
            optimizer_s=optimizer, activation_bytes=act, checkpoint_bytes=ckpt,
            input_bytes=inp, weight_bytes=weight_b,
            grad_bytes=grad_b, optimizer_bytes=state.optimizer_bytes,
            p2p_bytes=p2p, flops=flops, layers=n,
            tp_comm_fwd_s=tp_f[0], tp_exposed_fwd_s=tp_f[1], tp_bytes_fwd=tp_f[2],
            tp_comm_bwd_s=tp_b[0], tp_exposed_bwd_s=tp_b[1], tp_bytes_bwd=tp_b[2],
            tp_comm_recompute_s=tp_r[0], tp_exposed_recompute_s=tp_r[1],
            tp_bytes_recompute=tp_r[2], **fsdp,
        )

    def _stage_activations(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                           n: int, first: bool, last: bool, lay: LayerCost, emb: LayerCost,
                           head: LayerCost) -> tuple[float, float, float, float]:
        """Bytes per GPU of one micro-batch on a stage: (activations kept, checkpointed
        inputs, the F* input, the activation sent on), the embedding's and head's extras
        included in the first two."""
        tp, mbs, sp, cp = (config.tp, config.micro_batch_size, config.sequence_parallel,
                           config.cp)
        prof = self.profile_for(cluster, config)
        dt = config.dtype
        rc = "selective" if config.recompute == "selective" else "none"
        act = n * (layer_activation_bytes(model, mbs, tp, sp, rc, prof, dt, cp)
                   if lay.activation_bytes is None else lay.activation_bytes)
        ckpt = n * layer_checkpoint_bytes(model, mbs, tp, sp, prof, dt, cp)
        extra = 0.0
        if first:
            extra += (first_stage_extra_bytes(model, mbs, tp, sp, prof, dt, cp)
                      if emb.activation_bytes is None else emb.activation_bytes)
        if last:
            extra += (last_stage_extra_bytes(model, mbs, tp, sp, prof, dt, cp)
                      if head.activation_bytes is None else head.activation_bytes)
        # F* keeps the stage input: token ids on the first stage, else the residual
        # stream received from the previous stage (sharded with sp, as it is sent).
        inp = (mbs * model.seq_len / cp * 8.0 if first else
               stage_input_bytes(model, mbs, tp, sp, prof, dt, cp))
        p2p = 0.0 if last else stage_input_bytes(model, mbs, tp, sp, prof, dt, cp)
        return act + extra, ckpt + extra, inp, p2p

    def _send_time(self, cluster: Cluster, config: ParallelConfig, g: int, pp_rank: int,
                   last: bool, p2p: float) -> float:
        """Seconds to send stage ``g``'s activation to the next stage (0 on the last
        stage or a hand-off to a chunk of the same rank)."""
        nxt = stage_rank(config, g + 1) if not last else pp_rank
        if nxt == pp_rank:
            return 0.0
        mode = "full" if config.sequence_parallel else self.pipeline_send
        return pipeline_send_time(mode, p2p, group_ranks("tp", config, pp_rank),
                                  group_ranks("tp", config, nxt), cluster, self._comm)

    def _grad_sync_time(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
                        pp_rank: int, ends: bool, params: float, grad_bytes: float,
                        shard: int) -> float:
        """Seconds of the stage's data-parallel gradient sync, plus the tied embedding's
        all-reduce between the first and the last stage (``ends``: this is one)."""
        if config.zero == 0 and config.cp == 1:
            grad_ar = 0.0
            if config.dp > 1:
                ranks = group_ranks("dp", config, pp_rank)
                grad_ar = self._comm("all-reduce", grad_bytes, ranks, cluster)
        else:
            grad_ar = grad_sync_seconds(self._comm, cluster, config, pp_rank, params)
        n_st = config.pp * config.virtual_stages
        if model.tied_embeddings and ends and n_st > 1:
            # The tied word embedding lives on the first and the last stage; their
            # gradients are summed by an all-reduce between the two (Megatron; Merak
            # does the same for tied weights across stages).
            a = group_ranks("tp", config, 0)[0]
            b = group_ranks("tp", config, stage_rank(config, n_st - 1))[0]
            if a != b:
                per = model.vocab * model.hidden / config.tp
                tied = per * sixteen_bit_bytes(config.dtype) / shard if config.zero >= 2 \
                    else per * grad_bytes / max(params, 1)
                grad_ar += self._comm("all-reduce", tied, (a, b), cluster)
        return grad_ar

    def _zero3(self, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
               pp_rank: int, n: int, first: bool, last: bool, params: float,
               lay: LayerCost, emb: LayerCost, head: LayerCost
               ) -> tuple[dict[str, float], tuple[float, float]]:
        """A ZeRO-3 stage's all-gathers and reduce-scatters as StageCost ``fsdp_*``
        fields, and the (weight, gradient) bytes of the units gathered at once."""
        units = self._fsdp_units(model, n, first, last, config.tp, params)
        fs = self._fsdp(cluster, config, pp_rank, units, lay, emb, head, first, last, n)
        g_sh = len(sync_groups(config, pp_rank)[1])
        sent = sum(units) * sixteen_bit_bytes(config.dtype) * (g_sh - 1) / max(g_sh, 1)
        fields = dict(fsdp_comm_fwd_s=fs.fwd_total_s, fsdp_exposed_fwd_s=fs.fwd_exposed_s,
                      fsdp_comm_bwd_s=fs.bwd_total_s, fsdp_exposed_bwd_s=fs.bwd_exposed_s,
                      fsdp_bytes_fwd=sent, fsdp_bytes_bwd=2 * sent)
        return fields, fsdp_working_bytes([u for u in units if u > 0], config.dtype)

    @staticmethod
    def _fsdp_units(model: ModelSpec, n: int, first: bool, last: bool, tp: int,
                    params: float) -> list[float]:
        """Parameters per GPU of each FSDP unit of a stage in forward order: the
        embedding (first stage), each layer, the head (last stage)."""
        per_layer = stage_params(model, 1, False, False, tp)
        emb = stage_params(model, 0, True, False, tp) if first else 0.0
        head = params - n * per_layer - emb
        return ([emb] if first else []) + [per_layer] * n + ([head] if last else [])

    def _fsdp(self, cluster: Cluster, config: ParallelConfig, pp_rank: int,
              units: list[float], lay: LayerCost, emb: LayerCost, head: LayerCost,
              first: bool, last: bool, n: int):
        """ZeRO-3 collectives of one micro-batch through the stage's units."""
        _ranks, shard, _rep = sync_groups(config, pp_rank)
        e = sixteen_bit_bytes(config.dtype)
        ag, rs = fsdp_collectives(self._comm, [u * e for u in units], shard, cluster)
        fwd = ([emb.forward_s] if first else []) + [lay.forward_s] * n + (
            [head.forward_s] if last else [])
        bwd = ([emb.backward_weight_s] if first else []) + [
            lay.backward_input_s + lay.backward_weight_s] * n + (
            [head.backward_input_s + head.backward_weight_s] if last else [])
        return fsdp_pass(ag, rs, fwd, bwd)
