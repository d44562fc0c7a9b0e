"""Multi-process workers for mixed precision, clipping, LR schedules and the
HuggingFace-style Trainer (gloo on loopback, CPU).

:func:`run_world` runs one ``case_*`` function of this module on every rank and
returns what each rank wrote (a JSON file per rank, written before teardown).
"""

from __future__ import annotations

import json
import os

import torch

from merak_exec.launch import run_ranks
from merak_exec.mesh import init_distributed, loopback_env
from merak_sim.io import atomic_write_text
from support.launches import STORE_PORT, failure_text
from support.models import build_model, data

__all__ = ["run_world", "reference_amp", "amp_run", "hf_loss_run", "case_amp", "case_trainer",
           "case_hf_loss", "case_zero_resume", "case_each"]


def _main(rank: int, world: int, port: int, name: str, arg: dict, out: str) -> None:
    os.environ["MERAK_TIMEOUT_S"] = "60"
    try:
        loopback_env(rank, world, port)
        init_distributed(backend="gloo")
        result = globals()[name](rank, arg)
    except Exception:
        result = {"exception": failure_text(rank)}
    atomic_write_text(os.path.join(out, f"{name}-{rank}.json"), json.dumps(result))
    os._exit(0)


def run_world(world: int, name: str, arg: dict, out: str, timeout_s: float = 400) -> list:
    """Every rank's result of ``name(rank, arg)``."""
    codes = run_ranks(_main, world, (world, STORE_PORT, name, arg, out), timeout_s=timeout_s)
    if None in codes:
        raise TimeoutError(f"{name} did not finish within {timeout_s} s")
    return [json.load(open(os.path.join(out, f"{name}-{r}.json"))) for r in range(world)]


def case_each(rank: int, arg: dict) -> dict:
    """Every ``[key, name, arg]`` of ``arg["jobs"]`` in turn in this world (one process
    start for several cases): ``{key: name(rank, arg)}``, or ``{"exception": ...}`` for
    a case that raised."""
    out = {}
    for key, name, a in arg["jobs"]:
        try:
            out[key] = globals()[name](rank, a)
        except Exception:
            out[key] = {"exception": failure_text(rank)}
    return out


def _amp_dtype(name: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)


def reference_amp(kind: str, batches, mbs: int, dtype: str, lr: float, clip: float | None,
                  schedule) -> tuple[list[float], list[float]]:
    """One process, plain torch: autocast forward per micro-batch (fp32 weights), AdamW,
    torch's clip_grad_norm_, GradScaler for fp16, LambdaLR with ``schedule``. Returns
    the losses and the global gradient norms before clipping (when ``clip``)."""
    from merak_exec.capture import to_chain

    model = build_model(kind)
    chain, _ = to_chain(model, batches[0][0].shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    amp = _amp_dtype(dtype)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == "fp16")
    losses, norms = [], []
    for ids, labels in batches:
        n_mb = ids.shape[0] // mbs
        total = 0.0
        for x, y in zip(ids.split(mbs), labels.split(mbs), strict=True):
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                xs = (x,)
                for layer in chain.layers:
                    out = layer(*xs)
                    xs = out if isinstance(out, tuple) else (out,)
            loss = chain.loss_fn(xs[0], y)
            scaler.scale(loss / n_mb).backward()
            total += loss.item() / n_mb
        scaler.unscale_(opt)
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    return losses, norms


def case_amp(rank: int, arg: dict) -> list[dict]:
    """Every case of ``arg["cases"]`` (see :func:`amp_run`)."""
    return [amp_run(c) for c in arg["cases"]]


def amp_run(arg: dict) -> dict:
    """Train ``arg["config"]`` with AdamW, clipping and a warmup+cosine schedule through
    parallelize; the one-process reference of the same model, data and precision."""
    from merak_exec.optim import lr_lambda
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig
    from support.models import tiny_gpt_config

    pc = ParallelConfig(**arg["config"])
    kind, steps, lr, clip = arg.get("model", "gpt"), arg.get("steps", 4), 1e-2, arg["clip"]
    sched = lr_lambda("cosine", 1, steps)
    mcfg = tiny_gpt_config()
    batches = data(mcfg, pc.global_batch_size, mcfg.n_positions, 1) * steps  # loss falls
    pm = parallelize(build_model(kind), pc, seq_len=mcfg.n_positions,
                     optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=lr),
                     max_grad_norm=clip, lr_schedule=sched)
    opt = pm.runtime.optimizer
    losses, norms = [], []
    for x, y in batches:
        losses.append(pm.train_step(x, y).loss)
        norms.append(opt.last_grad_norm)
    ref, ref_norms = reference_amp(kind, batches, pc.micro_batch_size, pc.dtype, lr, clip, sched)
    return {"name": arg["name"], "losses": losses, "ref": ref, "norms": norms,
            "ref_norms": ref_norms,
            "param_dtypes": sorted({str(p.dtype) for p in pm.parameters()}),
            "state_dtypes": sorted({str(v.dtype) for s in opt.state.values()
                                    for v in s.values() if v.ndim > 0})}


def case_trainer(rank: int, arg: dict) -> dict:
    """Trainer with HF-style arguments: labels default to input_ids, unequal lengths
    padded, epochs, rotation (save_total_limit), then train(resume_from_checkpoint=True)
    continuing the same run."""
    from merak_exec.models import GPT
    from merak_exec.trainer import Trainer, TrainingArguments, checkpoints, init
    from support.models import tiny_gpt_config

    init(**arg.get("layout", {"pp": 2}))
    g = torch.Generator().manual_seed(3)
    ds = [{"input_ids": torch.randint(0, 64, (8 - (i % 3),), generator=g)} for i in range(16)]
    out = arg["dir"]

    def trainer(**kw):
        torch.manual_seed(0)
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=4, learning_rate=1e-2,
                                 warmup_steps=1, logging_steps=0, **kw)
        return Trainer(model=GPT(tiny_gpt_config()), args=args, train_dataset=ds)

    full = trainer(num_train_epochs=2).train().losses  # 16 samples / 4 = 4 steps an epoch
    saved = trainer(num_train_epochs=2, save_steps=2, save_total_limit=2).train().losses
    kept = [p.name for p in checkpoints(out)]
    t = trainer(num_train_epochs=2, save_steps=0)
    resumed_from = str(checkpoints(out)[0])
    resumed = t.train(resume_from_checkpoint=resumed_from).losses
    return {"full": full, "saved": saved, "kept": kept, "resumed": resumed,
            "resumed_from": os.path.basename(resumed_from), "bf16": arg.get("bf16", False)}


def case_hf_loss(rank: int, arg: dict) -> list[dict]:
    """HuggingFace GPT-2 through parallelize with labels = input_ids (and some -100):
    the first step's loss against GPT2LMHeadModel(ids, labels=ids).loss on the same
    weights and batch."""
    return [hf_loss_run(c) for c in arg["configs"]]


def hf_loss_run(config: dict) -> dict:
    """One configuration of :func:`case_hf_loss`."""
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig(**config)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 64, (pc.global_batch_size, 8), generator=g)
    labels = ids.clone()
    labels[:, 5] = -100
    hf = build_model("gpt2")
    with torch.no_grad():
        want = [float(hf(ids, labels=ids).loss), float(hf(ids, labels=labels).loss)]
    pm = parallelize(build_model("gpt2"), pc, seq_len=8,
                     optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=0.0))
    got = [pm.train_step(ids).loss, pm.train_step(ids, labels).loss]
    return {"got": got, "want": want}


def case_overlap(rank: int, arg: dict) -> list[dict]:
    """dp2: bucketed overlapped gradient averaging against the flat all-reduce, per
    schedule: losses, the last step's gradients, and how many buckets overlapped."""
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig
    from support.models import RecordingSGD, tiny_gpt_config

    out = []
    for sched, rec in arg["schedules"]:
        pc = ParallelConfig(dp=2, micro_batch_size=1, global_batch_size=8, dtype="fp32",
                            schedule=sched, recompute=rec)
        mcfg = tiny_gpt_config()
        batches = data(mcfg, pc.global_batch_size, mcfg.n_positions, 3)
        runs = {}
        for overlap in (False, True):
            pm = parallelize(build_model("gpt"), pc, seq_len=mcfg.n_positions,
                             optimizer_fn=lambda ps: RecordingSGD(ps, lr=0.1),
                             overlap_dp=overlap, buckets=3)
            losses = [pm.train_step(x, y).loss for x, y in batches]
            runs[overlap] = (losses, pm.runtime.optimizer.last_grads, pm.runtime.grad_reducer)
        (lf, gf, _), (lo, go, red) = runs[False], runs[True]
        err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-3))
                  for a, b in zip(go, gf, strict=True))
        out.append({"schedule": sched, "loss_flat": lf, "loss_overlap": lo, "grad": err,
                    "buckets": len(red.buckets), "overlapped": red.overlapped})
    return out


def case_zero_resume(rank: int, arg: dict) -> dict:
    """dp2 ZeRO-1 fp16 (other fields from ``arg["config"]``) with clipping and a cosine
    schedule: 4 uninterrupted steps against 2 steps, a checkpoint, and 2 more steps of
    a model built from another seed and resumed from it. The loss scale is moved off
    its default after step 2 (as a backoff would), so only a saved scaler makes the
    two runs' scalers agree."""
    from merak_exec.checkpoint import load_checkpoint, save_checkpoint
    from merak_exec.fsdp import local_tensor
    from merak_exec.optim import lr_lambda
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig
    from support.models import tiny_gpt_config

    pc = ParallelConfig(**{"dp": 2, "zero": 1, "dtype": "fp16", "micro_batch_size": 1,
                           "global_batch_size": 8, **arg.get("config", {})})
    mcfg = tiny_gpt_config()
    batches = data(mcfg, pc.global_batch_size, mcfg.n_positions, 4)

    def build(seed):
        torch.manual_seed(seed)
        return parallelize(build_model("gpt"), pc, seq_len=mcfg.n_positions,
                           optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
                           max_grad_norm=0.5, lr_schedule=lr_lambda("cosine", 1, 4))

    def scaler_state(pm):
        s = pm.runtime.optimizer.scaler
        return [s.scale, s.good_steps, pm.runtime.optimizer.iteration]

    def train(pm, part):
        out = [pm.train_step(x, y).loss for x, y in part]
        return out

    full = build(0)
    losses = train(full, batches[:2])
    full.runtime.optimizer.scaler.scale, full.runtime.optimizer.scaler.good_steps = 2.0 ** 10, 3
    losses += train(full, batches[2:])
    first = build(0)
    train(first, batches[:2])
    first.runtime.optimizer.scaler.scale, first.runtime.optimizer.scaler.good_steps = 2.0 ** 10, 3
    save_checkpoint(first, arg["dir"], 2)
    resumed = build(123)
    step = load_checkpoint(resumed, arg["dir"]).step
    restored = scaler_state(resumed)
    tail = train(resumed, batches[2:])
    err = max(float((local_tensor(a.detach()) - local_tensor(b.detach())).abs().max())
              for a, b in zip(resumed.parameters(), full.parameters(), strict=True))
    return {"full": losses, "resumed": tail, "step": step, "restored": restored,
            "scaler_full": scaler_state(full), "scaler_resumed": scaler_state(resumed),
            "param_err": err, "state_keys": len(resumed.runtime.optimizer.state)}
