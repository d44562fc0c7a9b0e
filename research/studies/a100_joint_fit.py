"""An experiment: the A100 fits with one shared GEMM curve, against the separate fits.

    .venv/bin/python -m research.studies.a100_joint_fit             # the full joint fit
    .venv/bin/python -m research.studies.a100_joint_fit --rounds 3  # capped at 3 rounds
    .venv/bin/python -m research.studies.a100_joint_fit --fix gemm_dim_half=27.8 --out X.md
                                     # a diagnostic: one shared parameter held fixed

Fits gemm_max, gemm_dim_half and gemm_flops_half jointly to vTrain's 1,440 single-node
Megatron rows and llm-foundry's 36 A100 rows of MPT-1b / 7b, each stack keeping its
own other parameters (research/a100_joint.py: loss, start, stopping
rule). Prints and writes research/results/a100_joint_fit.md: the fitted values of the
separate fits (the committed constants) and of the joint fit side by side; the fit-row
MAPE and mean signed error of both fit sets; the pre-declared adoption criterion and
whether it holds; then, computed only after the fit and never used in it, the held-out
figures: vTrain's multi-node rows (MAPE, mean signed, MAPE per tp), llm-foundry's A100
rows of MPT-3b / 13b / 30b / 70b and torchtitan's A100 rows (as benchmarks/fidelity.py
predicts them). Changes no committed constant.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from merak_sim.costs.calibrated import CALIBRATED
from merak_sim.costs.calibrated_hopper import A100_PROFILES, a100_cost_model
from merak_sim.costs.efficiency import Efficiency
from research import a100_joint as aj
from merak_sim.validation.fidelity import public_run_outcomes
from research.hopper_fit import FIT_SPLIT, fit_rows
from merak_sim.validation.public_runs import load_rows
from research.vtrain import SEARCH, PreparedRow, load_vtrain, predict_row
from merak_sim.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
NAME = "a100_joint_fit"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{NAME}: error: {message}; see --help", file=sys.stderr)
        raise SystemExit(2)


def _rounds(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return v


#: GEMM shapes (m x n x k) where the curves are compared: the first MLP GEMM (m = micro-
#: batch x sequence, n = 4 h / tp, k = h) of a small vTrain single-node row, of a larger
#: one, of a held-out multi-node row and of llm-foundry's MPT-7b.
SHAPES = (("vTrain single h1024 tp1 mbs2 s1024", (2048, 4096, 1024)),
          ("vTrain single h2048 tp4 mbs2 s1024", (2048, 2048, 2048)),
          ("vTrain multi h12288 tp8 mbs1 s2048", (2048, 6144, 12288)),
          ("MPT-7b h4096 tp1 mbs4 s2048", (8192, 16384, 4096)))


def _fix(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    bounds = aj.shared_bounds()
    if name not in bounds:
        raise argparse.ArgumentTypeError(
            f"{text!r}: name one of {', '.join(aj.SHARED)} as NAME=VALUE")
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    lo, hi = bounds[name]
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: the value must be a number in "
                                         f"[{lo:g}, {hi:g}]")
    return name, v


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _stats_line(label: str, sep: tuple[float, float], joint: tuple[float, float]) -> str:
    return (f"| {label} | {sep[0]:.2f} | {sep[1]:+.2f} | {joint[0]:.2f} | {joint[1]:+.2f} "
            f"| {joint[0] - sep[0]:+.2f} |")


def _public(paths: dict[str, Path], values: dict[str, float]) -> dict[str, tuple]:
    """The A100 outcomes of llm-foundry and torchtitan under an ``a100-pytorch`` point,
    by (source, role) -> (predicted, measured) lists (fidelity's pricing)."""
    cm = a100_cost_model(aj.PYTORCH_PROFILE, values)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for src, path in paths.items():
        done, _ = public_run_outcomes(path, cost_model=cm)
        for o in done:
            if o.groups["gpu"].startswith("A100"):
                p, m = out.setdefault(f"{src} {o.role}", ([], []))
                p.append(o.predicted_s)
                m.append(o.measured_s)
    return out


def _vtrain_multi(rows, eff: Efficiency) -> dict[str, tuple[float, float]]:
    """MAPE / mean signed of the multi-node rows, all and per tp."""
    pred = [predict_row(r, eff) for r in rows]
    meas = [r.time_ms / 1e3 for r in rows]
    out = {"all": aj.error_stats(pred, meas)}
    for tp in sorted({r.tp for r in rows}):
        idx = [i for i, r in enumerate(rows) if r.tp == tp]
        out[f"tp={tp} ({len(idx)} rows)"] = aj.error_stats([pred[i] for i in idx],
                                                          [meas[i] for i in idx])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; returns the exit status."""
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data",
                    help="folder with vtrain/ and public-runs/")
    ap.add_argument("--rounds", type=_rounds, default=int(SEARCH["rounds"]),
                    help=f"cap on the search's rounds (default {int(SEARCH['rounds'])}, "
                         "vTrain's stopping rule)")
    ap.add_argument("--fix", type=_fix, action="append", default=[], metavar="NAME=VALUE",
                    help="hold a shared parameter at VALUE (a diagnostic of how well the "
                         "fit sets pin it; repeatable)")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "research" / "results" / f"{NAME}.md",
                    help="markdown file written")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    need = [args.data / "vtrain" / "ground_truth_single.csv",
            args.data / "vtrain" / "ground_truth_multi.csv",
            args.data / "public-runs" / "llmfoundry.csv",
            args.data / "public-runs" / "torchtitan.csv"]
    for p in need:
        if not p.is_file():
            print(f"{NAME}: error: {p} not found; pass --data, the folder holding "
                  "vtrain/ and public-runs/", file=sys.stderr)
            return 2
    if args.out.is_dir():
        print(f"{NAME}: error: --out {args.out} is a folder; pass the markdown file to "
              "write", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    say: Callable[[str], None] = lambda s: print(s, flush=True)  # noqa: E731
    single, multi = load_vtrain(need[0]), load_vtrain(need[1])
    srcs = {"llm-foundry": need[2], "torchtitan": need[3]}
    data = {f"public-runs/{p.stem}": load_rows(p)
            for p in sorted((args.data / "public-runs").glob("*.csv"))}
    pt_rows = fit_rows(data, aj.PYTORCH_PROFILE)
    vt, pt = aj.vtrain_stack(single), aj.pytorch_stack(pt_rows)
    fixed = dict(args.fix)
    start = {**aj.declared_start(), **fixed}
    bounds = {**aj.shared_bounds(), **{n: (v, v) for n, v in fixed.items()}}

    # One loss evaluation of each set, timed, before the fit.
    x0 = {**start, **vt.start}
    t = time.perf_counter()
    vt.loss(x0)
    t_vt = time.perf_counter() - t
    t = time.perf_counter()
    pt.loss({**start, **pt.start})
    t_pt = time.perf_counter() - t
    n_params = len(start) + len(vt.own) + len(pt.own)
    per_round = 2 * (len(start) + len(vt.own)) + 1
    say(f"one loss evaluation: vTrain {len(single)} rows {t_vt:.2f} s, llm-foundry "
        f"{len(pt_rows)} rows {t_pt:.2f} s; {n_params} parameters; a round reprices vTrain "
        f"at most {per_round} times (about {per_round * t_vt:.0f} s)")

    search = {k: SEARCH[k] for k in ("step", "tol", "min_step", "pattern")}
    t_fit = time.perf_counter()
    res = aj.joint_search([vt, pt], start, bounds, rounds=args.rounds,
                          log=lambda s: say(f"{s} ({time.perf_counter() - t_fit:.0f} s)"),
                          **search)
    fit_s = time.perf_counter() - t_fit
    say(f"joint fit: {res.search.stop_reason}, {fit_s:.0f} s, loss evaluations: "
        f"vTrain {res.evaluations['vtrain']}, llm-foundry {res.evaluations['pytorch']}")

    # Control, not in the criterion: a100-pytorch alone under the joint fit's start and
    # stopping rule (the vTrain fit is already a fixed point of that protocol), to tell
    # the sharing's effect from the protocol's.
    t = time.perf_counter()
    alone = aj.joint_search([pt], start, bounds, rounds=args.rounds, **search)
    alone_s = time.perf_counter() - t
    pub_alone = _public(srcs, alone.values("pytorch"))
    lf_alone = aj.error_stats(*pub_alone["llm-foundry fit"])
    say(f"control: a100-pytorch alone, {alone.search.stop_reason}, {alone_s:.0f} s")

    sep_eff = Efficiency(**{**Efficiency().to_dict(), **CALIBRATED["A100"]})
    sep_pt = dict(A100_PROFILES[aj.PYTORCH_PROFILE])
    joint_eff, joint_pt = aj.vtrain_efficiency(res), aj.pytorch_params(res).values
    sep_pt_eff = Efficiency().with_(**{x: sep_pt[x] for x in aj.SHARED})

    prepared = [PreparedRow.of(r) for r in single]
    meas = [r.time_ms / 1e3 for r in single]
    vt_sep = aj.error_stats([p.predict(sep_eff) for p in prepared], meas)
    vt_joint = aj.error_stats([p.predict(joint_eff) for p in prepared], meas)
    pub_sep, pub_joint = _public(srcs, sep_pt), _public(srcs, joint_pt)
    lf_sep = aj.error_stats(*pub_sep["llm-foundry fit"])
    lf_joint = aj.error_stats(*pub_joint["llm-foundry fit"])
    holds = aj.adoption_holds({"vtrain": vt_sep[0], "llm-foundry": lf_sep[0]},
                              {"vtrain": vt_joint[0], "llm-foundry": lf_joint[0]})

    # Held-out figures: computed after the fit, never seen by it.
    t = time.perf_counter()
    multi_sep, multi_joint = _vtrain_multi(multi, sep_eff), _vtrain_multi(multi, joint_eff)
    held_s = time.perf_counter() - t

    names = list(dict.fromkeys([*aj.SHARED, *aj.VTRAIN_OWN, *aj.PYTORCH_OWN]))
    doc = [
        "# A100: separate fits against one joint fit with a shared GEMM curve",
        "",
        f"Command: `.venv/bin/python -m research.studies.a100_joint_fit"
        f"{'' if args.rounds == int(SEARCH['rounds']) else f' --rounds {args.rounds}'}"
        + "".join(f" --fix {n}={v:g}" for n, v in fixed.items()) + "` "
        f"({time.strftime('%Y-%m-%d')}, {time.perf_counter() - t0:.0f} s: fit {fit_s:.0f} s, "
        f"held-out vTrain rows {held_s:.1f} s). An experiment "
        "(research/a100_joint.py); "
        "the committed constants are unchanged.",
        "",
        f"Fit sets: vTrain's {len(single)} single-node Megatron rows and llm-foundry's "
        f"{len(pt_rows)} A100 rows of MPT-1b / 7b ({FIT_SPLIT}). Shared: "
        f"{', '.join(aj.SHARED)} within {bounds} (the intersection of both fits' bounds, "
        "identical in both today). Loss: the mean of the two sets' mean |log error|, each "
        "set weighted equally. Start: the declared starts (vTrain's START; the PyTorch "
        "parameters at their published A100 defaults, clipped into bounds), never an "
        f"earlier fit. Search: vTrain's stopping rule {dict(SEARCH)}, round cap "
        f"{args.rounds}"
        + ("" if not fixed else "; held fixed: " + ", ".join(f"{n} = {v:g}"
                                                             for n, v in fixed.items()))
        + f": {res.search.stop_reason}; joint loss {res.search.loss:.5f} "
        f"(vTrain {res.losses['vtrain']:.5f}, llm-foundry {res.losses['pytorch']:.5f}). "
        f"One loss evaluation: vTrain {t_vt:.2f} s, llm-foundry {t_pt:.2f} s; evaluations "
        f"made: vTrain {res.evaluations['vtrain']}, llm-foundry "
        f"{res.evaluations['pytorch']}.",
        "",
        "## Fitted values",
        "",
        "| parameter | separate vTrain | separate a100-pytorch | joint vTrain | "
        "joint a100-pytorch |",
        "|---|---|---|---|---|",
        *[f"| {n}{' (shared)' if n in aj.SHARED else ''} | "
          f"{_fmt(CALIBRATED['A100'].get(n)) if n in (*aj.SHARED, *aj.VTRAIN_OWN) else '-'} | "
          f"{_fmt(sep_pt.get(n))} | "
          f"{_fmt(getattr(joint_eff, n)) if n in (*aj.SHARED, *aj.VTRAIN_OWN) else '-'} | "
          f"{_fmt(joint_pt.get(n))} |" for n in names],
        "",
        "GEMM efficiency (fraction of peak, Efficiency.gemm) at some shapes: separate "
        "vTrain / separate a100-pytorch / joint: "
        + "; ".join(f"{lab} {m}x{n}x{k}: {sep_eff.gemm(m, n, k):.3f} / "
                    f"{sep_pt_eff.gemm(m, n, k):.3f} / "
                    f"{joint_eff.gemm(m, n, k):.3f}" for lab, (m, n, k) in SHAPES) + ".",
        "",
        "## Fit rows (what the criterion judges)",
        "",
        "| rows | separate MAPE % | separate mean signed % | joint MAPE % | "
        "joint mean signed % | MAPE change (points) |",
        "|---|---|---|---|---|---|",
        _stats_line(f"vTrain single-node ({len(single)})", vt_sep, vt_joint),
        _stats_line(f"llm-foundry A100 MPT-1b / 7b ({len(pub_sep['llm-foundry fit'][0])})",
                    lf_sep, lf_joint),
        "",
        f"Adoption criterion (declared before any result): {aj.ADOPTION}. "
        f"Holds: {'yes' if holds else 'no'} (vTrain {vt_joint[0] - vt_sep[0]:+.2f} points, "
        f"llm-foundry {lf_joint[0] - lf_sep[0]:+.2f} points). Reported, not adopted.",
        "",
        "Control, not part of the criterion: a100-pytorch refitted alone under the "
        f"joint fit's start and stopping rule ({alone.search.stop_reason}, {alone_s:.0f} s) "
        f"reaches llm-foundry fit-row MAPE {lf_alone[0]:.2f} % (mean signed "
        f"{lf_alone[1]:+.2f} %; the committed fit {lf_sep[0]:.2f} %), with "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in alone.values("pytorch").items())
        + "; the vTrain fit is already a fixed point of that protocol (the committed "
        "constants). Held out under it: "
        + ", ".join(f"{k} MAPE {aj.error_stats(*v)[0]:.2f} %" for k, v in pub_alone.items()
                    if k.endswith("held out")) + ".",
        "",
        "## Held-out rows (after the fit; never used in it or in the criterion)",
        "",
        "| rows | separate MAPE % | separate mean signed % | joint MAPE % | "
        "joint mean signed % | MAPE change (points) |",
        "|---|---|---|---|---|---|",
        *[_stats_line(f"vTrain multi-node {k}" if k != "all" else
                      f"vTrain multi-node, all ({len(multi)})", multi_sep[k], multi_joint[k])
          for k in multi_sep],
        *[_stats_line(f"{k.replace(' held out', '')} A100 held out "
                      f"({len(pub_sep[k][0])})"
                      + (" (MPT-3b / 13b / 30b / 70b)" if k.startswith("llm") else ""),
                      aj.error_stats(*pub_sep[k]), aj.error_stats(*pub_joint[k]))
          for k in pub_sep if k.endswith("held out")],
        "",
    ]
    text = "\n".join(doc)
    print(text)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, text)
    except OSError as e:
        print(f"{NAME}: error: cannot write {args.out} ({e.strerror}); pass a writable --out",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
