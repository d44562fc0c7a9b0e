"""The non-intrusive API, HuggingFace-Trainer style.

    import merak_exec
    merak_exec.init(dp=2, tp=2, pp=2)
    args = merak_exec.TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                                        gradient_accumulation_steps=8, max_steps=100)
    merak_exec.Trainer(model=model, args=args, train_dataset=ds).train()

``init`` sets the degrees (and any other :class:`~merak_sim.config.ParallelConfig`
field) and starts torch.distributed; ``Trainer`` parallelises the unmodified model,
feeds it global batches built deterministically from ``train_dataset`` (every rank
builds the same global batch and keeps its data-parallel slice), logs the loss,
saves checkpoints every ``save_steps`` and at the end (keeping ``save_total_limit``),
resumes from one at any layout, evaluates on an ``eval_dataset`` every ``eval_steps``
and exports the model in HuggingFace's layout (:meth:`Trainer.save_model`). Labels
follow HuggingFace: aligned with the inputs (the loss shifts them), missing labels mean
the input ids, -100 is ignored, right padding is masked.
"""

from __future__ import annotations

import math
import numbers
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from merak_exec.checkpoint import load_checkpoint, save_checkpoint
from merak_exec.inputs import (
    argument_problems,
    check_first_batch,
    check_inputs,
    check_model_fits,
    sample_tensors,
    vocab_size,
)
from merak_exec.mesh import ExecError, Mesh, bounded, build_mesh, init_distributed
from merak_exec.optim import TrainingOptimizer, decay_groups, lr_lambda
from merak_exec.parallel import ParallelModel, parallelize
from merak_exec.result import RunResult
from merak_sim.config import ParallelConfig

__all__ = ["init", "TrainingArguments", "Trainer", "gather_events", "pad_sample", "checkpoints",
           "rotate_checkpoints"]

_STATE: dict = {}


def init(dp: int = 1, tp: int = 1, pp: int = 1, **config) -> Mesh:
    """Start torch.distributed (torchrun, srun or a single process) and build the
    dp x tp x pp groups. Extra keywords are ParallelConfig fields (schedule, recompute,
    virtual_stages, tp_overlap, ...); batch fields come from TrainingArguments. A bad
    value is one ExecError line, before torch.distributed starts."""
    degrees = dict(dp=dp, tp=tp, pp=pp, **config)
    try:
        cfg = _make_config(1, 1, **degrees)
    except ValueError as e:  # ParallelConfig's own one-line check
        raise (e if isinstance(e, ExecError) else ExecError(f"merak_exec.init: {e}")) from None
    init_distributed()
    _STATE["degrees"] = degrees
    _STATE["mesh"] = build_mesh(cfg)
    return _STATE["mesh"]


def _make_config(mbs: int, accum: int, **kw) -> ParallelConfig:
    dp = kw.get("dp", 1)
    kw.setdefault("dtype", "fp32")
    return ParallelConfig(micro_batch_size=mbs, global_batch_size=mbs * accum * dp, **kw)


@dataclass
class TrainingArguments:
    """What to train for and how: HuggingFace TrainingArguments' common fields with
    their HuggingFace meaning (an unknown field is a TypeError naming it; a known one
    this backend cannot honour is refused by name when the Trainer starts).

    Attributes:
        output_dir: checkpoints go to ``<output_dir>/checkpoint-<step>``.
        per_device_train_batch_size: micro-batch size.
        gradient_accumulation_steps: micro-batches per iteration per pipeline (M).
        max_steps: iterations to run; -1 means ``num_train_epochs`` epochs.
        num_train_epochs: epochs when ``max_steps`` is -1 (an epoch is every full global
            batch of the dataset; the last partial one is dropped, shapes are fixed).
        learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon: AdamW
            settings; no weight decay on biases and norm weights.
        max_grad_norm: clip the global gradient norm over all ranks (0/None: off).
        lr_scheduler_type: constant, constant_with_warmup, linear or cosine.
        warmup_steps, warmup_ratio: linear warmup (steps, else a fraction of the run).
        bf16, fp16: mixed precision (autocast; fp16 with a dynamic loss scaler).
        gradient_checkpointing: recompute every block ("full") unless the config
            already recomputes.
        seed: seeds the data order.
        logging_steps: print the loss every this many steps (rank 0; 0: never).
        save_steps: checkpoint every this many steps (0: never).
        save_total_limit: keep only this many newest checkpoints (None: all).
        eval_steps, eval_strategy: with an ``eval_dataset``, "steps" evaluates every
            ``eval_steps`` steps (and at the end); "no" never.
        report_to: "none" only (no integrations).
        dataloader_num_workers: 0 only (batches are built in the training process).
        resume_from_checkpoint: a checkpoint directory, or True for the newest one in
            ``output_dir``.
        seq_len: sequence length (default: the longest sample; shorter ones are
            padded on the right with ``pad_token_id`` and labels -100).
        pad_token_id: the id used for right padding.
        split_points: explicit pipeline split points (layer indices).
        trace_path: write the last step's Chrome trace here (rank 0).
    """

    output_dir: str = "merak_out"
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    max_steps: int = -1
    num_train_epochs: float = 3.0
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float | None = 1.0
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    bf16: bool = False
    fp16: bool = False
    gradient_checkpointing: bool = False
    seed: int = 0
    logging_steps: int = 1
    save_steps: int = 0
    save_total_limit: int | None = None
    eval_steps: int | None = None
    eval_strategy: str = "no"
    report_to: str | list[str] | None = "none"
    dataloader_num_workers: int = 0
    resume_from_checkpoint: str | bool | None = None
    seq_len: int | None = None
    pad_token_id: int = 0
    split_points: list[int] | None = None
    trace_path: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse, at construction and by name, a value outside its range (HuggingFace's
        rules, and AdamW's for the optimizer fields); ExecError, a ValueError."""
        problems = argument_problems(self)
        if problems:
            raise ExecError("TrainingArguments out of range: " + "; ".join(problems))


def _check_args(a: TrainingArguments) -> None:
    """Refuse, by name, the fields out of range (checked again: the arguments may have
    changed since construction) and those whose value this backend cannot honour."""
    if not isinstance(a, TrainingArguments):
        raise ExecError(f"args must be merak_exec.TrainingArguments, got {type(a).__name__}")
    out_of_range = argument_problems(a)
    if out_of_range:
        raise ExecError("TrainingArguments out of range: " + "; ".join(out_of_range))
    reports = [a.report_to] if isinstance(a.report_to, str) or a.report_to is None \
        else list(a.report_to)
    bad = [r for r in reports if r not in (None, "none")]
    problems = []
    if bad:
        problems.append(f"report_to={bad} (no logging integrations; use 'none')")
    if a.eval_strategy not in ("no", "steps", None):
        problems.append(f"eval_strategy={a.eval_strategy!r} (use 'steps' or 'no')")
    elif a.eval_strategy == "steps" and not a.eval_steps:
        problems.append("eval_strategy='steps' without eval_steps (set eval_steps >= 1)")
    if a.dataloader_num_workers:
        problems.append(f"dataloader_num_workers={a.dataloader_num_workers} (batches are "
                        "built in the training process; use 0)")
    if a.bf16 and a.fp16:
        problems.append("bf16 and fp16 together (choose one)")
    if problems:
        raise ExecError("TrainingArguments not supported by merak_exec: " + "; ".join(problems))


def pad_sample(i: int, sample, seq: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``i`` as (ids, labels) of length ``seq``: right padding (from its
    attention_mask, or for a shorter sample) gets ``pad_id`` and label -100. Causal
    attention never lets a real token see a later pad, so this equals HuggingFace's
    masked forward; left padding or a longer sample is refused in one line."""
    ids, labels, mask = sample_tensors(sample, i)
    n = ids.shape[-1]
    if labels.shape != ids.shape:
        raise ExecError(f"sample {i}: labels have {labels.shape[-1]} tokens, input_ids {n}; "
                        "labels must be aligned with input_ids (the loss shifts them)")
    if n > seq:
        raise ExecError(f"sample {i} has {n} tokens, more than seq_len={seq}; truncate it or "
                        "raise TrainingArguments.seq_len")
    labels = labels.clone()
    if mask is not None:
        m = mask.bool()
        if bool((m[1:] & ~m[:-1]).any()):
            raise ExecError(f"sample {i}: attention_mask has a 0 before a 1 (left padding or "
                            "holes); merak_exec handles right padding only")
        labels[~m] = -100
    if n < seq:
        ids = torch.cat([ids, ids.new_full((seq - n,), pad_id)])
        labels = torch.cat([labels, labels.new_full((seq - n,), -100)])
    return ids, labels


class Trainer:
    """Trains ``model`` on ``train_dataset`` with the degrees given to :func:`init`.

    ``train_dataset`` is indexable; each item is ``{"input_ids": [s], "labels": [s],
    "attention_mask": [s]}`` (labels and the mask optional; labels aligned with the
    inputs as in HuggingFace, -100 ignored) or an ``(ids, labels)`` pair. Every rank
    must see the same dataset. ``schedule``: the config's schedule when the caller has
    checked it already (:func:`merak_exec.parallel.check_run`).
    """

    def __init__(self, model, args: TrainingArguments, train_dataset, optimizer_fn=None,
                 config: ParallelConfig | None = None, eval_dataset=None,
                 schedule=None) -> None:
        _check_args(args)
        check_inputs(model, args, train_dataset, eval_dataset)
        if config is None:
            if "degrees" not in _STATE:
                init()
            config = _make_config(args.per_device_train_batch_size,
                                  args.gradient_accumulation_steps,
                                  **_precision_degrees(args, _STATE["degrees"]))
            mesh = _STATE["mesh"]
        else:
            mesh = build_mesh(config)
        if len(train_dataset) < config.global_batch_size:
            raise ExecError(f"dataset has {len(train_dataset)} samples, fewer than one global "
                            f"batch ({config.global_batch_size})")
        if args.eval_strategy == "steps" and eval_dataset is None:
            raise ExecError("eval_strategy='steps' needs an eval_dataset (pass one, or set "
                            "eval_strategy='no')")
        if eval_dataset is not None and len(eval_dataset) < config.global_batch_size:
            raise ExecError(f"eval_dataset has {len(eval_dataset)} samples, fewer than one "
                            f"global batch ({config.global_batch_size}); give more or a "
                            "smaller batch")
        self.args, self.config, self.dataset = args, config, train_dataset
        self.eval_dataset = eval_dataset
        self.eval_history: list[dict] = []
        self.seq = args.seq_len or max(int(sample_tensors(train_dataset[i], i)[0].shape[-1])
                                       for i in range(len(train_dataset)))
        check_model_fits(model, config, self.seq, mesh.device)
        check_first_batch(*self._batch(0), vocab_size(model), config.micro_batch_size)
        self.max_steps = args.max_steps if args.max_steps > 0 else math.ceil(
            args.num_train_epochs * (len(train_dataset) // config.global_batch_size))
        warmup = args.warmup_steps or math.ceil(args.warmup_ratio * self.max_steps)
        opt_fn = optimizer_fn or (lambda ps: torch.optim.AdamW(
            decay_groups(ps, args.weight_decay), lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon))
        self.model: ParallelModel = parallelize(
            model, config, optimizer_fn=opt_fn, seq_len=self.seq,
            split_points=args.split_points, mesh=mesh, max_grad_norm=args.max_grad_norm,
            lr_schedule=lr_lambda(args.lr_scheduler_type, warmup, self.max_steps),
            schedule=schedule)
        self.step = 0

    def _batch(self, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch after ``samples`` samples consumed: the next B entries of a
        seeded permutation per epoch (an epoch is every full global batch of the
        dataset). Counting samples, not steps, keeps the data position when a run
        resumes with another global batch size."""
        n, B = len(self.dataset), self.config.global_batch_size
        per_epoch = (n // B) * B
        idx: list[int] = []
        while len(idx) < B:
            epoch, k = divmod(samples + len(idx), per_epoch)
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(
                self.args.seed + epoch))
            idx += perm[k:min(per_epoch, k + B - len(idx))].tolist()
        pairs = [pad_sample(i, self.dataset[i], self.seq, self.args.pad_token_id) for i in idx]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    def evaluate(self) -> dict:
        """Loss and perplexity on ``eval_dataset`` (every full global batch of it, in
        order; the forwards only, :meth:`ParallelModel.evaluate`). Every rank calls it
        and gets the same numbers."""
        if self.eval_dataset is None:
            raise ExecError("evaluate() needs an eval_dataset; pass one to the Trainer")
        B = self.config.global_batch_size
        losses = []
        for start in range(0, len(self.eval_dataset) - B + 1, B):
            pairs = [pad_sample(i, self.eval_dataset[i], self.seq, self.args.pad_token_id)
                     for i in range(start, start + B)]
            losses.append(self.model.evaluate(torch.stack([p[0] for p in pairs]),
                                              torch.stack([p[1] for p in pairs])))
        loss = sum(losses) / len(losses)
        out = {"step": self.step, "eval_loss": loss,
               "perplexity": math.exp(loss) if loss < 700 else math.inf}
        self.eval_history.append(out)
        if self.model.mesh.rank == 0:
            print(f"eval step {self.step} loss {loss:.6f} perplexity {out['perplexity']:.4g}",
                  flush=True)
        return out

    def save_model(self, output_dir: str) -> Path:
        """Write the model, as trained so far, to ``output_dir`` in HuggingFace's layout
        (``AutoModelForCausalLM.from_pretrained(output_dir)`` loads it); every rank
        calls it. The built-in GPT is written as a GPT2LMHeadModel."""
        from merak_exec.export import save_model

        return save_model(self.model, output_dir, self.step, self.args.output_dir)

    def _after_step(self, samples: int) -> None:
        """Checkpoint and evaluate as the arguments ask after step ``self.step``."""
        a = self.args
        if a.save_steps and (self.step % a.save_steps == 0 or self.step == self.max_steps):
            save_checkpoint(self.model, f"{a.output_dir}/checkpoint-{self.step}", self.step,
                            samples)
            if self.model.mesh.rank == 0 and a.save_total_limit:
                rotate_checkpoints(a.output_dir, a.save_total_limit)
        if a.eval_strategy == "steps" and (self.step % a.eval_steps == 0
                                           or self.step == self.max_steps):
            self.evaluate()

    def train(self, resume_from_checkpoint: str | bool | None = None) -> RunResult:
        """Run to ``max_steps`` iterations, first resuming from a checkpoint when one is
        given here or in the arguments (True: the newest in ``output_dir``)."""
        a, pm = self.args, self.model
        resume = resume_from_checkpoint if resume_from_checkpoint is not None \
            else a.resume_from_checkpoint
        if resume is True:
            found = checkpoints(a.output_dir)
            if not found:
                raise ExecError(f"resume_from_checkpoint=True but {a.output_dir} has no "
                                "checkpoint-<step> directory")
            resume = str(found[-1])
        B = self.config.global_batch_size
        samples = self.step * B
        if resume:
            restored = load_checkpoint(pm, resume)  # the LR schedule's iteration too
            self.step = restored.step
            samples = restored.samples if restored.samples is not None else self.step * B
        losses, times = [], []
        rank0 = pm.mesh.rank == 0
        while self.step < self.max_steps:
            ids, labels = self._batch(samples)
            t = time.perf_counter()
            out = pm.train_step(ids, labels)
            times.append(time.perf_counter() - t)
            losses.append(out.loss)
            self.step += 1
            samples += B
            if rank0 and a.logging_steps and self.step % a.logging_steps == 0:
                print(f"step {self.step} loss {out.loss:.6f} time {times[-1] * 1e3:.1f} ms"
                      + _opt_log(pm.runtime.optimizer), flush=True)
            self._after_step(samples)  # the last step always saves and evaluates
        events = gather_events(pm)
        meta = {"config": self.config.to_dict()}
        if self.eval_history:
            meta["eval"] = list(self.eval_history)
        res = RunResult(events=events, step_times_s=times, losses=losses, meta=meta)
        if a.trace_path and rank0:
            res.save_chrome_trace(a.trace_path)
        return res


def _precision_degrees(args: TrainingArguments, degrees: dict) -> dict:
    """The init() keywords with the arguments' bf16/fp16 and gradient_checkpointing."""
    out = dict(degrees)
    want = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    if want:
        if out.get("dtype", want) != want:
            raise ExecError(f"TrainingArguments asks for {want} but init() was given "
                            f"dtype={out['dtype']!r}; set one of them")
        out["dtype"] = want
    if args.gradient_checkpointing and out.get("recompute", "none") == "none":
        out["recompute"] = "full"
    return out


def _opt_log(opt) -> str:
    if not isinstance(opt, TrainingOptimizer):
        return ""
    lr = opt.param_groups[0]["lr"]
    return f" grad_norm {opt.last_grad_norm:.4g} lr {lr:.3g}"


def checkpoints(output_dir: str) -> list[Path]:
    """``checkpoint-<step>`` directories of ``output_dir``, oldest step first."""
    root = Path(output_dir)
    found = [p for p in root.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[11:]))


def rotate_checkpoints(output_dir: str, limit: int) -> None:
    """Delete all but the ``limit`` newest checkpoints (HuggingFace's save_total_limit;
    0 keeps them all, as HuggingFace does; a negative limit is refused, never read as
    "all but the last -limit")."""
    if not isinstance(limit, numbers.Integral) or isinstance(limit, bool) or limit < 0:
        raise ExecError(f"save_total_limit={limit!r} must be None or an integer >= 0")
    if limit == 0:
        return
    for old in checkpoints(output_dir)[:-limit]:
        shutil.rmtree(old, ignore_errors=True)


def gather_events(pm: ParallelModel) -> list[dict]:
    """The last iteration's events of every rank (on every rank)."""
    import torch.distributed as dist

    mine = pm.history[-1].events if pm.history else []
    allv: list = [None] * pm.mesh.world_size
    with bounded("gathering every rank's events"):
        dist.all_gather_object(allv, mine)
    return [e for r in allv for e in r]

