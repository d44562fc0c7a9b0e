"""Sub-pipelined TP (Merak T3) versus plain TP on 2 CPU ranks (gloo): step time.

Same model (the built-in GPT), tp=2, same micro-batches; the only difference is
``tp_overlap="sub-pipelined"`` (k=2 parts per micro-batch, each part's all-reduces
overlapping the other part's compute). Runs alternate after warm-up; the figure is
the median step time of each and their ratio. On a 2-core CPU machine the overlap can
only hide gloo latency: compute of the two parts competes for the same cores. Run:

    .venv/bin/python benchmarks/bench_exec_tp_overlap.py [--steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def worker(rank: int, world: int, port: int, a: dict, out: str) -> None:
    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    import torch.distributed as dist

    from merak_exec.models import GPT, GPTConfig
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    init_distributed(backend="gloo")
    M, mbs, seq = a["microbatches"], a["mbs"], a["seq"]
    mcfg = GPTConfig(vocab_size=a["vocab"], n_positions=seq, n_embd=a["hidden"],
                     n_layer=a["layers"], n_head=a["heads"])
    runs = {}
    for mode in ("none", "sub-pipelined"):
        pc = ParallelConfig(tp=2, micro_batch_size=mbs, global_batch_size=M * mbs,
                            tp_overlap=mode, tp_overlap_parts=2, dtype="fp32")
        torch.manual_seed(0)
        runs[mode] = parallelize(GPT(mcfg), pc, seq_len=seq,
                                 optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=1e-3))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)
    labels = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)
    times = {k: [] for k in runs}
    for i in range(a["warmup"] + a["steps"]):
        for mode, pm in runs.items():
            dist.barrier()
            t = time.perf_counter()
            pm.train_step(ids, labels)
            dist.barrier()
            if i >= a["warmup"]:
                times[mode].append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.barrier()
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=2)
    a = vars(p.parse_args())
    import torch.multiprocessing as mp

    from merak_exec.launch import free_port

    out = os.path.join(tempfile.mkdtemp(), "r.json")
    mp.spawn(worker, args=(2, free_port(), a, out), nprocs=2)
    r = json.load(open(out))
    m0, m1 = statistics.median(r["none"]), statistics.median(r["sub-pipelined"])
    print(f"config: {json.dumps(a)}")
    print(f"tp=2 plain          median step {m0 * 1e3:8.2f} ms  (n={len(r['none'])})")
    print(f"tp=2 sub-pipelined  median step {m1 * 1e3:8.2f} ms  (n={len(r['sub-pipelined'])})")
    print(f"ratio sub-pipelined/plain = {m1 / m0:.3f}")


if __name__ == "__main__":
    main()
