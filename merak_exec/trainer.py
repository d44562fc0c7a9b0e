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
saves DCP checkpoints every ``save_steps`` and resumes from one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from merak_exec.checkpoint import load_checkpoint, save_checkpoint
from merak_exec.mesh import ExecError, Mesh, build_mesh, init_distributed
from merak_exec.parallel import ParallelModel, parallelize
from merak_exec.result import RunResult
from merak_sim.config import ParallelConfig

__all__ = ["init", "TrainingArguments", "Trainer", "gather_events"]

_STATE: dict = {}


def init(dp: int = 1, tp: int = 1, pp: int = 1, **config) -> Mesh:
    """Start torch.distributed (torchrun, srun or a single process) and build the
    dp x tp x pp groups. Extra keywords are ParallelConfig fields (schedule, recompute,
    virtual_stages, tp_overlap, ...); batch fields come from TrainingArguments."""
    init_distributed()
    _STATE["degrees"] = dict(dp=dp, tp=tp, pp=pp, **config)
    cfg = _make_config(1, 1, **_STATE["degrees"])
    _STATE["mesh"] = build_mesh(cfg)
    return _STATE["mesh"]


def _make_config(mbs: int, accum: int, **kw) -> ParallelConfig:
    dp = kw.get("dp", 1)
    kw.setdefault("dtype", "fp32")
    return ParallelConfig(micro_batch_size=mbs, global_batch_size=mbs * accum * dp, **kw)


@dataclass
class TrainingArguments:
    """What to train for and how (the subset of HF TrainingArguments that applies).

    Attributes:
        output_dir: where checkpoints and the measured trace go.
        per_device_train_batch_size: micro-batch size.
        gradient_accumulation_steps: micro-batches per iteration per pipeline (M).
        max_steps: iterations to run.
        learning_rate, weight_decay: AdamW settings.
        seed: seeds the data order.
        logging_steps: print the loss every this many steps (rank 0).
        save_steps: checkpoint every this many steps (0: never).
        resume_from_checkpoint: a checkpoint directory to resume from.
        seq_len: sequence length (default: the dataset's).
        split_points: explicit pipeline split points (layer indices).
        trace_path: write the last step's Chrome trace here (rank 0).
    """

    output_dir: str = "merak_out"
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    max_steps: int = 10
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    seed: int = 0
    logging_steps: int = 1
    save_steps: int = 0
    resume_from_checkpoint: str | None = None
    seq_len: int | None = None
    split_points: list[int] | None = None
    trace_path: str | None = None
    extra: dict = field(default_factory=dict)


def _to_pair(sample) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(sample, dict):
        ids = torch.as_tensor(sample["input_ids"])
        labels = torch.as_tensor(sample.get("labels", ids))
        return ids, labels
    ids, labels = sample
    return torch.as_tensor(ids), torch.as_tensor(labels)


class Trainer:
    """Trains ``model`` on ``train_dataset`` with the degrees given to :func:`init`.

    ``train_dataset`` is indexable; each item is ``{"input_ids": [s], "labels": [s]}``
    (labels already aligned with the positions whose next token they are) or an
    ``(ids, labels)`` pair. Every rank must see the same dataset.
    """

    def __init__(self, model, args: TrainingArguments, train_dataset, optimizer_fn=None,
                 config: ParallelConfig | None = None) -> None:
        if config is None:
            if "degrees" not in _STATE:
                init()
            config = _make_config(args.per_device_train_batch_size,
                                  args.gradient_accumulation_steps, **_STATE["degrees"])
            mesh = _STATE["mesh"]
        else:
            mesh = build_mesh(config)
        if len(train_dataset) < config.global_batch_size:
            raise ExecError(f"dataset has {len(train_dataset)} samples, fewer than one global "
                            f"batch ({config.global_batch_size})")
        self.args, self.config, self.dataset = args, config, train_dataset
        seq = args.seq_len or int(_to_pair(train_dataset[0])[0].shape[-1])
        opt_fn = optimizer_fn or (lambda ps: torch.optim.AdamW(
            ps, lr=args.learning_rate, weight_decay=args.weight_decay))
        self.model: ParallelModel = parallelize(model, config, optimizer_fn=opt_fn,
                                                seq_len=seq, split_points=args.split_points,
                                                mesh=mesh)
        self.step = 0

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Global batch of iteration ``step``: a seeded permutation per epoch."""
        n, B = len(self.dataset), self.config.global_batch_size
        per_epoch = n // B
        epoch, k = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.args.seed + epoch))
        idx = perm[k * B:(k + 1) * B].tolist()
        pairs = [_to_pair(self.dataset[i]) for i in idx]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    def train(self) -> RunResult:
        """Run ``max_steps`` iterations (continuing after a resumed step)."""
        a, pm = self.args, self.model
        if a.resume_from_checkpoint:
            self.step = load_checkpoint(pm, a.resume_from_checkpoint)
        losses, times = [], []
        rank0 = pm.mesh.rank == 0
        while self.step < a.max_steps:
            ids, labels = self._batch(self.step)
            t = time.perf_counter()
            out = pm.train_step(ids, labels)
            times.append(time.perf_counter() - t)
            losses.append(out.loss)
            self.step += 1
            if rank0 and a.logging_steps and self.step % a.logging_steps == 0:
                print(f"step {self.step} loss {out.loss:.6f} time {times[-1] * 1e3:.1f} ms",
                      flush=True)
            if a.save_steps and self.step % a.save_steps == 0:
                save_checkpoint(pm, f"{a.output_dir}/checkpoint", self.step)
        events = gather_events(pm)
        res = RunResult(events=events, step_times_s=times, losses=losses,
                        meta={"config": self.config.to_dict()})
        if a.trace_path and rank0:
            res.save_chrome_trace(a.trace_path)
        return res


def gather_events(pm: ParallelModel) -> list[dict]:
    """The last iteration's events of every rank (on every rank)."""
    import torch.distributed as dist

    mine = pm.history[-1].events if pm.history else []
    allv: list = [None] * pm.mesh.world_size
    dist.all_gather_object(allv, mine)
    return [e for r in allv for e in r]

