"""GPU validation on one H200: one prepared run, about 5 minutes.

    python benchmarks/h200_validation.py [--out traces/h200] [--budget-s 240] [--archive F]
    python benchmarks/h200_validation.py --dry-run --out /tmp/h200-dry   # CPU rehearsal

For two realistic shapes of the built-in GPT in bf16 (pp=1, one process, NCCL), it
profiles every action through the runtime (CUDA-synchronised host timing), trains
for real (2 warm-up + 5 timed iterations, CUDA-event timelines), simulates the
configuration from that fresh profile and reports the error
(:mod:`merak_sim.validation`). It also writes a per-layer ``merak-trace/1`` trace of
each shape (:mod:`merak_exec.profiling.layer_trace`) for the trace-driven cost model.
Each run directory's ``events.csv`` is the CUDA-event timeline of the training
iterations in the simulator's events schema (the profiler trace).

Then the one-GPU checks of :mod:`merak_exec.profiling.gpu_checks` (seconds): a bf16
autocast step against fp32 (loss within 2 %, fp32 master weights), and one block's
activation memory (``torch.cuda.memory_allocated``, SDPA flash attention) with no
and with selective recompute against merak_sim's memory model. A multi-rank NCCL run
needs 2+ GPUs: the report says so and nothing stands in for it.

Writes under ``--out``: one run directory per shape (re-validate with
``merak-sim validate --run DIR``), ``gpt-<shape>.json`` traces, ``<shape>.png``
side-by-side charts, ``report.md`` with the error table and ``summary.json``.
Shapes are measured in order; the script stops starting new ones when ``--budget-s``
would be exceeded, and a shape that fails (out of memory, a rank's error) is
reported in one line and in the report while the others go on, so a partial result
is still written. Exit status: 0 when every shape was measured, 1 otherwise, 2 on
bad input.

Runbook for a task that is lent the device (one call; a device call brings back at
most 8 files, so ``--archive`` packs the results into one; the device's image has
PyTorch, pandas, matplotlib, click and rich, but no SimPy, which the validation does
not need: it simulates with the exact evaluator; the repository is not installed
there, so the command puts its root on ``PYTHONPATH``)::

    run(timeout_s=590, command="export PYTHONUNBUFFERED=1 PYTHONPATH=.; python3
        benchmarks/h200_validation.py --out /tmp/h200 --archive $OUT/h200.tar.gz
        2>&1 | tee $OUT/log.txt")

then here: ``mkdir -p traces/h200 && tar xzf <files_at>/h200.tar.gz -C traces/h200``,
``merak-sim validate --run traces/h200/<shape>`` (re-validates on CPU), commit
``traces/h200/``, ``give_back``. The CPU rehearsal, SimPy blocked as on the device:
``tests/test_h200_validation.py``.

Status: prepared, NOT run on a GPU yet (the tasks that wrote it had no GPU lent);
``--dry-run`` runs the same code paths on CPU with tiny shapes (gloo, fp32). Without
a GPU and without ``--dry-run`` it exits 2 with one line.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path

from merak_exec.profiling.cases import Case, small_gpt
from merak_exec.profiling.gpu_checks import amp_check, memory_check
from merak_exec.profiling.measure import measure_cases
from merak_sim.io import atomic_write_bytes, atomic_write_text
from merak_sim.validation.compare import compare_run

ROOT = Path(__file__).resolve().parents[1]

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
    from merak_exec.profiling.layer_trace import profile_chain, write_trace

    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    prof = profile_chain(GPT(GPTConfig(**model_cfg)), mbs, model_cfg["n_positions"],
                         device=device, dtype=dt, repeats=5,
                         meta={"command": "benchmarks/h200_validation.py"})
    write_trace(prof, path)


def _archive(out: Path, path: Path) -> None:
    """Pack the results under ``out`` (not the runs' status files) into one gzipped
    tar at ``path``, written atomically: a device call brings back at most 8 files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(out.rglob("*")):
            if f.is_file() and not f.name.startswith(".") and f.resolve() != path.resolve():
                tar.add(f, arcname=str(f.relative_to(out)))
    atomic_write_bytes(path, buf.getvalue())


def _gpu_checks(mcfg: dict, mbs: int, device: str, dtype: str) -> tuple[dict, list[str]]:
    """The one-GPU checks on one shape: (summary entry, report lines); a failing check
    is one line, the others still run."""
    import torch

    out: dict = {}
    lines = ["", "## One-GPU checks", ""]
    try:
        amp = amp_check(mcfg, mbs)
        out["amp"] = amp
        lines.append(f"- bf16 autocast step vs fp32: losses {amp['bf16']} vs {amp['fp32']}, "
                     f"relative error {amp['rel_error']:.2e} (tolerance {amp['tolerance']:g}), "
                     f"master weights {amp['bf16_param_dtypes']}: "
                     f"{'ok' if amp['ok'] else 'OUT OF TOLERANCE'}")
    except Exception as e:  # noqa: BLE001 - reported in one line, the others go on
        out["amp"] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        lines.append(f"- bf16 autocast step: FAILED ({out['amp']['error']})")
    try:
        out["memory"] = memory_check(mcfg, mbs, device, dtype)
        for r in out["memory"]:
            lines.append(f"- block activations, recompute {r['recompute']}: measured "
                         f"{r['measured_bytes'] / 2**20:.2f} MiB, model ({r['profile']}) "
                         f"{r['model_bytes'] / 2**20:.2f} MiB ({r['rel_error'] * 100:+.1f} %), "
                         f"fwd+bwd peak {r['peak_fwd_bwd_bytes'] / 2**20:.2f} MiB")
    except Exception as e:  # noqa: BLE001
        out["memory"] = [{"error": f"{type(e).__name__}: {e}".splitlines()[0]}]
        lines.append(f"- block activation memory: FAILED ({out['memory'][0]['error']})")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    out["multi_rank_nccl"] = (f"not run: a multi-rank NCCL run needs 2+ GPUs; this machine "
                              f"has {gpus}" if gpus < 2 else
                              "not run: this script validates one GPU; use torchrun with "
                              "merak-exec train for a multi-rank NCCL run")
    lines.append(f"- multi-rank NCCL: {out['multi_rank_nccl']}")
    for ln in lines[3:]:
        print(ln[2:], flush=True)
    return out, lines


def main(argv: list[str] | None = None) -> int:
    """Measure, validate, write the report; 0 when every shape was measured."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "traces" / "h200"))
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="stop starting new shapes past this (the checks after them take "
                         "seconds)")
    ap.add_argument("--archive", default=None,
                    help="also pack the results into this .tar.gz (for the device's "
                         "8-file limit on what comes back)")
    ap.add_argument("--dry-run", action="store_true",
                    help="the same code paths on CPU with tiny shapes (gloo, fp32)")
    a = ap.parse_args(argv)
    if a.budget_s <= 0:
        print(f"h200_validation: --budget-s must be positive, got {a.budget_s:g}",
              file=sys.stderr)
        return 2
    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print("h200_validation: no CUDA device; use --dry-run for a CPU rehearsal",
              file=sys.stderr)
        return 2
    shapes = SMOKE if a.dry_run else SHAPES
    dtype, backend = ("fp32", "gloo") if a.dry_run else ("bf16", "nccl")
    device = "cpu" if a.dry_run else "cuda"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    reports, spent, missing = [], [], []
    for name, mcfg, mbs, M in shapes:
        used = time.monotonic() - t0
        if spent and used + 1.5 * max(spent) > a.budget_s:
            print(f"skipping {name}: budget ({used:.0f} s used)", flush=True)
            missing.append((name, f"skipped: the budget of {a.budget_s:g} s"))
            continue
        t = time.monotonic()
        case = Case(name, dict(micro_batch_size=mbs, global_batch_size=mbs * M, dtype=dtype,
                               schedule="1f1b"), mcfg)
        try:
            (d,) = measure_cases([case], out, world=1, backend=backend, steps=5,
                                 warmup_steps=2, repeats=5, warmup=2,
                                 timeout_s=max(60.0, a.budget_s - used))
            _layer_trace(mcfg, mbs, out / f"gpt-{name}.json", device, dtype)
            rep = compare_run(d)
            rep.plot(out / f"{name}.png")
        except Exception as e:  # noqa: BLE001 - one shape's failure must not lose the others
            first = (str(e).strip().splitlines() or [""])[-1]
            print(f"{name}: FAILED ({type(e).__name__}: {first})", flush=True)
            missing.append((name, f"failed: {type(e).__name__}: {first}"))
            spent.append(time.monotonic() - t)
            continue
        reports.append(rep)
        spent.append(time.monotonic() - t)
        s = rep.summary()
        print(f"{name}: measured {s['measured_ms']:.2f} ms, predicted {s['predicted_ms']:.2f} ms, "
              f"error {s['error'] * 100:+.1f} %, actions {s['action_median_abs_error'] * 100:.1f} %"
              f", activation {s['activation_max_abs_error'] * 100:.1f} %", flush=True)
    checks, check_lines = _gpu_checks(shapes[0][1], shapes[0][2], device, dtype)
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not a.dry_run else "cpu"
    lines = [f"# GPU validation ({dev})", "",
             f"Command: `python benchmarks/h200_validation.py {' '.join(argv or sys.argv[1:])}`"
             f" ({time.monotonic() - t0:.0f} s, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}).",
             "", "| shape | measured ms | predicted ms | error | action median abs error | "
             "activation worst error |", "|---|---|---|---|---|---|"]
    for r in reports:
        s = r.summary()
        lines.append(f"| {s['run']} | {s['measured_ms']:.2f} | {s['predicted_ms']:.2f} | "
                     f"{s['error'] * 100:+.1f} % | {s['action_median_abs_error'] * 100:.1f} % | "
                     f"{s['activation_max_abs_error'] * 100:.1f} % |")
    for name, why in missing:
        lines.append(f"| {name} | - | - | {why} | - | - |")
    lines += check_lines
    lines.append("")
    lines += [r.to_markdown() for r in reports]
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "summary.json", json.dumps(
        {"shapes": [r.summary() for r in reports],
         "missing": [{"shape": n, "why": w} for n, w in missing], "checks": checks},
        indent=1))
    if a.archive:
        _archive(out, Path(a.archive))
    return 0 if reports and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
