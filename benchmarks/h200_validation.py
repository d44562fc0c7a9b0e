"""GPU validation on one H200 (issue 7, item 4): one prepared run, under 10 minutes.

    python benchmarks/h200_validation.py [--out traces/h200] [--budget-s 480]
    python benchmarks/h200_validation.py --smoke --out /tmp/h200-smoke   # CPU dry run

For two realistic shapes of the built-in GPT in bf16 (pp=1, one process, NCCL), it
profiles every action through the runtime (CUDA-synchronised host timing), trains
for real (2 warm-up + 5 timed iterations, CUDA-event timelines), simulates the
configuration from that fresh profile and reports the error
(:mod:`merak_sim.validation`). It also writes a per-layer ``merak-trace/1`` trace of
each shape (merak_exec's profiler) for the trace-driven cost model.

Writes under ``--out``: one run directory per shape (re-validate with
``merak-sim validate --run DIR``), ``gpt-<shape>.json`` traces, and ``report.md``
with the error table. Shapes are measured in order and the script stops starting
new ones when ``--budget-s`` would be exceeded, so a partial result is still written.

Status: prepared, NOT run in the session that wrote it (that task had no GPU lent);
``--smoke`` checks the whole path on CPU with tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from merak_sim.io import atomic_write_text  # noqa: E402
from merak_sim.validation import validate  # noqa: E402
from merak_sim.validation_measure import Case, measure_cases, small_gpt  # noqa: E402

# (name, GPT settings, micro-batch size, micro-batches). GPT-2 vocabulary padded to a
# multiple of 64; hidden / heads as GPT-2 medium and a 1.3B-class width.
SHAPES = [
    ("h1024-L12-s1024", small_gpt(layers=12, hidden=1024, heads=16, vocab=50304, seq=1024),
     8, 4),
    ("h2048-L8-s2048", small_gpt(layers=8, hidden=2048, heads=16, vocab=50304, seq=2048),
     2, 4),
]
SMOKE = [("smoke-a", small_gpt(layers=2, hidden=32, heads=4, vocab=64, seq=16), 2, 2),
         ("smoke-b", small_gpt(layers=2, hidden=64, heads=4, vocab=64, seq=32), 2, 2)]


def _layer_trace(model_cfg: dict, mbs: int, path: Path, device: str, dtype: str) -> None:
    """Per-layer merak-trace/1 trace of the shape (merak_exec's profiler)."""
    import torch

    from merak_exec.models import GPT, GPTConfig
    from merak_exec.profiler import profile_chain, write_trace

    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    prof = profile_chain(GPT(GPTConfig(**model_cfg)), mbs, model_cfg["n_positions"],
                         device=device, dtype=dt, repeats=5,
                         meta={"command": "benchmarks/h200_validation.py"})
    write_trace(prof, path)


def main(argv: list[str] | None = None) -> int:
    """Measure, validate, write the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "traces" / "h200"))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (gloo, fp32)")
    a = ap.parse_args(argv)
    import torch

    if not a.smoke and not torch.cuda.is_available():
        print("h200_validation: no CUDA device; use --smoke for a CPU dry run", file=sys.stderr)
        return 2
    shapes = SMOKE if a.smoke else SHAPES
    dtype, backend = ("fp32", "gloo") if a.smoke else ("bf16", "nccl")
    device = "cpu" if a.smoke else "cuda"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    reports, spent = [], []
    for name, mcfg, mbs, M in shapes:
        used = time.monotonic() - t0
        if spent and used + 1.5 * max(spent) > a.budget_s:
            print(f"skipping {name}: budget ({used:.0f} s used)")
            continue
        t = time.monotonic()
        case = Case(name, dict(micro_batch_size=mbs, global_batch_size=mbs * M, dtype=dtype,
                               schedule="1f1b"), mcfg)
        (d,) = measure_cases([case], out, world=1, backend=backend, steps=5, warmup_steps=2,
                             repeats=5, warmup=2, timeout_s=max(60.0, a.budget_s - used))
        _layer_trace(mcfg, mbs, out / f"gpt-{name}.json", device, dtype)
        rep = validate(d)
        rep.plot(out / f"{name}.png")
        reports.append(rep)
        spent.append(time.monotonic() - t)
        s = rep.summary()
        print(f"{name}: measured {s['measured_ms']:.2f} ms, predicted {s['predicted_ms']:.2f} ms, "
              f"error {s['error'] * 100:+.1f} %, actions {s['action_median_abs_error'] * 100:.1f} %"
              f", activation {s['activation_max_abs_error'] * 100:.1f} %", flush=True)
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not a.smoke else "cpu"
    lines = [f"# GPU validation ({dev})", "",
             f"Command: `python benchmarks/h200_validation.py {' '.join(argv or sys.argv[1:])}`"
             f" ({time.monotonic() - t0:.0f} s, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).", "",
             "| shape | measured ms | predicted ms | error | action median abs error | "
             "activation worst error |", "|---|---|---|---|---|---|"]
    for r in reports:
        s = r.summary()
        lines.append(f"| {s['run']} | {s['measured_ms']:.2f} | {s['predicted_ms']:.2f} | "
                     f"{s['error'] * 100:+.1f} % | {s['action_median_abs_error'] * 100:.1f} % | "
                     f"{s['activation_max_abs_error'] * 100:.1f} % |")
    lines.append("")
    lines += [r.to_markdown() for r in reports]
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "summary.json", json.dumps([r.summary() for r in reports],
                                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
