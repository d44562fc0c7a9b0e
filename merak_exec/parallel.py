"""``parallelize(model, config)``: turn an ordinary model into this rank's share of a
dp x tp x pp job and train it with the schedule the config names.

Order of transformations (torchtitan's): the model becomes a layer chain, the chain
is cut into ``pp * virtual_stages`` model stages, this rank keeps its chunks (the rest
is dropped; a meta-device model materialises only the kept layers), tensor
parallelism shards the kept layers, recompute fractions are set per stage, and the
runtime interprets the schedule each step with data-parallel gradient averaging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from merak_exec.capture import to_chain
from merak_exec.fsdp import FsdpSync
from merak_exec.mesh import ExecError, Mesh, build_mesh, timed_collective
from merak_exec.runtime import PipelineRuntime, StepOutput
from merak_exec.stages import (
    LayerChain,
    build_stage,
    partition_split,
    split_from_points,
    trainable_parameters,
)
from merak_exec.sub_pipelined import SubPipelined
from merak_exec.tensor_parallel import (
    FAMILY_MAPPINGS,
    TPMapping,
    apply_tensor_parallel,
)
from merak_sim.config import ParallelConfig
from merak_sim.executable import unsupported
from merak_sim.schedule.ir import Schedule
from merak_sim.sim.from_config import recompute_fractions, schedule_for, stage_rank

__all__ = ["ParallelModel", "parallelize", "check_executable", "check_run", "materialize_layers",
           "model_origin"]


@dataclass
class ParallelModel:
    """This rank's part of a parallelised model and the runtime that trains it.

    Attributes:
        mesh: groups and coordinates.
        chain: the full layer chain (only local layers are materialised).
        ranges: layer range of every model stage.
        chunks: local stage modules, by chunk.
        runtime: the schedule interpreter.
        config: the ParallelConfig.
        history: every step's output.
        origin: the user's model class, its config and the model's own name of every
            chain parameter (:func:`model_origin`), for export; None for a bare chain.
    """

    mesh: Mesh
    chain: LayerChain
    ranges: list[range]
    chunks: list
    runtime: PipelineRuntime
    config: ParallelConfig
    history: list[StepOutput] = field(default_factory=list)
    origin: dict | None = None
    _eval: PipelineRuntime | None = field(default=None, repr=False)

    def parameters(self):
        """Local trainable parameters (shards under TP)."""
        return trainable_parameters(self.chunks)

    def named_parameters(self):
        """(name, parameter) of local chunks, names prefixed with the global layer index
        so they are unique across pipeline ranks (``layers.<i>.<name>``)."""
        out = []
        for c in self.chunks:
            r = self.ranges[c.index]
            for li, layer in zip(r, c.layers, strict=True):
                for n, p in layer.named_parameters():
                    out.append((f"layers.{li}.{n}", p))
        return out

    def split_batch(self, t: torch.Tensor) -> list[torch.Tensor]:
        """This dp rank's micro-batches of a *global* batch ``[dp*M*mbs, ...]``."""
        cfg = self.config
        M, mbs = cfg.num_microbatches, cfg.micro_batch_size
        n = M * mbs
        if t.shape[0] != cfg.global_batch_size:
            raise ExecError(f"batch has {t.shape[0]} samples; the config's global batch size "
                            f"is {cfg.global_batch_size}")
        mine = t[self.mesh.dp_rank * n:(self.mesh.dp_rank + 1) * n]
        return list(mine.split(mbs, dim=0))

    def train_step(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
                   ) -> StepOutput:
        """One iteration on a global batch (every rank passes the same tensors).

        ``labels`` are aligned with ``input_ids`` as in HuggingFace (the loss shifts
        them; -100 is ignored); None means ``input_ids``."""
        if labels is None:
            labels = input_ids
        if labels.shape != input_ids.shape:
            raise ExecError(f"labels have shape {tuple(labels.shape)} but input_ids "
                            f"{tuple(input_ids.shape)}; pass labels aligned with the inputs "
                            "(labels = input_ids; the loss shifts them)")
        out = self.runtime.step(self.split_batch(input_ids), self.split_batch(labels))
        self.history.append(out)
        return out

    def evaluate(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> float:
        """The mean loss on a global batch without training: every rank passes the
        same tensors; the stages run the training schedule's forwards only
        (:func:`~merak_sim.schedule.evaluation.forward_only`), dropout off, no
        gradients, and every rank gets the loss."""
        from merak_sim.schedule.evaluation import forward_only

        labels = input_ids if labels is None else labels
        if self._eval is None:  # built by every rank at its first evaluation
            rt = self.runtime
            self._eval = PipelineRuntime(self.chunks, forward_only(rt.schedule), self.mesh,
                                         None, rt.boundary_specs, record=False)
        modes = [c.training for c in self.chunks]
        for c in self.chunks:
            c.eval()
        try:
            return self._eval.step(self.split_batch(input_ids), self.split_batch(labels)).loss
        finally:
            for c, mode in zip(self.chunks, modes, strict=True):
                c.train(mode)


def parallelize(model: nn.Module | LayerChain, config: ParallelConfig, *,
                optimizer_fn: Callable[[list], torch.optim.Optimizer] | None = None,
                seq_len: int, split_points: list[int] | None = None,
                tp_mapping: TPMapping | str | None = None, mesh: Mesh | None = None,
                record: bool = True, dtype: torch.dtype | None = None,
                partition: str = "uniform",
                layer_times_s: tuple[float, float, float] | None = None,
                max_grad_norm: float | None = None,
                lr_schedule: Callable[[int], float] | None = None,
                overlap_dp: bool = False, buckets: int = 4,
                schedule: Schedule | None = None) -> ParallelModel:
    """Parallelise ``model`` for ``config`` on the current torch.distributed world.

    Args:
        model: the built-in GPT, a HuggingFace GPT2LMHeadModel / LlamaForCausalLM, a
            model torch.export can capture, or a ready :class:`LayerChain`. It may live
            on the meta device; then only this rank's layers are materialised.
        config: degrees, micro-batching, schedule, recompute policy, TP overlap.
        optimizer_fn: builds the optimizer from the local parameters (default AdamW,
            lr 1e-4).
        seq_len: sequence length of every micro-batch (fixes the boundary shape).
        split_points: explicit layer indices where stages begin (override the
            partitioner).
        partition: "uniform", "parameters" or "time" (merak_sim's partitioner, the one
            the simulator uses); "time" needs ``layer_times_s``.
        layer_times_s: (embedding, block, head) forward+backward seconds.
        tp_mapping: a :class:`TPMapping` or a family name ("gpt", "llama", "bert");
            default from the model's family.
        mesh: reuse existing groups.
        record: record per-action events.
        dtype: parameter dtype (default fp32). ``config.dtype`` "bf16" or "fp16" is
            mixed precision: fp32 parameters (the master weights) and optimizer state,
            stage forwards under ``torch.autocast``, and for fp16 a dynamic loss scaler
            (:mod:`merak_exec.optim`).
        max_grad_norm: clip gradients to this global norm over all ranks.
        lr_schedule: LR multiplier per optimizer step (:func:`merak_exec.optim.lr_lambda`).
        overlap_dp: average data-parallel gradients in ``buckets`` buckets per chunk,
            overlapped with the last backwards (:mod:`merak_exec.data_parallel`; the
            simulator's ``overlap_dp``/``buckets``).
        schedule: ``config``'s schedule, already checked by the caller
            (:func:`check_run`): built and checked once, not again here. None: built
            and checked here.
    """
    sched = schedule if schedule is not None else check_run(config)
    mesh = mesh or build_mesh(config)
    _check_heads(model, config.tp)
    chain, family = to_chain(model, seq_len=seq_len)
    origin = model_origin(model, chain)  # before any layer is materialised or cut
    G = sched.num_model_stages
    ranges = (split_from_points(chain, split_points, G) if split_points is not None
              else partition_split(chain, G, partition, layer_times_s))
    place = partial(stage_rank, config)
    chunks = [build_stage(chain, ranges, sched.stage_of(mesh.pp_rank, c), place)
              for c in range(config.virtual_stages)]
    dtype = dtype or torch.float32
    # Materialise the kept layers only (a meta-device model gets storage and its own
    # init here); then shard them for TP, so every tp rank slices the same full layer.
    materialize_layers(chain, ranges, chunks, mesh.device, dtype)
    _apply_tensor_parallel(chain, ranges, chunks, mesh, config, tp_mapping, family)
    fractions = recompute_fractions(config, sched)
    for c in chunks:
        c.set_recompute_fraction(fractions[mesh.pp_rank])
        c.selective_recompute = config.recompute == "selective"
    tied = _start_replicas(chain, ranges, chunks, mesh, config)
    opt = (optimizer_fn or (lambda ps: torch.optim.AdamW(ps, lr=1e-4)))(
        trainable_parameters(chunks))
    if not isinstance(opt, torch.optim.Optimizer):
        raise ExecError(f"optimizer_fn returned {type(opt).__name__}, not a torch.optim."
                        "Optimizer; return one built over the parameters it is given")
    opt, grad_sync = _apply_options(config, mesh, chunks, ranges, family, opt, sched)
    opt = _training_optimizer(opt, chunks, mesh, tied, config, max_grad_norm, lr_schedule)
    specs = _boundary_specs(chain, ranges, config.micro_batch_size,
                            seq_len // (config.tp if config.sequence_parallel else 1), dtype)
    rt = PipelineRuntime(chunks, sched, mesh, opt, specs, tied_params=tied, record=record,
                         grad_sync=grad_sync)
    _add_gradient_hooks(rt, grad_sync, config, overlap_dp, buckets)
    return ParallelModel(mesh=mesh, chain=chain, ranges=ranges, chunks=chunks, runtime=rt,
                         config=config, origin=origin)


def _apply_tensor_parallel(chain: LayerChain, ranges, chunks, mesh: Mesh,
                           config: ParallelConfig, tp_mapping, family) -> None:
    """Shard the local layers over tp by the family's mapping (or ``tp_mapping``), tie
    what was tied again, give a vocabulary-split head its loss, and set up Merak's
    sub-pipelined TP when the config asks for it."""
    if config.tp == 1:
        return
    mapping = tp_mapping if isinstance(tp_mapping, TPMapping) else FAMILY_MAPPINGS.get(
        tp_mapping or family or "")
    if mapping is None:
        raise ExecError(f"no tensor-parallel mapping for model family {family!r}; pass "
                        "tp_mapping=TPMapping(column=..., row=..., divide=...)")
    n = sum(apply_tensor_parallel(c, mapping, mesh.tp_group, config.tp, mesh.tp_rank)
            for c in chunks)
    if n == 0 and any(len(r) > 2 for r in ranges):
        raise ExecError("the tensor-parallel mapping matched no linear layer; check its "
                        "module names against model.named_modules()")
    _retie_and_vocab_loss(chain, ranges, chunks, mesh)
    if config.tp_overlap == "sub-pipelined":
        _check_no_dropout(chunks)
        groups = _part_groups(mesh, config)
        for c in chunks:
            c.subpipe = SubPipelined(groups)


def _start_replicas(chain: LayerChain, ranges, chunks, mesh: Mesh,
                    config: ParallelConfig) -> list:
    """Replicas start equal (dp, the tied copy, tp random states), then FSDP shards
    the parameters for ZeRO 2/3 (before the optimizer sees them); returns the local
    tied copies whose gradients are summed across pipeline ranks."""
    place = partial(stage_rank, config)
    tied = _tied_params(chain, ranges, chunks, place)
    _sync_initial_weights(mesh, chunks, tied)
    _sync_tp_rng(mesh)
    if config.zero in (2, 3):
        from merak_exec.fsdp import shard_chunks

        shard_chunks(chunks, mesh, config.zero)
        tied = _tied_params(chain, ranges, chunks, place)  # sharded now
    return tied


def _add_gradient_hooks(rt: PipelineRuntime, grad_sync, config: ParallelConfig,
                        overlap_dp: bool, buckets: int) -> None:
    """FSDP's per-backward flags, or dp gradients averaged in buckets during the last
    backwards (``overlap_dp``), as runtime hooks."""
    if isinstance(grad_sync, FsdpSync):
        rt.add_hooks(grad_sync)
    if overlap_dp and rt.mesh.dp_group is not None:
        if config.zero:
            raise ExecError("overlap_dp buckets an all-reduce, but ZeRO-1 reduce-scatters "
                            "the gradients at AR: use one of them")
        from merak_exec.data_parallel import BucketedReducer

        rt.grad_reducer = BucketedReducer(chunks=rt.chunks, program=rt.program, mesh=rt.mesh,
                                          buckets=buckets)
        rt.add_hooks(rt.grad_reducer)


def model_origin(model, chain: LayerChain) -> dict | None:
    """What an exported checkpoint needs to rebuild ``model``: its class name, its
    config as plain values and, for every chain parameter name (``layers.<i>.<name>``),
    the model's own name of that tensor. The chain's adapters hold the model's own
    parameters, so the names are found by identity (a tied tensor has several model
    names: the one ending like the chain name is taken). None for a bare chain or a
    model without a config."""
    import dataclasses

    cfg = getattr(model, "config", None)
    if isinstance(model, LayerChain) or cfg is None:
        return None
    if dataclasses.is_dataclass(cfg):
        config = dataclasses.asdict(cfg)
    elif hasattr(cfg, "to_json_string"):  # HuggingFace: JSON-safe (dtypes as names)
        import json

        config = json.loads(cfg.to_json_string(use_diff=False))
    else:
        return None
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    names = {}
    for li, layer in enumerate(chain.layers):
        for n, p in layer.named_parameters(remove_duplicate=False):
            found = owners.get(id(p))
            if found:
                names[f"layers.{li}.{n}"] = max(found, key=lambda m: _common_tail(m, n))
    return {"class": type(model).__name__, "config": config, "names": names}


def _common_tail(a: str, b: str) -> int:
    """How many dotted components ``a`` and ``b`` share at their ends."""
    x, y = a.split(".")[::-1], b.split(".")[::-1]
    pairs = enumerate(zip(x, y, strict=False))  # names of different depths
    return next((i for i, (u, v) in pairs if u != v), min(len(x), len(y)))


def _training_optimizer(opt, chunks, mesh: Mesh, tied, config: ParallelConfig,
                        max_grad_norm: float | None, lr_schedule):
    """Mixed precision (autocast hooks on every stage, the fp16 loss scaler on the
    loss), clipping and the LR schedule around ``opt``; ``opt`` itself when none
    applies."""
    from merak_exec.optim import (
        AMP_DTYPES,
        LossScaler,
        TrainingOptimizer,
        autocast_hooks,
        replica_counts,
        scaled_loss_fn,
    )
    from merak_exec.zero import ZeroOptimizer

    if config.dtype not in (*AMP_DTYPES, "fp32"):
        raise ExecError(f"dtype {config.dtype!r} is not supported; choose fp32, bf16 or fp16")
    scaler = LossScaler() if config.dtype == "fp16" else None
    if config.dtype in AMP_DTYPES:
        hooks = autocast_hooks(mesh.device, config.dtype)
        for c in chunks:
            c.add_hooks(hooks)
            if c.is_last and scaler is not None:
                c.loss_fn = scaled_loss_fn(c.loss_fn, scaler)
    if opt is None or (scaler is None and not max_grad_norm and lr_schedule is None):
        return opt
    counts = replica_counts(chunks, mesh, tied)
    if isinstance(opt, ZeroOptimizer):  # its steps see dp-disjoint pieces
        counts = opt.shard_counts(counts)
    elif config.zero in (2, 3) and mesh.dp_group is not None:  # dp-disjoint FSDP shards
        counts = {k: max(1, v // mesh.dp) for k, v in counts.items()}
    return TrainingOptimizer(opt, counts=counts, device=mesh.device,
                             max_grad_norm=max_grad_norm, schedule=lr_schedule, scaler=scaler,
                             timeout_s=mesh.timeout_s)


def _retie_and_vocab_loss(chain: LayerChain, ranges, chunks, mesh: Mesh) -> None:
    """After TP: tied parameters held by one rank share their (identically sliced)
    shard again; a head split by vocabulary gets the vocab-parallel cross entropy."""
    from merak_exec.tensor_parallel import vocab_parallel_lm_loss

    local = {li: layer for c in chunks for li, layer in zip(ranges[c.index], c.layers,
                                                             strict=True)}
    for (i, ni), (j, nj) in chain.tied:
        if i in local and j in local:
            mod_path, _, pname = nj.rpartition(".")
            owner = local[j].get_submodule(mod_path) if mod_path else local[j]
            setattr(owner, pname, local[i].get_parameter(ni))
    for c in chunks:
        if c.is_last:
            for m in c.modules():
                if hasattr(m, "vocab_start"):
                    c.loss_fn = vocab_parallel_lm_loss(m.vocab_start, mesh.tp_group)


def _boundary_specs(chain: LayerChain, ranges: list[range], mbs: int, seq: int,
                    dtype: torch.dtype) -> dict[int, list]:
    """(shape, dtype) of the tensors crossing each model-stage boundary: from the
    chain's captured boundary shapes when it has them, else the residual stream."""
    out = {}
    for g, r in enumerate(ranges[:-1]):
        cut = r.stop - 1
        if chain.boundaries is not None:
            out[g] = [(tuple(mbs if d == "batch" else d for d in shape),
                       dt if not dt.is_floating_point else dtype)
                      for shape, dt in chain.boundaries[cut]]
        else:
            out[g] = [((mbs, seq, chain.hidden_size), dtype)]
    return out


def check_run(config: ParallelConfig, spec=None, what: str | None = None) -> Schedule:
    """Everything about ``config`` that can be refused before any rank starts, checked
    once: what this runtime does not run (:func:`merak_sim.executable.unsupported`, with
    the model's ``spec`` when known; the line starts "cannot run this ``what``: " when
    given) and the schedule's own requirements. Returns the schedule, which
    :func:`parallelize` then takes as it is."""
    why = unsupported(config, spec)
    if why:
        raise ExecError(f"cannot run this {what}: {why}" if what else why)
    return schedule_for(config)


def check_executable(config: ParallelConfig) -> None:
    """Refuse, in one line, what the simulator prices but this runtime does not run
    (the one list: :data:`merak_sim.executable.NOT_EXECUTED`)."""
    check_run(config)


def _apply_options(config: ParallelConfig, mesh: Mesh, chunks, ranges, family, opt,
                   sched: Schedule):
    """Sequence parallelism and ZeRO-1 on the built stages: returns the optimizer the
    runtime steps and its AR ``grad_sync`` (None when neither option is on)."""
    from merak_exec.sequence_parallel import GradientSync, apply_sequence_parallel, partial_params
    from merak_exec.zero import ZeroOptimizer

    if not (config.sequence_parallel or config.zero):
        return opt, None
    partial = []
    if config.sequence_parallel:
        regions = apply_sequence_parallel(chunks, ranges, mesh, family)
        partial = partial_params(chunks, ranges, regions)
    zero = None
    if config.zero == 1:
        zero = opt = ZeroOptimizer(opt, mesh.dp_group, mesh.dp, mesh.dp_rank, mesh.timeout_s)
    elif config.zero in (2, 3) and mesh.dp_group is not None:  # SP: refused up front
        return opt, FsdpSync(chunks, sched.programs[mesh.pp_rank])
    return opt, GradientSync(mesh.tp_group, partial, zero)


def _check_heads(model, tp: int) -> None:
    """Heads (and key/value heads) must divide by tp: say so before touching a layer."""
    cfg = getattr(model, "config", None)
    if tp == 1 or cfg is None:
        return
    for attr in ("n_head", "num_attention_heads", "num_key_value_heads"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v % tp:
            raise ExecError(f"{attr}={v} is not divisible by tp={tp}; choose a tp that divides "
                            "the number of heads")


def _sync_initial_weights(mesh: Mesh, chunks, tied) -> None:
    """Make replicas start equal whatever each rank's RNG did: data-parallel replicas
    take dp rank 0's weights; a tied copy on the last pipeline rank takes the first
    rank's (their gradients are summed, so their values must agree)."""
    import torch.distributed as dist

    if mesh.dp_group is not None:
        src = mesh.global_rank(mesh.pp_rank, dp_rank=0)
        with torch.no_grad():
            for c in chunks:
                for t in [*c.parameters(), *c.buffers()]:
                    timed_collective(dist.broadcast, t.data, src=src, group=mesh.dp_group,
                                     what="the initial weight broadcast over dp")
    if mesh.tied_group is not None and tied:
        src = mesh.global_rank(0)
        with torch.no_grad():
            for p in tied:
                timed_collective(dist.broadcast, p.data, src=src, group=mesh.tied_group,
                                 what="the tied-embedding weight broadcast")


def _check_no_dropout(chunks) -> None:
    """Sub-pipelined TP draws a dropout mask per part, not one per micro-batch (and on
    CUDA from side streams), so masks would differ from plain TP's: refuse instead of
    training silently different."""
    for c in chunks:
        for name, m in c.named_modules():
            p = m.p if isinstance(m, nn.Dropout) else None
            for attr in ("dropout", "attention_dropout"):
                v = getattr(m, attr, None)
                if isinstance(v, float):
                    p = max(p or 0.0, v)
            if p:
                raise ExecError(f"sub-pipelined TP needs dropout 0, but {name or 'a layer'} "
                                f"has dropout {p}; set dropout to 0 or tp_overlap='none'")


def _sync_tp_rng(mesh: Mesh) -> None:
    """Tensor-parallel ranks compute the replicated parts of a layer (embeddings,
    norms, residual adds) redundantly, so their dropout masks there must agree: start
    every tp rank from tp rank 0's RNG state. Each rank holds an equal shard, so the
    sharded parts draw equally many numbers and the streams stay aligned."""
    import torch.distributed as dist

    if mesh.tp_group is None:
        return
    src = mesh.global_rank(mesh.pp_rank, tp_rank=0)
    # NCCL takes device tensors only: the CPU generator's state travels on the device
    state = torch.get_rng_state().to(mesh.device)
    timed_collective(dist.broadcast, state, src=src, group=mesh.tp_group,
                     what="the tp random-state broadcast")
    torch.set_rng_state(state.cpu())
    if mesh.device.type == "cuda":
        cstate = torch.cuda.get_rng_state(mesh.device).to(mesh.device)
        timed_collective(dist.broadcast, cstate, src=src, group=mesh.tp_group,
                         what="the tp CUDA random-state broadcast")
        torch.cuda.set_rng_state(cstate.cpu(), mesh.device)


def _part_groups(mesh: Mesh, config: ParallelConfig) -> list:
    """k extra tp groups (one per sub-pipelined part), created collectively."""
    import datetime

    import torch.distributed as dist

    t = datetime.timedelta(seconds=mesh.timeout_s)
    groups = []
    for _ in range(config.tp_overlap_parts):
        mine = None
        for ranks in mesh.layout.groups("tp"):
            g = dist.new_group(list(ranks), timeout=t)
            if mesh.rank in ranks:
                mine = g
        groups.append(mine)
    return groups


def materialize_layers(chain: LayerChain, ranges: list[range], chunks, device: torch.device,
                       dtype: torch.dtype) -> None:
    """Give the local layers real storage on ``device`` in ``dtype``.

    A meta-device layer is initialised under its own seed, derived from the process's
    initial seed and its *global* layer index, so the model is the same whatever the
    layout (one process, pp2, the V placement, ...) and the global random stream is
    left untouched. Parameters shared by local layers (a tied embedding and LM head on
    one rank) stay one tensor: ``to_empty`` would give each module its own copy."""
    shared = _shared_parameters(chunks)
    base = torch.initial_seed()
    # the seed reaches the device's generator too; both are restored afterwards
    gpus = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    for c in chunks:
        for li, layer in zip(ranges[c.index], c.layers, strict=True):
            with torch.random.fork_rng(devices=gpus):
                torch.manual_seed((base + 1_000_003 * (li + 1)) % (1 << 63))
                if chain.materialize is not None:
                    chain.materialize(layer, device, dtype)
                else:
                    _materialize(layer, device, dtype, chain.init_fn)
    for places in shared:
        first = getattr(*places[0])
        for owner, name in places[1:]:
            setattr(owner, name, first)


def _shared_parameters(chunks) -> list[list[tuple[nn.Module, str]]]:
    """Every parameter held by more than one (module, attribute) of the local chunks,
    as the list of its places, the first place first."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for c in chunks:
        for layer in c.layers:
            for mod in layer.modules():
                for name, p in mod.named_parameters(recurse=False, remove_duplicate=False):
                    places.setdefault(id(p), []).append((mod, name))
    out = []
    for found in places.values():
        unique = list(dict.fromkeys(found))  # a module reached twice is one place
        if len(unique) > 1:
            out.append(unique)
    return out


def _materialize(module: nn.Module, device: torch.device, dtype: torch.dtype,
                 init_fn=None) -> None:
    """Move to ``device``/``dtype``; a meta-device module gets real storage and a fresh
    initialisation of only its own parameters (``reset_parameters``, then the model's
    own per-module init when the chain provides one)."""
    if any(p.is_meta for p in module.parameters()) or any(b.is_meta for b in module.buffers()):
        module.to_empty(device=device)
        with torch.no_grad():
            for m in module.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
                if init_fn is not None:  # the model's own scheme wins where it has one
                    init_fn(m)
    module.to(device=device, dtype=dtype)


def _tied_params(chain: LayerChain, ranges: list[range], chunks,
                 rank_of_stage: Callable[[int], int]) -> list:
    """Local copies of tied parameters whose partner lives on another pipeline rank
    (under the V placement the first and the last model stage share rank 0: none)."""
    out = []
    local = {li: layer for c in chunks for li, layer in zip(ranges[c.index], c.layers, strict=True)}
    for (i, ni), (j, nj) in chain.tied:
        si = next(s for s, r in enumerate(ranges) if i in r)
        sj = next(s for s, r in enumerate(ranges) if j in r)
        if rank_of_stage(si) == rank_of_stage(sj):
            continue
        for li, name in ((i, ni), (j, nj)):
            if li in local:
                out.append(local[li].get_parameter(name))
    return out
