"""Prediction versus measurement: simulate a measured run's configuration and compare.

:func:`compare_run` takes a measured run (:mod:`merak_sim.validation.rundir`) and the
stage profile measured on the same machine, simulates the same configuration with the
exact evaluator (:mod:`merak_sim.validation.pricing`: every figure a measured
parameter of the machine, none fitted to the run being validated), and reports
(:class:`~merak_sim.validation.report.AccuracyReport`):

- iteration-time error (the makespan of the measured action timeline, median over the
  timed iterations, against the simulated makespan; the wall time of the step, which
  also holds the loss reduction outside the schedule, is shown beside it);
- per-action error: every compute action (stage, IR token), measured duration (median
  over iterations and over the ranks of a stage) against the simulated one;
- per-rank compute, exposed-communication and bubble error (the measured side's
  conventions: :mod:`merak_sim.validation.measured`);
- memory error per stage (:mod:`merak_sim.validation.memory`);
- per block of timed iterations (when the run recorded blocks and the profile kept
  its samples): the block's median iteration against the prediction from the two
  profiler steps bracketing it. The spread of these errors is the measurement's
  noise (a shared machine's speed drifts); a bias common to every block is the
  model's or the profile's;
- a side-by-side Gantt chart, measured above, simulated below
  (:meth:`~merak_sim.validation.report.AccuracyReport.plot`).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pandas as pd

from merak_sim.validation.measured import cpu_shares, measured_breakdown, step_frame
from merak_sim.validation.memory import memory_table
from merak_sim.validation.pricing import simulate_run
from merak_sim.validation.profile import combine_profiles
from merak_sim.validation.report import COMPUTE_KINDS, AccuracyReport, relative_error
from merak_sim.validation.rundir import MeasuredRun, read_run

__all__ = ["compare_run", "block_errors"]


def block_errors(run: MeasuredRun, makespans: dict[int, float],
                 statistic: str = "mean") -> pd.DataFrame:
    """Per block of timed iterations: its median (``statistic`` "min": fastest)
    makespan against the prediction from the two profiler steps bracketing it (block
    b ran between profiler steps b and b+1; their times averaged, their fastest
    samples kept, as for the whole run). ``makespans``: ``{step: seconds}``. Returns a
    DataFrame (block, steps, measured_s, predicted_s, error); empty when the run did
    not record blocks or its profile kept no samples (older run directories, or a
    profile from elsewhere)."""
    cols = ["block", "steps", "measured_s", "predicted_s", "error"]
    samples = run.profile.get("samples") or []
    if not run.step_block or len(samples) < 2:
        return pd.DataFrame(columns=cols)
    rows = []
    for b in sorted(set(run.step_block)):
        ms = [makespans[k] for k, blk in enumerate(run.step_block)
              if blk == b and k in makespans]
        if not ms or b + 1 >= len(samples):
            continue
        pair = samples[b:b + 2]
        stages = [{**st, **combine_profiles([p["stages"][s] for p in pair])}
                  for s, st in enumerate(run.profile["stages"])]
        prof = {**run.profile, "stages": stages}
        pred = simulate_run(replace(run, profile=prof), refined=True,
                            statistic=statistic).iteration_time_s
        meas = min(ms) if statistic == "min" else statistics.median(ms)
        rows.append({"block": b, "steps": len(ms), "measured_s": meas, "predicted_s": pred,
                     "error": relative_error(pred, meas)})
    return pd.DataFrame(rows, columns=cols)


def _action_table(frames: list, sim, statistic: str) -> pd.DataFrame:
    """Per (stage, action, kind): the measured duration (``statistic`` over steps and
    the stage's ranks, from the effective start) and the simulated one (median, the
    post cost the simulation adds to an action taken off)."""
    allm = pd.concat(frames)
    allm = allm[allm["stream"] != "p2p"]
    allm = allm.assign(dur=allm["end_s"] - allm["eff_start_s"])
    meas = allm.groupby(["stage", "action", "kind"])["dur"].agg(statistic)
    sev = sim.events()
    sev = sev[sev["stream"] != "p2p"]
    extra = sim.meta.get("post_extra_s", {})
    sev = sev.assign(dur=[e - s - extra.get((st, a), 0.0) for s, e, st, a in zip(
        sev["start_s"], sev["end_s"], sev["stage"], sev["action"], strict=True)])
    pred = sev.groupby(["stage", "action", "kind"])["dur"].median()
    return pd.DataFrame({"measured_s": meas, "predicted_s": pred}).dropna().reset_index()


def _post_seconds(sim) -> dict[tuple[int, bool], float]:
    """The simulation's post costs per (stage, before a collective): the simulation
    adds each post's cost to the compute action after it, while a measured action
    starts after its posts, which fall between actions (the bubble there)."""
    sev = sim.events()
    sev = sev[sev["stream"] != "p2p"]
    kind_of = dict(zip(zip(sev["stage"], sev["action"]), sev["kind"], strict=True))
    posts: dict[tuple[int, bool], float] = {}
    for (st, a), v in sim.meta.get("post_extra_s", {}).items():
        key = (st, kind_of.get((st, a)) == "ALL_REDUCE")
        posts[key] = posts.get(key, 0.0) + v
    return posts


def _rank_table(per_step: list, sim) -> pd.DataFrame:
    """Per rank: measured (median over steps of the stage's ranks) and predicted
    compute, exposed communication and bubble, classified the measured way on both
    sides."""
    mb: dict[int, list[dict]] = {}
    for _, rows in per_step:
        for r in rows:
            mb.setdefault(r["stage"], []).append(r)
    posts = _post_seconds(sim)
    rk = []
    for r in sim.ranks:
        ms = mb.get(r.stage, [])
        comp_post, coll_post = posts.get((r.stage, False), 0.0), posts.get((r.stage, True), 0.0)
        rk.append({"rank": r.rank, "stage": r.stage,
                   "measured_compute_s": statistics.median(x["compute_s"] for x in ms),
                   "predicted_compute_s": r.compute_s + r.recompute_s - comp_post,
                   "measured_comm_s": statistics.median(x["exposed_comm_s"] for x in ms),
                   "predicted_comm_s": r.exposed_comm_s - coll_post,
                   "measured_bubble_s": statistics.median(x["bubble_s"] for x in ms),
                   "predicted_bubble_s": r.bubble_s + comp_post + coll_post})
    return pd.DataFrame(rk)


def compare_run(run: MeasuredRun | str | Path, profile: str | Path | None = None,
             statistic: str = "mean") -> AccuracyReport:
    """Compare a measured run with its simulation (module docstring). ``statistic``:
    "mean" (the report's figures: the profile's mean action times against the median
    timed iteration and each action's mean duration in the run; an iteration sums
    many right-skewed action times, so its typical value is close to the sum of their
    means, while the median iteration is robust to the odd stalled one), "median"
    (medians throughout) or "min": the fastest profile samples against the fastest
    timed iteration and the fastest occurrence of each action, the machine's lower
    envelope, which other work on a shared machine can only lengthen."""
    if not isinstance(run, MeasuredRun):
        run = read_run(run, profile)
    sim = simulate_run(run, refined=True, statistic=statistic)
    contract = simulate_run(run, refined=False, statistic=statistic)
    steps = run.steps
    frames = [step_frame(run, k) for k in steps]
    per_step = [measured_breakdown(run, k, f) for k, f in zip(steps, frames, strict=True)]
    makespans = [t for t, _ in per_step]
    med = min(makespans) if statistic == "min" else statistics.median(makespans)
    step = steps[min(range(len(steps)), key=lambda i: abs(makespans[i] - med))]
    act = _action_table(frames, sim, statistic)
    # Replay: the same simulation with every compute action at its measured duration
    # (AR excluded: its measured time includes waiting for the peer).
    own = {(int(r.stage), r.action): float(r.measured_s) for r in act.itertuples()
           if r.kind in COMPUTE_KINDS}
    replay = simulate_run(run, refined=True, statistic=statistic, action_s=own)
    act["error"] = act["predicted_s"] / act["measured_s"] - 1.0
    return AccuracyReport(
        name=run.path.name, config=sim.config, measured_iteration_s=med,
        measured_makespans_s=tuple(makespans), statistic=statistic,
        predicted_iteration_s=sim.iteration_time_s,
        contract_iteration_s=contract.iteration_time_s,
        replay_iteration_s=replay.iteration_time_s,
        measured_wall_s=statistics.median(run.wall_s), actions=act,
        ranks=_rank_table(per_step, sim), memory=memory_table(run, sim), sim=sim, run=run,
        step=step, blocks=block_errors(run, dict(zip(steps, makespans, strict=True)),
                                       statistic),
        cpu=cpu_shares(run, frames))
