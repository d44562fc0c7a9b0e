"""Multi-process checkpoint workers: resuming at another layout, and refusing unsafe or
foreign checkpoint folders.

:func:`run_jobs` starts ``world`` gloo ranks that run each job of a list in turn; a job
names a function of this module and its argument, and every rank writes the job's
result to ``<out>/<job>-rank<r>.json`` before the next starts.
"""

from __future__ import annotations

import json
import os
import traceback

import torch

from merak_exec.launch import STORE_PORT, run_ranks
from merak_exec.mesh import init_distributed, loopback_env
from merak_sim.io import atomic_write_text
from support.models import build_model, data, tiny_gpt_config

__all__ = ["run_jobs", "LAYOUTS"]

#: The layouts of the resharding matrix (ParallelConfig fields; global batch 4).
LAYOUTS = {
    "one": {},
    "dp2": {"dp": 2},
    "pp2": {"pp": 2},
    "zb-v": {"pp": 2, "schedule": "zb-v", "virtual_stages": 2},
    "tp2": {"tp": 2},
    "zero1": {"dp": 2, "zero": 1},
    "zero3": {"dp": 2, "zero": 3},
    "bf16": {"dp": 2, "dtype": "bf16"},
}
STEPS = 4  # a run saves after 2 steps; the resumed run does the last 2


def _build(layout: str, seed: int = 0):
    from merak_exec.optim import lr_lambda
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig(**{"dtype": "fp32", "micro_batch_size": 1, "global_batch_size": 4,
                           **LAYOUTS[layout]})
    torch.manual_seed(seed)
    model = build_model("gpt", 4)
    if seed:  # another start: resuming must overwrite every value
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
    return parallelize(model, pc, seq_len=tiny_gpt_config().n_positions,
                       optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
                       max_grad_norm=1.0, lr_schedule=lr_lambda("cosine", 1, STEPS))


def _batches():
    cfg = tiny_gpt_config()
    return data(cfg, 4, cfg.n_positions, STEPS)


def job_save(rank: int, arg: dict) -> dict:
    """Train ``arg["layout"]`` 2 steps and save to ``arg["dir"]``."""
    from merak_exec.checkpoint import save_checkpoint

    pm = _build(arg["layout"])
    losses = [pm.train_step(x, y).loss for x, y in _batches()[:2]]
    save_checkpoint(pm, arg["dir"], 2)
    return {"losses": losses}


def job_resume(rank: int, arg: dict) -> dict:
    """At ``arg["layout"]``: 4 uninterrupted steps, and 2 steps resumed from
    ``arg["dir"]`` (saved at another layout) on a model built from another seed."""
    from merak_exec.checkpoint import load_checkpoint

    batches = _batches()
    full = _build(arg["layout"])
    full_losses = [full.train_step(x, y).loss for x, y in batches]
    pm = _build(arg["layout"], seed=123)
    restored = load_checkpoint(pm, arg["dir"])
    tail = [pm.train_step(x, y).loss for x, y in batches[2:]]
    return {"full": full_losses, "tail": tail, "step": restored.step,
            "samples": restored.samples, "resharded": restored.resharded,
            "iteration": getattr(pm.runtime.optimizer, "iteration", None)}


def job_refusals(rank: int, arg: dict) -> dict:
    """Unsafe and foreign folders next to a good checkpoint at ``arg["dir"]``: each load
    must raise one CheckpointError line; a planted pickle must not run."""
    import pickle
    import shutil

    from merak_exec.checkpoint import CheckpointError, load_checkpoint

    good, work = arg["dir"], arg["work"]
    marker = os.path.join(work, "pwned")

    class Planted:
        def __reduce__(self):
            return (open, (marker, "w"))

    def variant(name, change):
        d = os.path.join(work, name)
        if rank == 0:
            shutil.copytree(good, d)
            change(d)
        torch.distributed.barrier()
        return d

    def plant(d):
        with open(os.path.join(d, ".metadata"), "wb") as f:
            pickle.dump(Planted(), f)

    def dcp_only(d):
        os.remove(os.path.join(d, "manifest.json"))
        plant(d)

    def flip(d):
        path = os.path.join(d, "rank00000.safetensors")
        raw = bytearray(open(path, "rb").read())
        raw[-5] ^= 0x01
        open(path, "wb").write(bytes(raw))

    def truncate_manifest(d):
        path = os.path.join(d, "manifest.json")
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[:len(raw) // 2])

    def truncate_shard(d):
        path = os.path.join(d, "rank00000.safetensors")
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[:100])

    cases = {"planted": plant, "dcp": dcp_only, "flipped": flip,
             "manifest": truncate_manifest, "truncated": truncate_shard}
    out = {}
    for name, change in cases.items():
        d = variant(name, change)
        try:
            load_checkpoint(_build("one"), d)
            out[name] = None
        except CheckpointError as e:
            out[name] = str(e)
    from merak_exec.parallel import parallelize
    from merak_exec.models import GPT, GPTConfig
    from merak_sim.config import ParallelConfig

    other = parallelize(GPT(GPTConfig(vocab_size=64, n_positions=8, n_embd=32, n_layer=4,
                                      n_head=4)), ParallelConfig(dtype="fp32"), seq_len=8)
    try:
        load_checkpoint(other, good)
        out["other-model"] = None
    except CheckpointError as e:
        out["other-model"] = str(e)
    out["pickle_ran"] = os.path.exists(marker)
    return out


def _main(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    """Process entry point: join the gloo world, run every ``(job, arg)`` in turn."""
    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", "60")
    torch.set_num_threads(1)
    try:
        init_distributed(backend="gloo")
        failed = None
    except Exception:
        failed = {"exception": traceback.format_exc()}
    for name, arg in jobs:
        try:
            result = failed or globals()[arg["job"]](rank, arg)
        except Exception:
            result = {"exception": traceback.format_exc()}
        atomic_write_text(os.path.join(out_dir, f"{name}-rank{rank}.json"), json.dumps(result))
    os._exit(0)


def run_jobs(world: int, jobs: list[tuple[str, dict]], out_dir: str,
             timeout_s: float = 300) -> dict[str, list]:
    """Run ``jobs`` on ``world`` ranks; {job name: per-rank results (None: none written)}."""
    codes = run_ranks(_main, world, (world, STORE_PORT, jobs, out_dir), timeout_s=timeout_s,
                      fail_fast=False)
    if None in codes:
        raise TimeoutError(f"checkpoint workers did not finish within {timeout_s} s")
    out = {}
    for name, _ in jobs:
        files = [os.path.join(out_dir, f"{name}-rank{r}.json") for r in range(world)]
        out[name] = [json.load(open(f)) if os.path.exists(f) else None for f in files]
    return out


def job_export(rank: int, arg: dict) -> dict:
    """Load ``arg["dir"]`` (saved at any layout) at one rank, export it, load the export
    with transformers and compare its logits with the loaded model's."""
    from merak_exec.checkpoint import load_checkpoint
    from merak_exec.export import export_hf
    from transformers import AutoModelForCausalLM

    pm = _build_kind(arg["kind"], "one")
    load_checkpoint(pm, arg["dir"])
    ids = torch.randint(0, 64, (2, tiny_gpt_config().n_positions),
                        generator=torch.Generator().manual_seed(9))
    xs = ids
    with torch.no_grad():
        for c in pm.chunks:
            for layer in c.layers:
                xs = layer(xs)
    export_hf(arg["dir"], arg["out"])
    hf = AutoModelForCausalLM.from_pretrained(arg["out"]).eval()
    with torch.no_grad():
        theirs = hf(ids).logits
    return {"max_abs": float((theirs - xs).abs().max()), "scale": float(xs.abs().max()),
            "class": type(hf).__name__}


def _build_kind(kind: str, layout: str):
    """A tiny ``kind`` model ("gpt", "gpt2", "llama-tied") parallelised at ``layout``."""
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig(**{"dtype": "fp32", "micro_batch_size": 1, "global_batch_size": 4,
                           **LAYOUTS[layout]})
    return parallelize(build_model(kind, 4), pc, seq_len=tiny_gpt_config().n_positions,
                       optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-2))


def job_save_kind(rank: int, arg: dict) -> dict:
    """Train a ``arg["kind"]`` model 2 steps at ``arg["layout"]``; save to ``arg["dir"]``."""
    from merak_exec.checkpoint import save_checkpoint

    pm = _build_kind(arg["kind"], arg["layout"])
    losses = [pm.train_step(x, y).loss for x, y in _batches()[:2]]
    save_checkpoint(pm, arg["dir"], 2)
    return {"losses": losses}


def job_evaluate(rank: int, arg: dict) -> dict:
    """At ``arg["layout"]``: the evaluation loss of a fresh model on one global batch,
    before and after 2 training steps, with the training loss of the same batch."""
    pm = _build(arg["layout"])
    x, y = _batches()[0]
    before = pm.evaluate(x, y)
    train = pm.train_step(x, y).loss  # the warmup's first step has LR 0
    pm.train_step(x, y)
    after = pm.evaluate(x, y)
    return {"before": before, "train": train, "after": after}


def job_trainer_data(rank: int, arg: dict) -> dict:
    """The Trainer on a token file (merak_exec.data) at pp2: evaluation every 2 steps
    and at the end, checkpoints every 2 steps and at the end, then save_model; rank 0
    loads the export with transformers and computes the held-out loss itself."""
    import numpy as np

    from merak_exec.data import load_data
    from merak_exec.models.gpt import lm_loss
    from merak_exec.trainer import Trainer, TrainingArguments, init

    tokens = os.path.join(arg["dir"], "tokens.bin")
    if rank == 0:
        rng = np.random.default_rng(0)
        np.tile(rng.integers(0, 64, 64, dtype=np.uint16), 20).tofile(tokens)
    torch.distributed.barrier()
    splits = load_data(tokens, seq_len=8, vocab_size=64, eval_fraction=0.1)
    init(pp=2, schedule="1f1b")
    args = TrainingArguments(output_dir=os.path.join(arg["dir"], "run"),
                             per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=5, learning_rate=3e-3, save_steps=2, eval_steps=2,
                             eval_strategy="steps", logging_steps=0, warmup_steps=0)
    torch.manual_seed(0)
    trainer = Trainer(build_model("gpt", 4), args, splits.train, eval_dataset=splits.eval)
    result = trainer.train()
    out = os.path.join(arg["dir"], "hf")
    trainer.save_model(out)
    ck = sorted(os.listdir(args.output_dir))
    res = {"eval": result.meta["eval"], "checkpoints": ck, "train": result.losses}
    if rank == 0:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(out).eval()
        B = 4
        with torch.no_grad():
            losses = [float(lm_loss(hf(ids).logits, ids)) for ids in (
                torch.stack([splits.eval[i]["input_ids"] for i in range(s, s + B)])
                for s in range(0, len(splits.eval) - B + 1, B))]
        res["hf_eval"] = sum(losses) / len(losses)
    return res
