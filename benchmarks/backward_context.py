"""How much does a backward's context change its time? Two effects the CPU profile meets
differently from a pipeline run, measured side by side in one process.

    .venv/bin/python benchmarks/backward_context.py [--layers 4] [--rounds 40]

The validation profiler (:mod:`merak_exec.profiling.stage_profile`) times a stage's backward
right after its own forward, on cleared gradients. In a 1F1B run, (a) every backward
of a step but a rank's first adds into gradients already there, and (b) on all but the
last stage other micro-batches' forwards and backwards run between a micro-batch's
forward and its backward, so its activations and the weights' gradients are no longer
in cache. This script times, on the suite's GPT (one process, one thread, the whole
model as one stage of ``--layers`` layers):

- *fresh*: backward right after its forward, gradients cleared (the profile's case);
- *adding*: the same, gradients already there (case a; the profiler measures this
  difference in pairs and the pricing adds it, ``*_accum_delta_s``);
- *after two forwards*: forward of micro-batch 0, forwards of two others, then
  micro-batch 0's backward, gradients cleared (case b; not modelled).

Each round times the three back to back; prints the medians over ``--rounds`` rounds
and each case's ratio to *fresh* (the median of the per-round ratios). Nothing is
asserted: the figures are this machine's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """Time the three cases and print their medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="layers of the stage")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the three cases")
    a = ap.parse_args(argv)
    if a.layers < 1 or a.rounds < 3:
        ap.error("--layers must be positive and --rounds at least 3")
    import torch

    from merak_exec.models import GPT, GPTConfig
    from merak_exec.profiling.cases import small_gpt

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = dict(small_gpt(), n_layer=a.layers)
    model = GPT(GPTConfig(**cfg))
    xs = [torch.randint(0, cfg["vocab_size"], (2, cfg["n_positions"])) for _ in range(3)]

    def loss(x):
        out = model(x)
        return (out[0] if isinstance(out, tuple) else out).float().mean()

    def clear():
        for p in model.parameters():
            p.grad = None

    def timed_backward(lo):
        t = time.perf_counter()
        lo.backward()
        return time.perf_counter() - t

    def fresh():
        clear()
        return timed_backward(loss(xs[0]))

    def adding():
        return timed_backward(loss(xs[0]))  # after fresh(): the gradients are there

    def after_two_forwards():
        clear()
        lo = loss(xs[0])
        others = [loss(xs[1]), loss(xs[2])]
        d = timed_backward(lo)
        del others
        return d

    cases = {"fresh": fresh, "adding": adding, "after two forwards": after_two_forwards}
    for _ in range(5):
        for f in cases.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, f in cases.items():
            times[k].append(f())
    base = times["fresh"]
    print(f"GPT stage: {a.layers} layers, hidden {cfg['n_embd']}, sequence "
          f"{cfg['n_positions']}, micro-batch 2; {a.rounds} rounds")
    for k, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, base, strict=True))
        print(f"{k:20s} median {statistics.median(ts) * 1e3:7.2f} ms   ratio to fresh "
              f"{ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
