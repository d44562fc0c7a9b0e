"""pp = tp = dp = 1: merak_exec's step time versus a plain PyTorch training loop.

Same model (the built-in GPT), same micro-batches (gradient accumulation over M),
same AdamW step, one process, one thread. The runtime interprets the 1F1B schedule
(F0 B0 F1 B1 ... AR OPT) and records every action; the plain loop is the textbook
``for mb: loss(model(x), y) / M .backward(); opt.step(); opt.zero_grad()``. Runs
alternate after warm-up; the figure is the median of each and the overhead
(ours / plain - 1). Run:

    .venv/bin/python benchmarks/bench_exec_overhead.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from merak_exec.models import GPT, GPTConfig, lm_loss
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    M, mbs, seq = a.microbatches, a.mbs, a.seq
    mcfg = GPTConfig(vocab_size=a.vocab, n_positions=seq, n_embd=a.hidden, n_layer=a.layers,
                     n_head=a.heads)
    pc = ParallelConfig(micro_batch_size=mbs, global_batch_size=M * mbs, dtype="fp32")
    torch.manual_seed(0)
    ours = parallelize(GPT(mcfg), pc, seq_len=seq,
                       optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-4))
    torch.manual_seed(0)
    plain = GPT(mcfg)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)
    labels = torch.randint(0, mcfg.vocab_size, (M * mbs, seq), generator=g)

    def step_plain() -> float:
        total = 0.0
        for x, y in zip(ids.split(mbs), labels.split(mbs), strict=True):
            loss = lm_loss(plain(x), y)
            (loss / M).backward()
            total += loss.item() / M
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    def step_ours() -> float:
        return ours.train_step(ids, labels).loss

    t_ours, t_plain = [], []
    for i in range(a.warmup + a.steps):
        order = ((step_ours, t_ours), (step_plain, t_plain))
        for fn, acc in (order if i % 2 == 0 else order[::-1]):
            t = time.perf_counter()
            fn()
            if i >= a.warmup:
                acc.append(time.perf_counter() - t)
    mo, mp_ = statistics.median(t_ours), statistics.median(t_plain)
    print(f"config: {json.dumps(vars(a))}")
    print(f"merak_exec pp=tp=dp=1   median step {mo * 1e3:8.2f} ms  (n={len(t_ours)})")
    print(f"plain PyTorch loop      median step {mp_ * 1e3:8.2f} ms  (n={len(t_plain)})")
    print(f"overhead = {(mo / mp_ - 1) * 100:+.2f} %")


if __name__ == "__main__":
    main()
