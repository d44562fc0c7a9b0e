"""Which vTrain runs contradict their sibling runs, and how much of the error they carry.

    .venv/bin/python -m research.studies.vtrain_consistency

The criterion (research/vtrain_consistency.py): any model whose
iteration is a fixed-order pipeline schedule of per-GPU work and blocking
communication plus a per-iteration cost bounds each run's time by its siblings'
(same model and global batch: other micro-batch sizes of one configuration; more
split configurations at the same micro-batch). A run slower than a sibling allows by
more than the tolerance is flagged. This is a diagnostic: the validation targets
still count every row. Stage balance, the per-sample efficiency ratios of E1 and the
per-iteration cost come from the committed A100 constants (costs.calibrated); the
predictions are the exact evaluator's, as in research/studies/vtrain_validation.py.
Prints the flagged held-out rows, the error figures on flagged and passing rows and
against the consistent floor (the measured times lowered until no bound is broken),
the same check on the single-node fit rows, and how the count moves with the
allowances; then, on the fit rows, the residual per pipeline step and the fit with a
cost added per step (per-instruction host work), a layer's GEMM rate under the
fitted curve at the fit and held-out shapes (the two hypotheses of
merak_sim/experiments/vtrain_engine.py), and the fit rows as lines in the layer count
(per-layer against per-run part, measured and predicted) with the held-out error their
measured per-layer part would give (research/vtrain_layers.py); writes
research/results/vtrain_consistency.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from merak_sim.costs.calibrated import CALIBRATED
from merak_sim.costs.efficiency import Efficiency
from research.vtrain import PreparedRow, VTrainRow, load_vtrain
from research.vtrain_consistency import (
    KINDS,
    Limits,
    RowShape,
    bounds,
    consistent_floor,
    flagged,
    layer_gemm_flops,
    model_as_data,
    needed_slack,
    per_step_fit,
    row_shape,
    with_step_cost,
)
from research.vtrain_layers import (
    layer_splits,
    predict_scaled,
    slope_ratio_by_tp,
)
from merak_sim.hardware import get_cluster
from merak_sim.io import atomic_write_text
from merak_sim.memory import peak_memory
from merak_sim.sim.evaluator import evaluate
from merak_sim.sim.program import compile_program

ROOT = Path(__file__).resolve().parents[2]


def _default_data() -> Path:
    env = os.environ.get("MERAK_VTRAIN_DIR")
    return Path(env) if env else ROOT / "data" / "vtrain"


def fitted_efficiency() -> Efficiency:
    """The committed A100 fit (:data:`merak_sim.costs.calibrated.CALIBRATED`) over the
    published defaults: the curve every figure here is computed under."""
    return Efficiency(**{**Efficiency().to_dict(), **CALIBRATED["A100"]})


def priced(rows: Sequence[VTrainRow], eff: Efficiency, memory: bool = False,
           prepared: Sequence[PreparedRow] | None = None
           ) -> tuple[list[RowShape], list[float], list[float]]:
    """Per row: its shape, the evaluator's relative error and (``memory``) the modelled
    peak GB of its fullest GPU (allocator pressure is a suspect where a bound breaks);
    ``prepared``: the rows already prepared, in the same order."""
    shapes, errs, peaks = [], [], []
    for i, r in enumerate(rows):
        p = prepared[i] if prepared is not None else PreparedRow.of(r)
        table = p.cost_table(eff)
        shapes.append(row_shape(table, p.recompute))
        pred = evaluate(compile_program(p.schedule, table, p.recompute)).makespan
        errs.append(pred * 1e3 / r.time_ms - 1.0)
        if memory:
            peaks.append(max(m.total_bytes for m in peak_memory(table, p.config, p.schedule))
                         / 1e9)
    return shapes, errs, peaks


def _label(r: VTrainRow) -> str:
    return (f"{r.params_b or 0:g}B tp{r.tp} dp{r.dp} pp{r.pp} mbs{r.micro_batch}"
            f" gb{r.global_batch}")


def _stats(errs: Sequence[float]) -> str:
    if not errs:
        return "no rows"
    n = len(errs)
    return (f"{n:3d} rows  MAPE {100 * sum(abs(e) for e in errs) / n:6.2f} %  "
            f"signed {100 * sum(errs) / n:+6.2f} %")


def _duplicates(rows: Sequence[VTrainRow]) -> list[str]:
    seen: dict[str, list[float]] = {}
    for r in rows:
        seen.setdefault(_label(r), []).append(r.time_ms)
    return [f"repeated run: {k} measured {', '.join(f'{t:g}' for t in v)} ms "
            f"(spread {100 * (max(v) / min(v) - 1):.3f} %)"
            for k, v in seen.items() if len(v) > 1]


def _report(name: str, rows: Sequence[VTrainRow], shapes: Sequence[RowShape],
            errs: Sequence[float], limits: Limits, peaks: Sequence[float]) -> list[str]:
    bds = bounds(rows, shapes, limits)
    bad = flagged(bds, limits.tol)
    out = [f"## {name}", ""]
    for kind in KINDS:
        ks = [b for b in bds if b.kind == kind]
        nv = sum(b.excess > limits.tol for b in ks)
        out.append(f"- {kind}: {len(ks)} bounds, {nv} exceeded by more than "
                   f"{100 * limits.tol:g} %")
    out.append(f"- rows flagged: {len(bad)} of {len(rows)}")
    out.append("- the cost model's own predictions taken as data, no slack, C at the "
               "model's, no tolerance: largest excess over a bound "
               f"{100 * model_as_data(rows, shapes, errs):+.3f} %")
    out.append("")
    if peaks and bad:
        out += ["| row | measured ms | model err % | bound | sibling | sibling ms | "
                "factor | limit ms | excess % | model per-sample ratio | model peak GB |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, b in sorted(bad.items(), key=lambda kv: -kv[1].excess):
            o = rows[b.other]
            out.append(f"| {_label(rows[i])} | {rows[i].time_ms:g} | {100 * errs[i]:+.2f} | "
                       f"{b.kind} | {_label(o)} | {o.time_ms:g} | {b.factor:.4f} | "
                       f"{1e3 * b.limit_s:.0f} | {100 * b.excess:+.2f} | "
                       f"{b.model_ratio:.4f} | {peaks[i]:.1f} |")
        out.append("")
    ok = [e for i, e in enumerate(errs) if i not in bad]
    fl = [e for i, e in enumerate(errs) if i in bad]
    tot_abs = sum(abs(e) for e in errs)
    tot = sum(errs)
    out += ["```",
            f"all rows      {_stats(errs)}",
            f"passing rows  {_stats(ok)}",
            f"flagged rows  {_stats(fl)}",
            f"flagged rows carry {100 * sum(abs(e) for e in fl) / tot_abs:.1f} % of the summed "
            f"|error| and {100 * sum(fl) / tot:.1f} % of the summed signed error"
            if errs and tot else "no error to share"]
    # Diagnostic only: each flagged row's measured time replaced by the largest time
    # its siblings allow (its tightest bound), the prediction unchanged.
    capped = [e if i not in bad else
              (1 + e) * rows[i].time_ms / (1e3 * bad[i].limit_s) - 1
              for i, e in enumerate(errs)]
    out.append(f"flagged rows at their siblings' limit (diagnostic)  {_stats(capped)}")
    # The iterated caps: a set of times no bound contradicts, none above the measured.
    floor, passes = consistent_floor(rows, bds, limits.tol)
    dist = [f * 1e3 / r.time_ms - 1 for f, r in zip(floor, rows, strict=True)]
    vs_floor = [(1 + e) * r.time_ms / (1e3 * f) - 1
                for e, f, r in zip(errs, floor, rows, strict=True)]
    out.append(f"consistent floor ({passes} passes) against the measured  {_stats(dist)}")
    out.append(f"predictions against the consistent floor  {_stats(vs_floor)}")
    for tp in sorted({r.tp for r in rows}):
        g = [i for i, r in enumerate(rows) if r.tp == tp]
        out.append(f"tp={tp:<2d} all {_stats([errs[i] for i in g])} | passing "
                   f"{_stats([errs[i] for i in g if i not in bad])} | flagged "
                   f"{sum(i in bad for i in g)} | floor vs measured "
                   f"{_stats([dist[i] for i in g])}")
    out += ["```", ""]
    return out


def _sensitivity(rows: Sequence[VTrainRow], shapes: Sequence[RowShape],
                 errs: Sequence[float], base: Limits, fit_slack: float | None) -> list[str]:
    out = ["## How the flagged set moves with the allowances (held-out rows)", "",
           "| slack (E1) | c_slack (E3) | tol | flagged | passing MAPE % | passing signed % "
           "| note |", "|---|---|---|---|---|---|---|"]
    cases = [(1, 1, 0.0, "the model's own ratios, no tolerance"), (1, 3, 0.01, ""),
             (base.slack, base.c_slack, base.tol, "this run's allowances"),
             (10, 3, 0.01, ""), (3, 10, 0.01, ""), (3, 3, 0.03, ""), (10, 10, 0.05, "")]
    if fit_slack:
        cases.insert(2, (fit_slack, base.c_slack, base.tol, "the slack the fit rows need"))
    for slack, c_slack, tol, note in cases:
        lim = Limits(slack=slack, c_slack=c_slack, c_add_s=base.c_add_s, tol=tol)
        bad = flagged(bounds(rows, shapes, lim), tol)
        ok = [e for i, e in enumerate(errs) if i not in bad]
        out.append(f"| {slack:g} | {c_slack:g} | {100 * tol:g} % | {len(bad)} | "
                   f"{100 * sum(abs(e) for e in ok) / len(ok):.2f} | "
                   f"{100 * sum(ok) / len(ok):+.2f} | {note} |")
    return out + [""]


def _per_step(rows: Sequence[VTrainRow], errs: Sequence[float]) -> list[str]:
    """The fit rows' residual per pipeline step, and the fit with a cost added per step
    (the per-instruction host-work hypothesis, merak_sim/experiments/vtrain_engine.py)."""
    out = ["## Fit rows: residual per pipeline step (per-instruction host work?)", "",
           "| tp | pp | rows | residual per step ms | intercept ms | R^2 |",
           "|---|---|---|---|---|---|"]
    for (tp, pp), f in sorted(per_step_fit(rows, errs).items()):
        out.append(f"| {tp} | {pp} | {f.rows} | {1e3 * f.per_step_s:+.2f} | "
                   f"{1e3 * f.intercept_s:+.1f} | {f.r2:.2f} |")
    out += ["", "| added per step | rows | MAPE % | tp=1 | tp=2 | tp=4 | tp=8 |",
            "|---|---|---|---|---|---|---|"]

    def mape(es: Sequence[float], tp: int | None = None) -> str:
        sel = [abs(e) for r, e in zip(rows, es, strict=True) if tp is None or r.tp == tp]
        return f"{100 * sum(sel) / len(sel):.2f}" if sel else "-"

    for ms, only in ((0.0, True), (0.25, True), (0.5, True), (1.0, True), (1.5, True),
                     (0.14, False)):
        es = with_step_cost(rows, errs, ms / 1e3, pipelined_only=only)
        out.append(f"| {ms:g} ms | {'pp > 1' if only else 'all'} | {mape(es)} | "
                   + " | ".join(mape(es, t) for t in (1, 2, 4, 8)) + " |")
    return out + [""]


def _gemm_table(eff: Efficiency, fit: Sequence[VTrainRow], fit_errs: Sequence[float],
                held: Sequence[VTrainRow]) -> list[str]:
    """TFLOP/s of a layer's GEMMs at each distinct shape of the fit and held-out rows
    (the GEMM-size hypothesis, merak_sim/experiments/vtrain_engine.py)."""
    peak = get_cluster("vtrain-a100").gpu.peak_flops["fp16"]
    out = ["## A layer's GEMMs under the fitted curve, fit vs held-out shapes", "",
           "| rows | hidden | seq | tp | micro-batch | TFLOP/s | of peak | fit rows there: "
           "mean signed error % |", "|---|---|---|---|---|---|---|---|"]

    def row(name: str, h: int, sq: int, tp: int, b: int) -> str:
        f = layer_gemm_flops(eff, hidden=h, seq=sq, micro_batch=b, tp=tp, peak_flops=peak)
        es = [e for r, e in zip(fit, fit_errs, strict=True)
              if (r.hidden, r.seq_len, r.tp, r.micro_batch) == (h, sq, tp, b)]
        signed = f"{100 * sum(es) / len(es):+.2f} ({len(es)} rows)" if es else "-"
        return (f"| {name} | {h} | {sq} | {tp} | {b} | {f / 1e12:.0f} | {f / peak:.3f} | "
                f"{signed} |")

    # The fit rows' largest shapes per hidden size (tp = 1), then every held-out model and tp at
    # micro-batch 2 (the size most of them ran).
    for h in sorted({r.hidden for r in fit}):
        sq = max(r.seq_len for r in fit if r.hidden == h)
        for b in sorted({r.micro_batch for r in fit if r.hidden == h})[-2:]:
            out.append(row("fit, largest", h, sq, 1, b))
    for h, sq, tp in sorted({(r.hidden, r.seq_len, r.tp) for r in held}):
        out.append(row("held out", h, sq, tp, 2))
    return out + [""]


def _layers(eff: Efficiency, fit: Sequence[VTrainRow], fit_errs: Sequence[float],
            held: Sequence[PreparedRow], held_errs: Sequence[float]) -> list[str]:
    """The fit rows' per-layer and per-run parts, measured against predicted, and what
    the measured per-layer part would do to the held-out rows
    (research/vtrain_layers.py)."""
    meas = [r.time_ms / 1e3 for r in fit]
    pred = [(1 + e) * t for e, t in zip(fit_errs, meas, strict=True)]
    splits = layer_splits(fit, meas, pred)
    lines = [sp.measured for sp in splits]
    res = sorted(ln.max_residual for ln in lines)
    out = ["## Fit rows: per-layer and per-run parts (lines in the layer count)", "",
           f"- {len(lines)} groups of rows equal but for the layer count "
           f"({', '.join(str(n) for n in sorted({n for ln in lines for n in ln.layers}))}"
           " layers); largest deviation of a measured time from its group's line: median "
           f"{100 * statistics.median(res):.4f} %, 90th percentile "
           f"{100 * res[int(0.9 * (len(res) - 1))]:.4f} %, worst {100 * res[-1]:.2f} %",
           f"- groups whose successive differences T(L + 4) - T(L) agree within 1 us: "
           f"{sum(ln.equal_steps for ln in lines)} of {len(lines)}", "",
           "| hidden | tp | groups | measured per-layer ms (median) | predicted / measured "
           "per-layer: median (min-max) | measured per-run ms (median) | predicted per-run "
           "ms (median) |", "|---|---|---|---|---|---|---|"]
    by: dict[tuple[int, int], list] = {}
    for sp in splits:
        by.setdefault((sp.measured.key[0], sp.measured.key[3]), []).append(sp)
    for (h, tp), sps in sorted(by.items()):
        ratios = [x.slope_ratio for x in sps]
        out.append(f"| {h} | {tp} | {len(sps)} | "
                   f"{1e3 * statistics.median(x.measured.slope_s for x in sps):.2f} | "
                   f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
                   f"{1e3 * statistics.median(x.measured.intercept_s for x in sps):.1f} | "
                   f"{1e3 * statistics.median(x.predicted.intercept_s for x in sps):.1f} |")
    out += ["", "Held-out rows re-evaluated with each row's compute scaled by the fit rows' "
            "measured / predicted per-layer part of its tp (median over the groups named; "
            "tp=16 has no fit rows and keeps 1):", "",
            "| per-layer ratio from | tp=1 | tp=2 | tp=4 | tp=8 | held-out MAPE % | "
            "mean signed % |", "|---|---|---|---|---|---|---|"]
    out.append(f"| (as fitted) | 1 | 1 | 1 | 1 | {100 * _mean_abs(held_errs):.2f} | "
               f"{100 * sum(held_errs) / len(held_errs):+.2f} |")
    for name, hidden in (("hidden 2048 groups", 2048), ("all groups", None)):
        ratio = slope_ratio_by_tp(splits, hidden)
        es = [predict_scaled(p, eff, 1.0 / ratio.get(p.row.tp, 1.0)) * 1e3 / p.row.time_ms - 1
              for p in held]
        out.append(f"| {name} | " + " | ".join(f"{ratio.get(t, 1.0):.3f}" for t in (1, 2, 4, 8))
                   + f" | {100 * _mean_abs(es):.2f} | {100 * sum(es) / len(es):+.2f} |")
    return out + [""]


def _mean_abs(es: Sequence[float]) -> float:
    return sum(abs(e) for e in es) / len(es)


def _at_least(low: float, why: str = ""):
    """An argparse type: a finite number >= ``low`` (``why`` says what ``low`` means)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= low):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= {low:g}"
                                             + why)
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"vtrain_consistency: error: {message}; see --help", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=_default_data(),
                    help="folder with ground_truth_single.csv and ground_truth_multi.csv")
    ap.add_argument("--out", type=Path, default=ROOT / "research" / "results",
                    help="folder for vtrain_consistency.md")
    ap.add_argument("--slack", type=_at_least(1.0, " (1: the model's own efficiency change)"),
                    default=Limits().slack,
                    help="multiplier on the model's per-sample efficiency change (>= 1)")
    ap.add_argument("--c-slack", type=_at_least(0.0), default=Limits().c_slack,
                    help="multiplier on the model's per-iteration cost")
    ap.add_argument("--tol", type=_at_least(0.0), default=Limits().tol,
                    help="excess over a bound that flags a row (fraction, 0.01 = 1 %%)")
    ap.add_argument("--no-single", action="store_true",
                    help="skip the single-node fit rows (faster)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.out.suffix == ".md" and not args.out.is_dir():
        print(f"vtrain_consistency: error: --out {args.out} looks like a file; pass the "
              "folder that vtrain_consistency.md goes into", file=sys.stderr)
        return 2
    paths = [args.data_dir / "ground_truth_multi.csv"]
    if not args.no_single:
        paths.append(args.data_dir / "ground_truth_single.csv")
    for p in paths:
        if not p.is_file():
            print(f"vtrain_consistency: error: {p} not found; pass --data-dir or set "
                  "MERAK_VTRAIN_DIR", file=sys.stderr)
            return 2
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"vtrain_consistency: error: cannot write to {args.out} ({e.strerror}); "
              "pass a writable --out folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    limits = Limits(slack=args.slack, c_slack=args.c_slack, tol=args.tol)
    eff = fitted_efficiency()
    try:
        multi = load_vtrain(paths[0])
        single = load_vtrain(paths[1]) if len(paths) > 1 else []
    except (KeyError, ValueError) as e:
        print(f"vtrain_consistency: error: unreadable vTrain CSV ({e}); pass the "
              "folder of vTrain's ground_truth_*.csv", file=sys.stderr)
        return 2
    held = [PreparedRow.of(r) for r in multi]
    shapes, errs, peaks = priced(multi, eff, memory=True, prepared=held)
    doc = ["# vTrain runs against their siblings", "",
           "Generated by `python -m research.studies.vtrain_consistency` (criterion: "
           "`research.vtrain_consistency`). Allowances: per-sample "
           f"efficiency change {limits.slack:g}x the model's, per-iteration cost "
           f"{limits.c_slack:g}x the model's + {1e3 * limits.c_add_s:g} ms, tolerance "
           f"{100 * limits.tol:g} %. Diagnostic only: the targets count every row.", ""]
    doc += [f"- {d}" for d in _duplicates(multi)] + [""]
    fit_slack = None
    fit_doc: list[str] = []
    if single:
        s_shapes, s_errs, _ = priced(single, eff)
        fit_doc = _report("Single-node fit rows (the same check)", single, s_shapes, s_errs,
                          limits, [])
        top = 10.0  # the largest slack searched
        fit_slack = needed_slack(single, s_shapes, limits, top=top)
        fit_doc.append("The fit rows need an E1 slack of at least "
                       + (f"{fit_slack:.2f}" if fit_slack else f"more than {top:g}")
                       + " to leave no row flagged (the other allowances as above).")
        fit_doc.append("")
        fit_doc += _per_step(single, s_errs)
        fit_doc += _gemm_table(eff, single, s_errs, multi)
        fit_doc += _layers(eff, single, s_errs, held, errs)
    doc += _report("Held-out multi-node rows", multi, shapes, errs, limits, peaks)
    doc += _sensitivity(multi, shapes, errs, limits, fit_slack)
    doc += fit_doc
    text = "\n".join(doc)
    print(text)
    try:
        atomic_write_text(args.out / "vtrain_consistency.md", text + "\n")
    except OSError as e:
        print(f"vtrain_consistency: error: cannot write to {args.out} ({e.strerror}); "
              "pass a writable --out folder", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'vtrain_consistency.md'} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

