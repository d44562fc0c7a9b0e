"""Costs and memory of mixture-of-experts layers with expert parallelism.

The analytic cost model prices every layer as a dense one; :func:`moe_stage` then turns
a stage's dense MLPs into MoE layers (the model's MoE layers among the stage's layers:
:func:`moe_layers_in`) inside the same :class:`~merak_sim.costs.base.StageCost`, as the
tensor-parallel collectives are priced inside the action times (an explicit all-to-all
action in the engine is left to the engine's rewrite). Per MoE layer, one micro-batch,
on the busiest expert-parallel rank (:func:`moe_layer_cost`):

- Tokens: each GPU routes t = b s / (cp tp) tokens (sequence-parallel under tp, as
  Megatron requires for MoE with tp > 1), each to k experts. With parallel folding an
  expert-tensor group of etp GPUs serves E / ep experts for its ep group, so one GPU's
  experts see etp t k tokens on average, ``load`` (:func:`merak_sim.moe.busiest_load`)
  times that on the busiest rank, or etp ep t k load / E tokens per expert.
- Router: the h x E GEMM on the t tokens and its fp32 scores / top-k (3 passes over
  t x E x 4 bytes); permutation and un-permutation: a gather of the t k token copies
  each way (read + write of t k h bytes), the same in backward.
- Grouped expert GEMMs: E / ep GEMMs of (tokens per expert) x (2 f_e / etp for SwiGLU's
  gate and up, f_e / etp down) x h as one batched launch through the efficiency curve,
  so their efficiency falls with the tokens per expert as any GEMM's does with its
  rows; backward = input and weight halves of the same size, the activation kernel's
  bytes twice. ``imbalance`` is what the busiest rank's extra tokens cost over a
  balanced load (forward + backward).
- Shared experts: a tensor-parallel dense MLP of shared_experts x shared_ffn.
- The dense MLP the layer was priced with (the model's ``ffn_hidden``) is subtracted
  the same way it was charged (its two GEMMs and activation kernel).
- All-to-all (dispatch, then combine; both again in backward, and in a re-forward): one
  GPU sends t k h bytes (16-bit tokens) spread over its ep group, 1/ep of them to each
  peer; the busiest receives ``load`` times its share. The group's peers in the GPU's
  node take NVLink, the rest its share of the node's network (every GPU sends at once),
  both at the same time: seconds = max(intra bytes / NVLink, inter bytes / NIC share)
  plus one latency of each link kind crossed (a two-level pairwise exchange, as NCCL's
  all-to-all and DeepEP's dispatch run it). etp > 1 adds an all-gather of the expert
  inputs and a reduce-scatter of their outputs over the etp group.
- Overlap (``moe_a2a_overlap``, Megatron's 1F1B all-to-all overlap of one micro-batch's
  communication with another's compute): a forward's all-to-alls hide behind the
  paired backward's MoE-layer compute and the backward's behind the forward's; only
  what exceeds it stays exposed (optimistic in the pipeline's warm-up and cool-down).
- Memory per micro-batch (busiest rank): the dense MLP's saved activations out; the
  router's fp32 scores, the permuted tokens, the experts' fc1 / activation outputs and
  the combine's inputs in, the shared experts' as a dense MLP. Full recompute keeps only
  the layer inputs (``checkpoint_bytes`` unchanged), which is what recomputing expert
  layers saves.
- State: routed experts are sharded over ep x etp and their ZeRO shards over the
  expert-data-parallel group (edp); the router is replicated; shared experts follow
  the dense layer (tp, and the dense shard group). Expert gradients are reduced over
  edp (reduce-scatter + all-gather under ZeRO >= 1, all-reduce otherwise) and added to
  ``grad_allreduce_s``; the dense sync is scaled by the dense parameters that remain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from merak_sim.costs.base import StageCost
from merak_sim.costs.comm import (
    CostModelError,
    collective_time,
    group_shape,
    inter_bandwidth_per_gpu,
)
from merak_sim.hardware import Cluster
from merak_sim.layout import RankLayout
from merak_sim.memory import DTYPE_BYTES, layer_activation_breakdown, model_state_bytes
from merak_sim.model import ModelSpec
from merak_sim.moe import busiest_load, dense_mlp_params, moe_flops_delta, moe_layer_count

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig

__all__ = ["MoELayerCost", "check_moe", "moe_layers_in", "moe_layer_cost", "moe_stage",
           "a2a_time", "moe_notes"]

_TOKEN_BYTES = 2  # dispatched tokens travel in 16 bits (Megatron's default dispatcher)


def check_moe(model: ModelSpec, config: ParallelConfig) -> None:
    """Raise a one-line CostModelError when the expert degrees cannot split ``model``."""
    ep, etp = config.ep, config.etp
    if model.moe is None:
        if ep > 1 or etp > 1:
            raise CostModelError(f"ep={ep} x etp={etp} needs an MoE model; {model.name} is "
                                 "dense (use ep=1, etp=1)")
        return
    if model.moe.experts % ep:
        raise CostModelError(f"ep={ep} does not divide the {model.moe.experts} experts of "
                             f"{model.name}")
    if model.moe.expert_ffn % etp or model.moe.shared_ffn % config.tp:
        raise CostModelError(f"etp={etp} does not divide the expert ffn "
                             f"{model.moe.expert_ffn} of {model.name}")


def moe_layers_in(model: ModelSpec, start: int, end: int) -> int:
    """MoE layers among layers ``start`` .. ``end - 1`` (the leading dense ones not)."""
    if model.moe is None:
        return 0
    return max(0, end - max(start, model.moe.dense_layers))


@dataclass(frozen=True, slots=True)
class MoELayerCost:
    """One MoE layer, one micro-batch, the busiest rank (module docstring); seconds
    unless named. ``*_delta`` are changes against the dense layer the stage was priced
    with; a2a fields are the dispatch + combine of a pass (total and exposed)."""

    fwd_delta_s: float
    bwd_input_delta_s: float
    bwd_weight_delta_s: float
    grouped_fwd_s: float
    grouped_bwd_s: float
    imbalance_s: float
    router_permute_s: float
    a2a_fwd_s: float
    a2a_bwd_s: float
    a2a_exposed_fwd_s: float
    a2a_exposed_bwd_s: float
    a2a_bytes: float
    tokens_per_expert: float
    flops_delta: float
    activation_delta_bytes: float


def a2a_time(nbytes: float, ranks: tuple[int, ...], cluster: Cluster) -> float:
    """Seconds of an all-to-all in which each GPU of ``ranks`` sends ``nbytes`` spread
    evenly over the group (module docstring: NVLink and NIC at once)."""
    p = len(ranks)
    if p <= 1 or nbytes <= 0:
        return 0.0
    _nodes, local = group_shape(ranks, cluster)
    intra_b = nbytes * (local - 1) / p
    inter_b = nbytes * (p - local) / p
    t = max(intra_b / cluster.intra.bandwidth_Bps,
            inter_b / inter_bandwidth_per_gpu(cluster) if inter_b else 0.0)
    return t + (cluster.intra.latency_s if local > 1 else 0.0) + (
        cluster.inter.latency_s if inter_b else 0.0)


def _mlp(eff: Any, m: float, f: float, h: int, gated: bool, gpeak: float, mem_bw: float,
         e: int, batch: float = 1.0) -> tuple[float, float, float]:
    """(forward, backward-input, backward-weight) seconds of ``batch`` MLPs of ``m``
    tokens and inner size ``f``, charged as the layer model charges the dense MLP."""
    if m <= 0 or f <= 0:
        return 0.0, 0.0, 0.0
    g = (eff.gemm_time(m, f * (2 if gated else 1), h, gpeak, batch=batch)
         + eff.gemm_time(m, h, f, gpeak, batch=batch))
    act = m * f * batch * e * (3 if gated else 2)
    return (g + eff.mem_time(act, mem_bw, 1), g + eff.mem_time(2 * act, mem_bw, 1), g)


@lru_cache(maxsize=1024)
def moe_layer_cost(model: ModelSpec, cluster: Cluster, config: ParallelConfig, eff: Any,
                   peak: float, gpeak: float, pp_rank: int = 0) -> MoELayerCost:
    """Costs of one MoE layer of ``model`` under ``config`` on pipeline rank ``pp_rank``
    (module docstring; ``peak`` 16-bit FLOP/s, ``gpeak`` the GEMMs' peak)."""
    moe, h = model.moe, model.hidden
    tp, cp, ep, etp = config.tp, config.cp, config.ep, config.etp
    e, bw = DTYPE_BYTES[config.dtype], cluster.gpu.mem_bandwidth_Bps
    gated, load = model.gated_mlp, busiest_load(moe)
    m_full = config.micro_batch_size * model.seq_len / cp
    t = m_full / tp
    k, E = moe.top_k, moe.experts
    per_expert = etp * ep * t * k / E
    dense = _mlp(eff, m_full, model.ffn_hidden / tp, h, gated, gpeak, bw, e)
    shared = _mlp(eff, m_full, moe.shared_experts * moe.shared_ffn / tp, h, gated, gpeak,
                  bw, e)
    grouped = _mlp(eff, per_expert * load, moe.expert_ffn / etp, h, gated, gpeak, bw, e,
                   batch=E / ep)
    balanced = _mlp(eff, per_expert, moe.expert_ffn / etp, h, gated, gpeak, bw, e,
                    batch=E / ep)
    router = eff.gemm_time(t, E, h, peak) + eff.mem_time(3 * t * E * 4, bw, 2)
    permute = eff.mem_time(2 * 2 * t * k * h * e, bw, 2)
    lay = RankLayout.of(config)
    base = lay.rank(pp_rank)
    sent = t * k * h * _TOKEN_BYTES
    a2a = 2 * a2a_time(sent * load, lay.expert_group("ep", base), cluster)
    if etp > 1:
        grp = lay.expert_group("etp", base)
        gathered = per_expert * load * (E / ep) * h * _TOKEN_BYTES
        a2a += (collective_time("all-gather", gathered, grp, cluster)
                + collective_time("reduce-scatter", gathered, grp, cluster))
    fwd = shared[0] + grouped[0] + router + permute - dense[0]
    b_in = shared[1] + grouped[1] + permute + router - dense[1]
    b_w = shared[2] + grouped[2] - dense[2]
    if config.moe_a2a_overlap:
        comp_f = shared[0] + grouped[0] + router + permute
        comp_b = shared[1] + grouped[1] + shared[2] + grouped[2]
        exp_f, exp_b = max(0.0, a2a - comp_b), max(0.0, a2a - comp_f)
    else:
        exp_f = exp_b = a2a
    imb = sum(grouped) - sum(balanced)
    flops = 3.0 * moe_flops_delta(model, config.micro_batch_size) / (
        moe_layer_count(model) * tp * cp)
    return MoELayerCost(fwd, b_in, b_w, grouped[0], grouped[1] + grouped[2], imb,
                        router + permute, a2a, a2a, exp_f, exp_b, 2 * sent * load,
                        per_expert * load, flops, _activation_delta(model, config, load))


def _activation_delta(model: ModelSpec, config: ParallelConfig, load: float) -> float:
    """Saved-activation bytes of an MoE layer's MLP part minus the dense MLP's."""
    moe, h = model.moe, model.hidden
    tp, cp, etp = config.tp, config.cp, config.etp
    e = DTYPE_BYTES[config.dtype]
    mlp = layer_activation_breakdown(model, config.micro_batch_size, tp,
                                     config.sequence_parallel, dtype=config.dtype,
                                     cp=cp)["mlp"]
    shared = mlp * moe.shared_experts * moe.shared_ffn / model.ffn_hidden
    t = config.micro_batch_size * model.seq_len / (cp * tp)
    at_expert = t * moe.top_k * load * etp
    f_saved = 3 if model.gated_mlp else 2
    routed = (t * moe.experts * 4 + at_expert * h * e
              + at_expert * f_saved * moe.expert_ffn / etp * e + t * moe.top_k * h * e)
    return shared + routed - mlp


def _state(model: ModelSpec, config: ParallelConfig, n_moe: int) -> tuple[float, float]:
    """(dense parameters removed per GPU, expert parameters added per GPU) of
    ``n_moe`` MoE layers; the router and shared experts count as dense."""
    moe, h = model.moe, model.hidden
    mats = 3 if model.gated_mlp else 2
    removed = n_moe * (dense_mlp_params(model) / config.tp
                       - h * moe.experts - mats * h * moe.shared_experts * moe.shared_ffn
                       / config.tp)
    added = n_moe * moe.experts / config.ep * mats * h * moe.expert_ffn / config.etp
    return removed, added


def moe_stage(st: StageCost, model: ModelSpec, cluster: Cluster, config: ParallelConfig,
              pp_rank: int, n_moe: int, params: float, cost_model: Any) -> StageCost:
    """``st`` (a stage priced with dense MLPs, ``params`` parameters per GPU) with its
    ``n_moe`` MoE layers priced as such (module docstring)."""
    if n_moe == 0:
        return st
    c = _layer(model, cluster, config, cost_model, pp_rank)
    removed, added = _state(model, config, n_moe)
    dense_left = params - removed
    dt, zero = config.dtype, config.zero
    shard = config.shard_group if zero else 1
    edp = RankLayout.of(config).edp
    old = model_state_bytes(params, dt, shard, zero)
    new_d = model_state_bytes(dense_left, dt, shard, zero)
    new_e = model_state_bytes(added, dt, edp if zero else 1, zero)
    grad_e = 0.0
    if edp > 1:
        grp = RankLayout.of(config).expert_group("edp", RankLayout.of(config).rank(pp_rank))
        nbytes = added * (4 if dt == "fp32" else 2)
        grad_e = (collective_time("reduce-scatter", nbytes, grp, cluster)
                  + collective_time("all-gather", nbytes, grp, cluster) if zero
                  else collective_time("all-reduce", nbytes, grp, cluster))
    opt_old = params / (shard if zero else 1)
    opt_new = dense_left / (shard if zero else 1) + added / (edp if zero else 1)
    f = n_moe * (c.fwd_delta_s + c.a2a_exposed_fwd_s)
    bi = n_moe * (c.bwd_input_delta_s + c.a2a_exposed_bwd_s)
    bw = n_moe * c.bwd_weight_delta_s
    return replace(
        st, forward_s=st.forward_s + f, recompute_s=st.recompute_s + f,
        backward_input_s=st.backward_input_s + bi, backward_weight_s=st.backward_weight_s + bw,
        backward_s=st.backward_s + bi + bw,
        activation_bytes=st.activation_bytes + n_moe * c.activation_delta_bytes,
        weight_bytes=st.weight_bytes - old.weight_bytes + new_d.weight_bytes + new_e.weight_bytes,
        grad_bytes=st.grad_bytes - old.grad_bytes + new_d.grad_bytes + new_e.grad_bytes,
        optimizer_bytes=(st.optimizer_bytes - old.optimizer_bytes + new_d.optimizer_bytes
                         + new_e.optimizer_bytes),
        grad_allreduce_s=st.grad_allreduce_s * dense_left / max(params, 1.0) + grad_e,
        optimizer_s=st.optimizer_s * opt_new / max(opt_old, 1.0),
        flops=st.flops + n_moe * c.flops_delta)


def _layer(model: ModelSpec, cluster: Cluster, config: ParallelConfig, cost_model: Any,
           pp_rank: int) -> MoELayerCost:
    eff = cost_model.efficiency_for(cluster)
    peak = cost_model.peak16(cluster, config)
    gpeak = peak
    if config.dtype == "fp8":
        kern = cost_model.kernels
        factor = kern.fp8_factor if kern is not None else 0.87
        gpeak = cluster.gpu.peak("fp8") * factor
    return moe_layer_cost(model, cluster, config, eff, peak, gpeak, pp_rank)


def moe_notes(model: ModelSpec, cluster: Cluster, config: ParallelConfig, cost_model: Any,
              layers_per_rank: int) -> tuple[str, ...]:
    """Where an MoE layer's time goes, as cost-table notes (the simulator prints them):
    per layer and per step on the busiest pipeline rank (``layers_per_rank`` MoE layers,
    every micro-batch)."""
    if model.moe is None:
        return ()
    c = _layer(model, cluster, config, cost_model, 0)
    ms, steps = 1e3, layers_per_rank * config.num_microbatches
    ranks = RankLayout.of(config).expert_group("ep", 0)
    nodes = group_shape(ranks, cluster)[0]
    a2a = c.a2a_fwd_s + c.a2a_bwd_s
    exposed = c.a2a_exposed_fwd_s + c.a2a_exposed_bwd_s
    return (
        f"MoE {model.moe.experts} experts top-{model.moe.top_k}, ep={config.ep} "
        f"etp={config.etp} edp={RankLayout.of(config).edp} (ep group over {nodes} "
        f"node(s)), busiest-rank load x{busiest_load(model.moe):g}: "
        f"{c.tokens_per_expert:.0f} tokens per expert per micro-batch",
        f"MoE per layer and micro-batch: grouped GEMM {c.grouped_fwd_s * ms:.3f} ms fwd "
        f"+ {c.grouped_bwd_s * ms:.3f} ms bwd (imbalance {c.imbalance_s * ms:.3f} ms), "
        f"router + permutation {c.router_permute_s * ms:.3f} ms, all-to-all "
        f"{a2a * ms:.3f} ms ({exposed * ms:.3f} ms exposed)",
        f"MoE per step on the busiest pipeline rank: all-to-all {a2a * steps:.3f} s "
        f"({exposed * steps:.3f} s exposed), grouped GEMM "
        f"{(c.grouped_fwd_s + c.grouped_bwd_s) * steps:.3f} s, imbalance "
        f"{c.imbalance_s * steps:.3f} s",
    )
