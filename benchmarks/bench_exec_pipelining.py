"""Our 1F1B versus torch.distributed.pipelining's Schedule1F1B on 2 CPU ranks (gloo).

Same model (the built-in GPT, head untied), same two stages (our uniform split, the very same
StageModule objects wrapped in a PipelineStage), same micro-batches, same SGD step.
Both are timed in the same processes, alternating, after warm-up; the figure is the
median step time of each and their ratio (ours / torch; <= 1.0 means ours is no
slower). Run:

    .venv/bin/python benchmarks/bench_exec_pipelining.py [--steps 20] [--hidden 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def worker(rank: int, world: int, port: int, a: dict, out: str) -> None:
    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from merak_exec.models import GPT, GPTConfig, lm_loss
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    init_distributed(backend="gloo")
    M, mbs, seq = a["microbatches"], a["mbs"], a["seq"]
    # Untied head: pipelining's schedule does not sum tied gradients across stages,
    # so with a tied model ours would do an extra all-reduce the other one skips.
    mcfg = GPTConfig(vocab_size=a["vocab"], n_positions=seq, n_embd=a["hidden"],
                     n_layer=a["layers"], n_head=a["heads"], tie_embeddings=False)
    pc = ParallelConfig(pp=2, micro_batch_size=mbs, global_batch_size=M * mbs,
                        schedule="1f1b", dtype="fp32")
    torch.manual_seed(0)
    ours = parallelize(GPT(mcfg), pc, seq_len=seq, record=a["record"],
                       optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=1e-3))
    torch.manual_seed(0)
    theirs_pm = parallelize(GPT(mcfg), pc, seq_len=seq, record=False,
                            optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=1e-3))
    class Unwrap(torch.nn.Module):
        """Our StageModule returns a tuple of boundary tensors; pipelining wants one."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)[0]

    stage = PipelineStage(Unwrap(theirs_pm.chunks[0]), rank, 2, torch.device("cpu"))
    sched = Schedule1F1B(stage, M, loss_fn=lm_loss)
    opt = theirs_pm.runtime.optimizer
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)
    labels = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)

    def step_ours():
        ours.train_step(ids, labels)

    def step_theirs():
        if rank == 0:
            sched.step(ids)
        else:
            sched.step(target=labels, losses=[])
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_ours, t_theirs = [], []
    for i in range(a["warmup"] + a["steps"]):
        order = ((step_ours, t_ours), (step_theirs, t_theirs))
        for fn, acc in (order if i % 2 == 0 else order[::-1]):  # no first-mover bias
            dist.barrier()
            t = time.perf_counter()
            fn()
            dist.barrier()
            if i >= a["warmup"]:
                acc.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"ours": t_ours, "theirs": t_theirs}, f)
    dist.barrier()
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="switch off our per-action event recording")
    a = vars(p.parse_args())
    import torch.multiprocessing as mp

    from merak_exec.launch import free_port

    out = os.path.join(tempfile.mkdtemp(), "r.json")
    mp.spawn(worker, args=(2, free_port(), a, out), nprocs=2)
    r = json.load(open(out))
    mo, mt = statistics.median(r["ours"]), statistics.median(r["theirs"])
    print(f"config: {json.dumps(a)}")
    print(f"merak_exec 1F1B            median step {mo * 1e3:8.2f} ms  (n={len(r['ours'])})")
    print(f"pipelining Schedule1F1B    median step {mt * 1e3:8.2f} ms  (n={len(r['theirs'])})")
    print(f"ratio ours/torch = {mo / mt:.3f}")
    # each iteration times both back to back: the median of the paired ratios is less
    # sensitive to other jobs on a shared machine than the ratio of medians
    paired = statistics.median(o / t for o, t in zip(r["ours"], r["theirs"], strict=True))
    print(f"median paired ratio = {paired:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
