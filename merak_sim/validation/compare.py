"""Prediction versus measurement: simulate a measured run's configuration and compare.

:func:`validate` takes a measured run (:mod:`merak_sim.rundir`, written by
:mod:`merak_sim.validation_measure`) and the stage profile measured on the same
machine, simulates the same configuration with the exact evaluator, and reports:

- iteration-time error (the makespan of the measured action timeline, median over the
  timed iterations, against the simulated makespan; the wall time of the step, which
  also holds the loss reduction outside the schedule, is shown beside it);
- per-action error: every compute action (stage, IR token), measured duration (median
  over iterations and over the ranks of a stage) against the simulated one;
- per-rank compute, exposed-communication and bubble error;
- memory error per stage: the peak activation bytes (saved-tensor hooks in the real
  run) against the simulated peak minus the model state, and the parameter bytes
  against an analytic count of the built-in GPT's parameters on that stage;
- per block of timed iterations (when the run recorded blocks and the profile kept
  its samples): the block's median iteration against the prediction from the two
  profiler steps bracketing it. The spread of these errors is the measurement's
  noise (a shared machine's speed drifts); a bias common to every block is the
  model's or the profile's;
- a side-by-side Gantt chart, measured above, simulated below.

Pricing and simulation live in :mod:`merak_sim.validation_model` (every figure a
measured parameter of the machine, none fitted to the run being validated).

Measured timing conventions: the runtime starts timing a compute action before it
waits for the receive it consumes, so a measured action's effective start is the
later of its start and the end of that receive; the wait before it is exposed
communication where the transfer was in flight (the later of the send's and the
receive's postings, up to the receive's end) and bubble otherwise, which is the
simulator's own definition.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from merak_sim.config import ParallelConfig
from merak_sim.rundir import MeasuredRun, combine_profiles, read_run
from merak_sim.validation_history import spread
from merak_sim.validation_model import (
    STATISTICS,
    ValidationError,
    cost_table_from_profile,
    effective_config,
    simulate_run,
)

__all__ = ["ValidationReport", "validate", "cost_table_from_profile", "simulate_run",
           "measured_breakdown", "cpu_shares", "profile_cpu_share", "gpt_param_bytes",
           "summarize", "repeat_pairs", "plot_side_by_side", "block_errors", "ValidationError",
           "effective_config", "STATISTICS"]

_COMPUTE = ("FORWARD", "FORWARD_NOGRAD", "RECOMPUTE", "BACKWARD", "BACKWARD_INPUT",
            "BACKWARD_WEIGHT", "OPTIMIZER")


# -- the measured side -------------------------------------------------------------------
def _step_frame(run: MeasuredRun, step: int):
    """One step's events with ``eff_start_s`` (after the consumed receive) and
    ``wait_comm_s`` (exposed communication before the action)."""
    df = run.events_frame(step).copy()
    p2p = df[df["stream"] == "p2p"]
    recv_end, recv_post, send_post = {}, {}, {}
    for r in p2p.itertuples():
        if r.kind in ("RECV_ACT", "RECV_GRAD"):
            recv_end[(r.rank, r.kind, r.chunk, r.microbatch)] = r.end_s
            recv_post[(r.rank, r.kind, r.chunk, r.microbatch)] = r.start_s
        else:
            send_post.setdefault((r.stage, r.kind, r.microbatch), r.start_s)
    eff, wait_comm = [], []
    for r in df.itertuples():
        e, w = r.start_s, 0.0
        if r.stream == "compute":
            for rk, sk, peer in (("RECV_ACT", "SEND_ACT", r.stage - 1),
                                 ("RECV_GRAD", "SEND_GRAD", r.stage + 1)):
                key = (r.rank, rk, r.chunk, r.microbatch)
                if key in recv_end and r.start_s <= recv_end[key] <= r.end_s:
                    e = max(e, recv_end[key])
                    xs = max(recv_post[key], send_post.get((peer, sk, r.microbatch), r.start_s))
                    w = max(0.0, min(recv_end[key], e) - max(r.start_s, xs))
        eff.append(e)
        wait_comm.append(w)
    df["eff_start_s"] = eff
    df["wait_comm_s"] = wait_comm
    return df


def measured_breakdown(run: MeasuredRun, step: int, frame=None) -> tuple[float, list[dict]]:
    """(makespan, per-rank compute / exposed comm / bubble seconds) of one step
    (``frame``: that step's :func:`_step_frame`, when the caller has it already)."""
    df = _step_frame(run, step) if frame is None else frame
    T = float(df["end_s"].max())
    rows = []
    for rank, g in df.groupby("rank"):
        comp = g[g["stream"] == "compute"]
        compute = float((comp["end_s"] - comp["eff_start_s"]).sum())
        coll = g[g["stream"] == "collective"]
        comm = float((coll["end_s"] - coll["start_s"]).sum() + comp["wait_comm_s"].sum())
        rows.append({"rank": int(rank), "stage": int(g["stage"].iloc[0]), "compute_s": compute,
                     "exposed_comm_s": comm, "bubble_s": max(0.0, T - compute - comm)})
    return T, rows


def profile_cpu_share(profile: dict) -> float:
    """Main-thread CPU seconds over wall seconds of the profile's samples timed with all
    ranks busy, over every stage (NaN for profiles that did not record it): the share
    the actions got while profiled, to hold against the run's (:func:`cpu_shares`)."""
    st = profile.get("stages", [])
    wall = sum(x.get("lockstep_wall_s", 0.0) for x in st)
    return sum(x.get("lockstep_cpu_s", 0.0) for x in st) / wall if wall > 0 else float("nan")


def cpu_shares(run: MeasuredRun, frames=None):
    """Per timed iteration and rank: the rank's busy seconds (its compute actions from
    their effective start, :func:`_step_frame`; ``frames``: those of ``run.steps``,
    when the caller has them already), the CPU seconds its main thread got in the
    iteration (``run.cpu_s``), and their ratio ``share``.

    On CPU, with one thread per rank and a core per rank, the thread runs whenever it
    computes (waiting for a receive or the peer takes no CPU), so ``share`` sits near
    1 (0.95-1.02 in the CPU suite: the runtime's posts and bookkeeping outside the
    actions against the last bits of a wait inside them); well below 1, the core was
    taken by other work during the iteration and the measured times include the wait
    for it: the machine's noise, not the model's. Empty for run directories without
    CPU times (older ones), for runs on another backend than gloo (a GPU's kernels run
    while the host thread waits or spins) and under tensor parallelism, whose compute
    actions wait inside for their collectives (a share of 0.2-0.5 there says nothing
    about the machine)."""
    import pandas as pd

    cols = ["step", "rank", "busy_s", "cpu_s", "share"]
    if (not run.cpu_s or int(run.config.get("tp", 1)) > 1
            or run.meta.get("backend", "gloo") != "gloo"):
        return pd.DataFrame(columns=cols)
    rows = []
    for k, step in enumerate(run.steps):
        df = _step_frame(run, step) if frames is None else frames[k]
        comp = df[df["stream"] == "compute"]
        busy = (comp["end_s"] - comp["eff_start_s"]).groupby(comp["rank"]).sum()
        for rank, cpu in enumerate(run.cpu_s):
            if k < len(cpu) and rank in busy.index and busy[rank] > 0:
                rows.append({"step": step, "rank": rank, "busy_s": float(busy[rank]),
                             "cpu_s": cpu[k], "share": cpu[k] / float(busy[rank])})
    return pd.DataFrame(rows, columns=cols)


# -- memory prediction -------------------------------------------------------------------
def _uniform_ranges(n_layers: int, heavy: list[int], num_stages: int) -> list[range]:
    """merak_exec's uniform split, restated here so merak_sim needs no torch."""
    base, extra = divmod(len(heavy), num_stages)
    bounds, i = [0], 0
    for s in range(num_stages - 1):
        i += base + (1 if s < extra else 0)
        bounds.append(heavy[i])
    bounds.append(n_layers)
    return [range(bounds[s], bounds[s + 1]) for s in range(num_stages)]


def gpt_param_bytes(model: dict, pp: int, tp: int, bytes_per_param: int = 4) -> list[int]:
    """Analytic parameter bytes per pipeline stage of the built-in GPT (pre-LN blocks
    with biases, learned positions, tied head; the last stage keeps its own copy of the
    tied embedding when it lives on another rank; TP shards qkv / fc columns with their
    biases, proj / fc2 rows without, and the vocabulary rows of the embedding)."""
    h, V, P, L = model["n_embd"], model["vocab_size"], model["n_positions"], model["n_layer"]
    sharded = (3 * h * h + h * h + 4 * h * h + 4 * h * h + 3 * h + 4 * h) // tp
    block = sharded + 2 * h + 4 * h  # + proj / fc2 biases and two layer norms
    # The vocabulary is split over TP ranks (vocab-parallel embedding and head).
    emb, head = (V // tp) * h + P * h, 2 * h
    ranges = _uniform_ranges(L + 2, list(range(1, L + 1)), pp)
    out = []
    for s, r in enumerate(ranges):
        n = sum(block for i in r if 1 <= i <= L)
        n += emb if 0 in r else 0
        n += head if (L + 1) in r else 0
        if (L + 1) in r and 0 not in r:
            n += (V // tp) * h
        out.append(n * bytes_per_param)
        del s
    return out


# -- the report --------------------------------------------------------------------------
def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas else float("nan")


@dataclass
class ValidationReport:
    """Prediction versus measurement of one run (module docstring).

    Attributes:
        name: run name (directory name).
        config: the configuration simulated (effective checkpoint fractions).
        measured_iteration_s / predicted_iteration_s: schedule makespans.
        contract_iteration_s: prediction with the StageCost contract only.
        replay_iteration_s: the same simulation with every compute action at its
            measured duration (a diagnostic: what the schedule, communication and
            posting model alone get wrong; the rest of the error is the profile's).
        measured_wall_s: median wall time of a step (rank 0).
        actions: per-action table (DataFrame).
        ranks: per-rank breakdown table (DataFrame).
        memory: per-stage memory table (DataFrame).
        sim: the SimResult; run: the MeasuredRun; step: the step drawn in charts.
        measured_makespans_s: makespan of every timed iteration (the spread is the
            measurement's own noise).
        blocks: per block of timed iterations, its measured and predicted iteration
            and error (DataFrame, empty when the run kept no blocks; see
            :func:`block_errors`).
        cpu: per timed iteration and rank, CPU seconds against busy seconds
            (DataFrame, empty for runs without CPU times; see :func:`cpu_shares`).
    """

    name: str
    config: ParallelConfig
    measured_iteration_s: float
    predicted_iteration_s: float
    contract_iteration_s: float
    measured_wall_s: float
    replay_iteration_s: float
    actions: Any
    ranks: Any
    memory: Any
    sim: Any = field(repr=False)
    run: MeasuredRun = field(repr=False)
    step: int = 0
    measured_makespans_s: tuple[float, ...] = ()
    statistic: str = "mean"
    blocks: Any = None
    cpu: Any = None

    @property
    def iteration_error(self) -> float:
        """Relative error of the predicted iteration time."""
        return _err(self.predicted_iteration_s, self.measured_iteration_s)

    @property
    def action_abs_errors(self) -> list[float]:
        """|relative error| of every compute-stream action (AR excluded: it includes the
        wait for the slower peer)."""
        a = self.actions
        return [abs(x) for x in a[a["kind"].isin(_COMPUTE)]["error"].dropna()]

    def kind_errors(self) -> dict[str, float]:
        """Median relative error of each stage's actions of one kind, keyed
        ``"<stage> <KIND>"`` (the report's per-action table; AR included, where it holds
        the wait for the slower peer)."""
        return {f"{st} {kind}": float(g["error"].median())
                for (st, kind), g in self.actions.groupby(["stage", "kind"])}

    def summary(self) -> dict:
        """Headline numbers as a flat dict."""
        ae = self.action_abs_errors
        m = self.memory
        be = ([] if self.blocks is None or not len(self.blocks)
              else list(self.blocks["error"]))
        share = [] if self.cpu is None else self.cpu["share"]
        nan = float("nan")
        return {"run": self.name, "schedule": self.config.schedule,
                "statistic": self.statistic,
                "measured_ms": self.measured_iteration_s * 1e3,
                "predicted_ms": self.predicted_iteration_s * 1e3,
                "error": self.iteration_error,
                "contract_error": _err(self.contract_iteration_s, self.measured_iteration_s),
                "replay_error": _err(self.replay_iteration_s, self.measured_iteration_s),
                "wall_ms": self.measured_wall_s * 1e3,
                # spread of the timed iterations: how noisy the measurement itself was
                "measured_min_ms": min(self.measured_makespans_s, default=float("nan")) * 1e3,
                "measured_max_ms": max(self.measured_makespans_s, default=float("nan")) * 1e3,
                "action_median_abs_error": statistics.median(ae) if ae else float("nan"),
                "activation_max_abs_error": float(m["activation_error"].abs().max()),
                "param_max_abs_error": float(m["param_error"].abs().max()),
                "bubble_error_ms": float((self.ranks["predicted_bubble_s"]
                                          - self.ranks["measured_bubble_s"]).mean() * 1e3),
                "comm_error_ms": float((self.ranks["predicted_comm_s"]
                                        - self.ranks["measured_comm_s"]).mean() * 1e3),
                "blocks": len(be),
                "block_error_min": min(be, default=nan),
                "block_error_median": statistics.median(be) if be else nan,
                "block_error_max": max(be, default=nan),
                # How far the run's error can stray by the machine's drift alone: the
                # standard error of a mean over the blocks (each block priced from its
                # own profiles, so a model bias shifts them all and does not count here).
                "block_error_se": spread(be)[2] if be else nan,
                # near 1: the ranks had their cores whenever they computed
                "cpu_share_min": float(share.min()) if len(share) else nan,
                "cpu_share_median": float(share.median()) if len(share) else nan,
                "profile_cpu_share": profile_cpu_share(self.run.profile),
                # "paired-delta": the profile measured the extra cost of a backward adding
                # into existing gradients and the pricing used it (older profiles: "fresh")
                "backward_pricing": "paired-delta" if all(
                    "backward_accum_delta_s" in st for st in self.run.profile["stages"])
                else "fresh"}

    def to_markdown(self) -> str:
        """A readable report (markdown tables)."""
        s = self.summary()
        lines = [f"## {self.name}", "",
                 f"iteration: measured {s['measured_ms']:.2f} ms, predicted "
                 f"{s['predicted_ms']:.2f} ms, error {s['error'] * 100:+.1f} % (contract-only "
                 f"{s['contract_error'] * 100:+.1f} %, replay of the measured action times "
                 f"{s['replay_error'] * 100:+.1f} %); wall step {s['wall_ms']:.2f} ms; timed "
                 f"iterations {s['measured_min_ms']:.1f}-{s['measured_max_ms']:.1f} ms", ""]
        if s["blocks"]:
            b = self.blocks
            lines += [f"per block ({s['blocks']} blocks of timed iterations, each against the "
                      "profiler steps bracketing it): errors "
                      + ", ".join(f"{e * 100:+.1f} %" for e in b["error"])
                      + f"; measured {b['measured_s'].min() * 1e3:.1f}-"
                      f"{b['measured_s'].max() * 1e3:.1f} ms, predicted "
                      f"{b['predicted_s'].min() * 1e3:.1f}-{b['predicted_s'].max() * 1e3:.1f}"
                      f" ms; standard error of their mean {s['block_error_se'] * 100:.1f} %",
                      ""]
        if s["cpu_share_min"] == s["cpu_share_min"]:  # not NaN: the run kept CPU times
            prof = s["profile_cpu_share"]
            lines += ["CPU share (a rank's main-thread CPU seconds over its busy seconds, per "
                      f"timed iteration): median {s['cpu_share_median']:.3f}, lowest "
                      f"{s['cpu_share_min']:.3f}"
                      + (f"; while profiled {prof:.3f}" if prof == prof else ""), ""]
        lines += ["| stage | action kind | n | measured ms | predicted ms | median error |",
                  "|---|---|---|---|---|---|"]
        errs = self.kind_errors()
        for (st, kind), g in self.actions.groupby(["stage", "kind"]):
            lines.append(f"| {st} | {kind} | {len(g)} | {g['measured_s'].median() * 1e3:.2f} | "
                         f"{g['predicted_s'].median() * 1e3:.2f} | "
                         f"{errs[f'{st} {kind}'] * 100:+.1f} % |")
        lines += ["", "| rank | compute ms (meas/pred) | exposed comm ms | bubble ms |",
                  "|---|---|---|---|"]
        for r in self.ranks.itertuples():
            lines.append(f"| {r.rank} | {r.measured_compute_s * 1e3:.1f} / "
                         f"{r.predicted_compute_s * 1e3:.1f} | {r.measured_comm_s * 1e3:.1f} / "
                         f"{r.predicted_comm_s * 1e3:.1f} | {r.measured_bubble_s * 1e3:.1f} / "
                         f"{r.predicted_bubble_s * 1e3:.1f} |")
        lines += ["", "| stage | activation MiB (meas/pred) | error | params MiB (meas/pred) |",
                  "|---|---|---|---|"]
        for r in self.memory.itertuples():
            lines.append(f"| {r.stage} | {r.measured_activation_bytes / 2**20:.3f} / "
                         f"{r.predicted_activation_bytes / 2**20:.3f} | "
                         f"{r.activation_error * 100:+.1f} % | {r.measured_param_bytes / 2**20:.3f}"
                         f" / {r.predicted_param_bytes / 2**20:.3f} |")
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path | None = None):
        """Side-by-side Gantt (measured above, simulated below); see
        :func:`plot_side_by_side`."""
        return plot_side_by_side(self, path)


def block_errors(run: MeasuredRun, makespans: dict[int, float],
                 statistic: str = "mean"):
    """Per block of timed iterations: its median (``statistic`` "min": fastest)
    makespan against the prediction from the two profiler steps bracketing it (block
    b ran between profiler steps b and b+1; their times averaged, their fastest
    samples kept, as for the whole run). ``makespans``: ``{step: seconds}``. Returns a
    DataFrame (block, steps, measured_s, predicted_s, error); empty when the run did
    not record blocks or its profile kept no samples (older run directories, or a
    profile from elsewhere)."""
    import pandas as pd

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
                     "error": _err(pred, meas)})
    return pd.DataFrame(rows, columns=cols)


def validate(run: MeasuredRun | str | Path, profile: str | Path | None = None,
             statistic: str = "mean") -> ValidationReport:
    """Compare a measured run with its simulation (module docstring). ``statistic``:
    "mean" (the report's figures: the profile's mean action times against the median
    timed iteration and each action's mean duration in the run; an iteration sums
    many right-skewed action times, so its typical value is close to the sum of their
    means, while the median iteration is robust to the odd stalled one), "median"
    (medians throughout) or "min": the fastest profile samples against the fastest
    timed iteration and the fastest occurrence of each action, the machine's lower
    envelope, which other work on a shared machine can only lengthen."""
    import pandas as pd

    if not isinstance(run, MeasuredRun):
        run = read_run(run, profile)
    sim = simulate_run(run, refined=True, statistic=statistic)
    contract = simulate_run(run, refined=False, statistic=statistic)
    steps = run.steps
    frames = [_step_frame(run, k) for k in steps]
    per_step = [measured_breakdown(run, k, f) for k, f in zip(steps, frames, strict=True)]
    makespans = [t for t, _ in per_step]
    med = min(makespans) if statistic == "min" else statistics.median(makespans)
    step = steps[min(range(len(steps)), key=lambda i: abs(makespans[i] - med))]
    # per-action: the statistic over steps and ranks of the stage
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
    act = pd.DataFrame({"measured_s": meas, "predicted_s": pred}).dropna().reset_index()
    # Replay: the same simulation with every compute action at its measured duration
    # (AR excluded: its measured time includes waiting for the peer).
    own = {(int(r.stage), r.action): float(r.measured_s) for r in act.itertuples()
           if r.kind in _COMPUTE}
    replay = simulate_run(run, refined=True, statistic=statistic, action_s=own)
    act["error"] = act["predicted_s"] / act["measured_s"] - 1.0
    # per rank
    mb = {}
    for _, rows in per_step:
        for r in rows:
            mb.setdefault(r["stage"], []).append(r)
    # The simulation adds each post's cost to the compute action after it; a measured
    # action starts after its posts, which fall between actions (the bubble there).
    # Classified the measured way on both sides.
    kind_of = dict(zip(zip(sev["stage"], sev["action"]), sev["kind"], strict=True))
    posts: dict[tuple[int, bool], float] = {}  # (stage, before a collective) -> seconds
    for (st, a), v in extra.items():
        key = (st, kind_of.get((st, a)) == "ALL_REDUCE")
        posts[key] = posts.get(key, 0.0) + v
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
    # memory
    cfg = sim.config
    prog = sim.trace.prog
    params = gpt_param_bytes(run.model, cfg.pp, cfg.tp)
    mem = []
    for s in range(cfg.pp):
        ms = [m for m in run.memory if m["pp_rank"] == s]
        ma = max(m["activation_peak_bytes"] for m in ms)
        pa = sim.peak_memory_bytes[s] - prog.state_bytes[s]
        mp = max(m["param_bytes"] for m in ms)
        mem.append({"stage": s, "measured_activation_bytes": ma, "predicted_activation_bytes": pa,
                    "activation_error": _err(pa, ma), "measured_param_bytes": mp,
                    "predicted_param_bytes": params[s], "param_error": _err(params[s], mp)})
    return ValidationReport(
        name=run.path.name, config=cfg, measured_iteration_s=med,
        measured_makespans_s=tuple(makespans), statistic=statistic,
        predicted_iteration_s=sim.iteration_time_s,
        contract_iteration_s=contract.iteration_time_s,
        replay_iteration_s=replay.iteration_time_s,
        measured_wall_s=statistics.median(run.wall_s), actions=act,
        ranks=pd.DataFrame(rk), memory=pd.DataFrame(mem), sim=sim, run=run, step=step,
        blocks=block_errors(run, dict(zip(steps, makespans, strict=True)), statistic),
        cpu=cpu_shares(run, frames))


def plot_side_by_side(report: ValidationReport, path: str | Path | None = None):
    """Gantt charts on one time axis: the measured step closest to the median above
    (effective starts), the simulation below. Saves to ``path`` if given."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from merak_sim.schedule.render import KIND_COLORS

    colors = {k.name: c for k, c in KIND_COLORS.items()}
    meas = _step_frame(report.run, report.step)
    meas = meas[meas["stream"] != "p2p"].assign(start_s=lambda d: d["eff_start_s"])
    sim = report.sim.events()
    sim = sim[sim["stream"] != "p2p"]
    ranks_m = sorted(meas["rank"].unique())
    ranks_s = sorted(sim["rank"].unique())
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(12, 1.6 + 0.5 * (len(ranks_m)
                                                                          + len(ranks_s))))
    for ax, df, ranks, title in ((axes[0], meas, ranks_m, "measured"),
                                 (axes[1], sim, ranks_s, "simulated")):
        for i, r in enumerate(ranks):
            sub = df[df["rank"] == r]
            for kind, g in sub.groupby("kind"):
                bars = list(zip(g["start_s"] * 1e3, (g["end_s"] - g["start_s"]) * 1e3,
                                strict=True))
                ax.broken_barh(bars, (i - 0.4, 0.8), facecolors=colors.get(kind, "grey"),
                               edgecolor="white", linewidth=0.3, label=kind)
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
        ax.invert_yaxis()
        T = df["end_s"].max() * 1e3
        ax.set_title(f"{report.name}: {title} ({T:.1f} ms)", fontsize=9)
    h, lab = axes[0].get_legend_handles_labels()
    h2, lab2 = axes[1].get_legend_handles_labels()
    uniq = dict(zip(lab + lab2, h + h2, strict=False))
    axes[0].legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.005, 1),
                   fontsize=7)
    axes[1].set_xlabel("time (ms)")
    fig.tight_layout()
    if path is not None:
        from merak_sim.sim.result import _save

        _save(fig, path)
    return fig


def repeat_pairs(names, base: str, new: str) -> list[tuple[str, str]]:
    """The ``(base, new)`` pair and its repeats among run ``names``: ``base~i`` with
    ``new~i`` (a suite measures repeats of a configuration under ``name~i``)."""
    return [(base, new)] + [(n, new + n[len(base):]) for n in names
                            if n.startswith(base + "~")]


def summarize(reports: list[ValidationReport],
              speedup: tuple[str, str] | list[tuple[str, str]] | None = None) -> dict:
    """Suite figures against the issue's targets: iteration median / worst absolute
    error (and the worst run's name), per-action median absolute error (all runs
    pooled), worst activation error, the lowest and median CPU share of every run's
    iterations (:func:`cpu_shares`, where the runs have one) and optionally the
    speed-up of run ``new`` over run ``base`` for each ``(base, new)`` name pair
    (median over the pairs, measured and simulated)."""
    it = [abs(r.iteration_error) for r in reports]
    acts = [e for r in reports for e in r.action_abs_errors]
    worst = max(reports, key=lambda r: abs(r.iteration_error))
    out = {"runs": len(reports),
           "iteration_median_abs_error": statistics.median(it),
           "iteration_worst_abs_error": max(it),
           "iteration_worst_run": worst.name,
           "action_median_abs_error": statistics.median(acts) if acts else float("nan"),
           "activation_worst_abs_error": max(float(r.memory["activation_error"].abs().max())
                                             for r in reports)}
    shares = [x for r in reports if r.cpu is not None for x in r.cpu["share"]]
    if shares:  # the runs kept CPU times: did other work take the ranks' cores?
        out["cpu_share_min"] = min(shares)
        out["cpu_share_median"] = statistics.median(shares)
    if speedup is not None:
        pairs = [speedup] if isinstance(speedup, tuple) else list(speedup)
        by = {r.name: r for r in reports}
        got = [(by[b], by[n]) for b, n in pairs if b in by and n in by]
        if got:
            ms = [b.measured_iteration_s / n.measured_iteration_s - 1.0 for b, n in got]
            ps = [b.predicted_iteration_s / n.predicted_iteration_s - 1.0 for b, n in got]
            out["speedup_pairs"] = len(got)
            out["speedup_measured"] = statistics.median(ms)
            out["speedup_predicted"] = statistics.median(ps)
            out["speedup_gap_points"] = 100 * (out["speedup_predicted"]
                                               - out["speedup_measured"])
    return out
