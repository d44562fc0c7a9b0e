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
- a side-by-side Gantt chart, measured above, simulated below.

Pricing (:func:`cost_table_from_profile`): every figure is a measured parameter of
this machine, none is fitted to the run being validated. Action times come from the
profiler step, which times each action through the runtime's own code (its Python
overhead per action included) while all ranks are busy (thread contention included);
point-to-point transfers use the gloo latency and bandwidth fitted from ping-pongs,
posting a send or receive costs its measured time, and a pipeline stage computing
while the others idle runs at its measured alone speed (:func:`_contention`), and
the tied-embedding all-reduce waits for both of its ranks (:func:`_sync_tied_all_reduce`).
The :class:`~merak_sim.costs.base.StageCost` contract has one forward time for F, F*
and R; the measured F* (no-grad) and R (re-forward) differ from F, so the prediction
(:func:`simulate_run`) re-times those actions of the compiled program from the
profile before evaluating it ("refined"); the contract-only prediction is kept as
``contract`` for comparison.

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
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.rundir import MeasuredRun, read_run

__all__ = ["ValidationReport", "validate", "cost_table_from_profile", "simulate_run",
           "measured_breakdown", "gpt_param_bytes", "summarize", "plot_side_by_side",
           "ValidationError"]

_COMPUTE = ("FORWARD", "FORWARD_NOGRAD", "RECOMPUTE", "BACKWARD", "BACKWARD_INPUT",
            "BACKWARD_WEIGHT", "OPTIMIZER")


class ValidationError(ValueError):
    """Validation input that does not fit together (message names the fix)."""


# -- pricing ---------------------------------------------------------------------------
def _p2p_time(machine: dict, nbytes: float) -> float:
    if nbytes <= 0:
        return 0.0
    return float(machine.get("p2p_alpha_s", 0.0)) + nbytes * float(
        machine.get("p2p_s_per_byte", 0.0))


def effective_config(run: MeasuredRun) -> ParallelConfig:
    """The run's ParallelConfig with the checkpoint fractions the runtime really used
    (it checkpoints ``round(c * layers)`` whole layers, so c = 0.75 of 2 layers is 1.0)."""
    cfg = ParallelConfig.from_dict(run.config)
    eff = tuple(float(s["recompute_fraction"]) for s in run.profile["stages"])
    if len(eff) != cfg.pp:
        raise ValidationError(f"profile has {len(eff)} stages but the run has pp={cfg.pp}; "
                              "use a profile measured for this configuration")
    if any(c > 0 for c in eff) and tuple(cfg.recompute_per_stage(cfg.build_schedule())) != eff:
        cfg = replace(cfg, recompute="stage-aware", recompute_fractions=eff)
    return cfg


def cost_table_from_profile(profile: dict, config: ParallelConfig) -> CostTable:
    """A CostTable whose every entry is a measured figure of ``profile`` (module
    docstring); one StageCost per pipeline stage (no virtual stages)."""
    if config.virtual_stages != 1:
        raise ValidationError("validation profiles hold one chunk per rank; use "
                              "virtual_stages=1")
    machine = profile.get("machine", {})
    stages = []
    for p in profile["stages"]:
        c = float(p["recompute_fraction"])
        extra = (p["backward_ckpt_s"] - p["backward_s"]) / c if c > 0 else p["reforward_s"]
        stages.append(StageCost(
            forward_s=p["forward_s"], backward_s=p["backward_s"],
            backward_input_s=p["backward_input_s"], backward_weight_s=p["backward_weight_s"],
            recompute_s=max(0.0, extra), send_activation_s=_p2p_time(machine, p["p2p_bytes"]),
            grad_allreduce_s=p["all_reduce_s"], optimizer_s=p["optimizer_s"],
            activation_bytes=p["activation_bytes"], checkpoint_bytes=p["checkpoint_bytes"],
            input_bytes=p["input_bytes"], weight_bytes=p["param_bytes"],
            grad_bytes=p["param_bytes"], optimizer_bytes=p["optimizer_bytes"],
            p2p_bytes=p["p2p_bytes"], flops=0.0, layers=int(p["heavy_layers"])))
    return CostTable(stages=tuple(stages), memory_capacity_bytes=float(2**40), peak_flops=1.0,
                     notes=("priced from a measured stage profile (merak-stage-profile/1)",),
                     meta={"source": "stage-profile"})


def simulate_run(run: MeasuredRun, refined: bool = True):
    """Simulate the run's configuration from its profile (exact evaluator). With
    ``refined``, F* and R take their measured times instead of the F time (module
    docstring). Returns a :class:`~merak_sim.sim.result.SimResult`."""
    from merak_sim.schedule.ir import Kind
    from merak_sim.sim.api import evaluator_trace, simulate
    from merak_sim.sim.entities import Placement
    from merak_sim.sim.program import OP_POST, compile_program
    from merak_sim.sim.result import build_result

    cfg = effective_config(run)
    table = cost_table_from_profile(run.profile, cfg)
    if not refined:
        return simulate(config=cfg, cost_table=table, engine="evaluator")
    sched = cfg.build_schedule()
    prog = compile_program(sched, table, cfg.recompute_per_stage(sched))
    st = run.profile["stages"]
    dur = list(prog.duration_s)
    for i, a in enumerate(prog.actions):
        if a.kind is Kind.FORWARD_NOGRAD:
            dur[i] = st[a.stage]["forward_nograd_s"]
        elif a.kind is Kind.RECOMPUTE:
            dur[i] = st[a.stage]["reforward_s"]
    # Posting a send or receive costs the runtime time on the rank's thread; the
    # program's posts are instantaneous, so each post's measured cost is added to the
    # compute action that follows it (and remembered, to compare actions alone).
    post_s = float(run.profile.get("machine", {}).get("p2p_post_s", 0.0))
    post_extra: dict[tuple[int, str], float] = {}
    if post_s > 0:
        for ops in prog.ops:
            pending = 0
            for code, x, _y in ops:
                if code == OP_POST:
                    pending += 1
                    continue
                if pending:
                    dur[x] += pending * post_s
                    a = prog.actions[x]
                    post_extra[(a.stage, str(a))] = pending * post_s
                    pending = 0
    if cfg.dp * cfg.tp == 1 and cfg.pp > 1:
        dur = _contention(prog, dur, st, post_extra)
    if cfg.pp > 1:
        dur = _sync_tied_all_reduce(prog, dur)
    prog = replace(prog, duration_s=tuple(dur))
    tr = evaluator_trace(prog, Placement(cfg.dp, cfg.tp, cfg.pp), table.memory_capacity_bytes,
                         zero=cfg.zero)
    return build_result(tr, capacity=table.memory_capacity_bytes, peak_flops=1.0,
                        engine="evaluator", global_batch=cfg.global_batch_size,
                        seq_len=run.seq_len, config=cfg, notes=table.notes,
                        meta={"prediction": "refined", "post_extra_s": post_extra})


_SOLO_KEY = {"FORWARD": "forward_s", "FORWARD_NOGRAD": "forward_nograd_s",
             "RECOMPUTE": "reforward_s", "BACKWARD_INPUT": "backward_input_s",
             "BACKWARD_WEIGHT": "backward_weight_s"}


def _contention(prog, dur: list[float], stages: list[dict], post_extra: dict,
                iterations: int = 4) -> list[float]:
    """Durations under measured contention: an action costs its alone time plus the
    measured slowdown of all ranks computing at once, scaled by the fraction of it
    that overlaps another rank's compute in the simulated timeline (fixed point of a
    few evaluations, starting from the all-busy times). Only pipeline ranks without
    replicas vary: data- and tensor-parallel replicas always run together."""
    from merak_sim.sim.evaluator import evaluate, plan

    ratio = []
    for i, a in enumerate(prog.actions):
        p = stages[a.stage]
        key = _SOLO_KEY.get(a.kind.name)
        if a.kind.name == "BACKWARD":
            key = "backward_ckpt_s" if prog.recompute_s[i] > 0 else "backward_s"
        t, so = (p.get(key), p.get(key[:-2] + "_solo_s")) if key else (None, None)
        ratio.append(so / t if t and so else 1.0)
    if all(abs(r - 1.0) < 1e-12 for r in ratio):
        return dur
    post = [post_extra.get((a.stage, str(a)), 0.0) for a in prog.actions]
    busy = [d - q for d, q in zip(dur, post, strict=True)]
    pl = plan(prog)
    cur = list(dur)
    for _ in range(iterations):
        ev = evaluate(replace(prog, duration_s=tuple(cur)), pl)
        spans: dict[int, list[tuple[float, float]]] = {}
        for x, r in enumerate(prog.rank_of_action):
            spans.setdefault(r, []).append((ev.start[x], ev.end[x]))
        nxt = []
        for x, r in enumerate(prog.rank_of_action):
            s0, e0 = ev.start[x], ev.end[x]
            ov = sum(max(0.0, min(e0, e1) - max(s0, s1)) for q, sp in spans.items() if q != r
                     for s1, e1 in sp)
            f = min(1.0, ov / (e0 - s0)) if e0 > s0 else 1.0
            nxt.append(post[x] + busy[x] * (ratio[x] + (1.0 - ratio[x]) * f))
        cur = nxt
    return cur


def _sync_tied_all_reduce(prog, dur: list[float]) -> list[float]:
    """The built-in GPT ties its embedding and head, so AR on the first and last
    pipeline ranks starts with one collective between them (merak_exec sums the tied
    gradients there): it cannot finish before the later rank arrives. The program
    prices each rank's AR alone, so the earlier rank's AR is lengthened by the wait
    (AR is followed only by OPT, so nothing else moves)."""
    from merak_sim.schedule.ir import Kind
    from merak_sim.sim.evaluator import evaluate, plan

    S = prog.num_ranks
    ar = {r: x for x, (a, r) in enumerate(zip(prog.actions, prog.rank_of_action, strict=True))
          if a.kind is Kind.ALL_REDUCE and r in (0, S - 1)}
    if len(ar) < 2:
        return dur
    ev = evaluate(replace(prog, duration_s=tuple(dur)), plan(prog))
    latest = max(ev.start[x] for x in ar.values())
    out = list(dur)
    for x in ar.values():
        out[x] += latest - ev.start[x]
    return out


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


def measured_breakdown(run: MeasuredRun, step: int) -> tuple[float, list[dict]]:
    """(makespan, per-rank compute / exposed comm / bubble seconds) of one step."""
    df = _step_frame(run, step)
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
        measured_wall_s: median wall time of a step (rank 0).
        actions: per-action table (DataFrame).
        ranks: per-rank breakdown table (DataFrame).
        memory: per-stage memory table (DataFrame).
        sim: the SimResult; run: the MeasuredRun; step: the step drawn in charts.
    """

    name: str
    config: ParallelConfig
    measured_iteration_s: float
    predicted_iteration_s: float
    contract_iteration_s: float
    measured_wall_s: float
    actions: Any
    ranks: Any
    memory: Any
    sim: Any = field(repr=False)
    run: MeasuredRun = field(repr=False)
    step: int = 0

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

    def summary(self) -> dict:
        """Headline numbers as a flat dict."""
        ae = self.action_abs_errors
        m = self.memory
        return {"run": self.name, "schedule": self.config.schedule,
                "measured_ms": self.measured_iteration_s * 1e3,
                "predicted_ms": self.predicted_iteration_s * 1e3,
                "error": self.iteration_error,
                "contract_error": _err(self.contract_iteration_s, self.measured_iteration_s),
                "wall_ms": self.measured_wall_s * 1e3,
                "action_median_abs_error": statistics.median(ae) if ae else float("nan"),
                "activation_max_abs_error": float(m["activation_error"].abs().max()),
                "param_max_abs_error": float(m["param_error"].abs().max()),
                "bubble_error_ms": float((self.ranks["predicted_bubble_s"]
                                          - self.ranks["measured_bubble_s"]).mean() * 1e3),
                "comm_error_ms": float((self.ranks["predicted_comm_s"]
                                        - self.ranks["measured_comm_s"]).mean() * 1e3)}

    def to_markdown(self) -> str:
        """A readable report (markdown tables)."""
        s = self.summary()
        lines = [f"## {self.name}", "",
                 f"iteration: measured {s['measured_ms']:.2f} ms, predicted "
                 f"{s['predicted_ms']:.2f} ms, error {s['error'] * 100:+.1f} % (contract-only "
                 f"{s['contract_error'] * 100:+.1f} %); wall step {s['wall_ms']:.2f} ms", "",
                 "| stage | action kind | n | measured ms | predicted ms | median error |",
                 "|---|---|---|---|---|---|"]
        a = self.actions
        for (st, kind), g in a.groupby(["stage", "kind"]):
            lines.append(f"| {st} | {kind} | {len(g)} | {g['measured_s'].median() * 1e3:.2f} | "
                         f"{g['predicted_s'].median() * 1e3:.2f} | "
                         f"{g['error'].median() * 100:+.1f} % |")
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


def validate(run: MeasuredRun | str | Path, profile: str | Path | None = None) -> ValidationReport:
    """Compare a measured run with its simulation (module docstring)."""
    import pandas as pd

    if not isinstance(run, MeasuredRun):
        run = read_run(run, profile)
    sim = simulate_run(run, refined=True)
    contract = simulate_run(run, refined=False)
    steps = run.steps
    per_step = [measured_breakdown(run, k) for k in steps]
    makespans = [t for t, _ in per_step]
    med = statistics.median(makespans)
    step = steps[min(range(len(steps)), key=lambda i: abs(makespans[i] - med))]
    # per-action: median over steps and ranks of the stage
    frames = [_step_frame(run, k) for k in steps]
    allm = pd.concat(frames)
    allm = allm[allm["stream"] != "p2p"]
    allm = allm.assign(dur=allm["end_s"] - allm["eff_start_s"])
    meas = allm.groupby(["stage", "action", "kind"])["dur"].median()
    sev = sim.events()
    sev = sev[sev["stream"] != "p2p"]
    extra = sim.meta.get("post_extra_s", {})
    sev = sev.assign(dur=[e - s - extra.get((st, a), 0.0) for s, e, st, a in zip(
        sev["start_s"], sev["end_s"], sev["stage"], sev["action"], strict=True)])
    pred = sev.groupby(["stage", "action", "kind"])["dur"].median()
    act = pd.DataFrame({"measured_s": meas, "predicted_s": pred}).dropna().reset_index()
    act["error"] = act["predicted_s"] / act["measured_s"] - 1.0
    # per rank
    mb = {}
    for _, rows in per_step:
        for r in rows:
            mb.setdefault(r["stage"], []).append(r)
    rk = []
    for r in sim.ranks:
        ms = mb.get(r.stage, [])
        rk.append({"rank": r.rank, "stage": r.stage,
                   "measured_compute_s": statistics.median(x["compute_s"] for x in ms),
                   "predicted_compute_s": r.compute_s + r.recompute_s,
                   "measured_comm_s": statistics.median(x["exposed_comm_s"] for x in ms),
                   "predicted_comm_s": r.exposed_comm_s,
                   "measured_bubble_s": statistics.median(x["bubble_s"] for x in ms),
                   "predicted_bubble_s": r.bubble_s})
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
        predicted_iteration_s=sim.iteration_time_s,
        contract_iteration_s=contract.iteration_time_s,
        measured_wall_s=statistics.median(run.wall_s), actions=act,
        ranks=pd.DataFrame(rk), memory=pd.DataFrame(mem), sim=sim, run=run, step=step)


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


def summarize(reports: list[ValidationReport],
              speedup: tuple[str, str] | list[tuple[str, str]] | None = None) -> dict:
    """Suite figures against the issue's targets: iteration median / worst absolute
    error, per-action median absolute error (all runs pooled), worst activation error,
    and optionally the speed-up of run ``new`` over run ``base`` for each ``(base,
    new)`` name pair (median over the pairs, measured and simulated)."""
    it = [abs(r.iteration_error) for r in reports]
    acts = [e for r in reports for e in r.action_abs_errors]
    out = {"runs": len(reports),
           "iteration_median_abs_error": statistics.median(it),
           "iteration_worst_abs_error": max(it),
           "action_median_abs_error": statistics.median(acts) if acts else float("nan"),
           "activation_worst_abs_error": max(float(r.memory["activation_error"].abs().max())
                                             for r in reports)}
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
