"""How noisy is this machine? The floor under any prediction-versus-measurement error.

    .venv/bin/python benchmarks/machine_noise.py [--seconds 20] [--procs 1 2]

Times two fixed pieces of work back to back for ``--seconds``, first in one process,
then in ``--procs`` processes at once (one torch thread each, as in the validation
suite):

- ``matmul``: a loop of 256x256 fp32 matrix products (one large kernel at a time);
- ``gpt-step``: one training step of the validation suite's small built-in GPT
  (4 layers of hidden 128, sequence 128, 4 micro-batches of 2, AdamW), the kind of
  work the suite times: many small kernels, allocations and Python glue.

Prints, per work and process count, the median sample, the p10-p90 spread of single
samples and the spread of 2-second window medians (max/min - 1). A prediction from
a profile taken minutes earlier cannot be expected to agree with a single measured
iteration more closely than these spreads. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _work(kind: str):
    import torch

    if kind == "matmul":
        a, b = torch.randn(256, 256), torch.randn(256, 256)

        def run():
            for _ in range(20):
                a @ b
        return run
    from merak_exec.models.gpt import GPT, GPTConfig, lm_loss
    from merak_exec.profiling.cases import small_gpt

    torch.manual_seed(0)
    cfg = GPTConfig(**small_gpt(layers=4))
    m = GPT(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.n_positions + 1))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def run():
        for _ in range(4):
            lm_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


def _sample(kind: str, seconds: float, start_at: float, out) -> None:
    """One process: warm up, wait for the common start, time ``kind`` until the end."""
    import torch

    torch.set_num_threads(1)
    run = _work(kind)
    for _ in range(5):
        run()
    while time.time() < start_at:
        time.sleep(0.001)
    ts = []
    end = time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        run()
        ts.append((t, time.perf_counter() - t))
    out.put(ts)


def measure(kind: str, procs: int, seconds: float) -> dict:
    """Samples of ``kind`` from ``procs`` processes running at once, summarized."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 15  # time to import torch and warm up in every process
    ps = [ctx.Process(target=_sample, args=(kind, seconds, start_at, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    samples = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    ds = sorted(d for s in samples for _, d in s)
    windows = []
    for s in samples:
        t0, win = s[0][0], {}
        for t, d in s:
            win.setdefault(int((t - t0) // 2), []).append(d)
        windows += [statistics.median(v) for v in win.values() if len(v) >= 3]
    n = len(ds)
    return {"work": kind, "procs": procs, "samples": n, "median_ms": ds[n // 2] * 1e3,
            "p10_p90_spread": ds[9 * n // 10] / ds[n // 10] - 1,
            "window_spread": max(windows) / min(windows) - 1 if windows else float("nan")}


def main(argv: list[str] | None = None) -> int:
    """Measure and print the noise figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="timing per measurement")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2],
                    help="process counts to measure")
    a = ap.parse_args(argv)
    if a.seconds <= 0 or min(a.procs) < 1:
        ap.error("--seconds and --procs must be positive")
    print(f"{'work':10s} {'procs':>5s} {'samples':>7s} {'median ms':>10s} "
          f"{'p10-p90':>8s} {'2-s windows':>11s}")
    for kind in ("matmul", "gpt-step"):
        for procs in a.procs:
            r = measure(kind, procs, a.seconds)
            print(f"{r['work']:10s} {r['procs']:5d} {r['samples']:7d} {r['median_ms']:10.2f} "
                  f"{r['p10_p90_spread'] * 100:7.1f}% {r['window_spread'] * 100:10.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
