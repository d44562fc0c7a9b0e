"""Pricing: a measured run's configuration priced from its stage profile and simulated.

Pricing (:func:`cost_table_from_profile`): every figure is a measured parameter of
this machine, none is fitted to the run being validated. Action times come from the
profiler step (merak_exec's validation profiler), which times each action through
the runtime's own code (its Python overhead per action included) while all ranks are
busy (thread contention included); point-to-point transfers use gloo's one-way
latency and bandwidth fitted from timed transfers.

The :class:`~merak_sim.costs.base.StageCost` contract has one forward time for F, F*
and R, and its programs post sends and receives in no time; :func:`simulate_run`
therefore compiles the program from the contract and then re-times it from the
profile before evaluating it with the exact evaluator ("refined"): F* and R take
their measured times, each post its measured cost (added to the compute action that
follows it; a receive met by a pending send of a computing peer costs the measured
blocked figure), a pipeline stage computing while the others idle runs at its
measured alone speed (both by :func:`_refine`, which needs the simulated timeline),
and every backward (B or W) but a rank's first of the
step adds the profiled cost of adding into existing gradients (:func:`_accumulating`:
the runtime clears them once per step, so the others add into them; never below
the fastest fresh sample, :func:`_profiled_durations`); no action is priced at a
negative time (:class:`ValidationError` names it). The contract-only prediction
(``refined=False``) is kept for comparison. Action times are the profile's means by
default (:func:`profile_view`).
"""

from __future__ import annotations

from dataclasses import replace

from merak_sim.config import ParallelConfig
from merak_sim.costs.base import CostTable, StageCost
from merak_sim.layout import RankLayout
from merak_sim.schedule.ir import Kind
from merak_sim.sim.api import evaluator_trace, simulate
from merak_sim.sim.evaluator import evaluate, plan
from merak_sim.sim.from_config import recompute_fractions, schedule_for
from merak_sim.sim.program import compile_program
from merak_sim.sim.result import build_result
from merak_sim.sim.structure import OP_COMPUTE, OP_POST
from merak_sim.validation.rundir import MeasuredRun

__all__ = ["ValidationError", "effective_config", "cost_table_from_profile",
           "simulate_run", "profile_view", "STATISTICS", "POST_BLOCK_WINDOW_S"]


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
    if any(c > 0 for c in eff) and tuple(recompute_fractions(cfg, schedule_for(cfg))) != eff:
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
                     meta={"source": "stage-profile"},
                     # the built-in GPT ties its embedding and head: the engine and
                     # the evaluator make AR on the first and last stage wait for both
                     tied_embeddings=config.pp > 1)


STATISTICS = ("mean", "median", "min")


def profile_view(profile: dict, statistic: str = "mean") -> dict:
    """The profile with its action times taken as ``statistic``: "mean" (``<key>_mean_s``,
    the default: an iteration sums many right-skewed action times, so its typical value
    is close to the sum of their means), "median" (as stored under ``<key>_s``) or
    "min", the fastest sample of each (``<key>_min_s``), i.e. the machine's lower
    envelope, which other work on a shared machine can only lengthen. Profiles without
    the requested figure keep the stored median."""
    if statistic not in STATISTICS:
        raise ValidationError(f"unknown statistic {statistic!r}; choose mean, median or min")
    if statistic == "median":
        return profile
    suffix = f"_{statistic}_s"

    def view(d: dict) -> dict:
        new = dict(d)
        for k, v in d.items():
            if k.endswith(suffix):
                new[k[:-len(suffix)] + "_s"] = v
        return new
    return {**profile, "stages": [view(st) for st in profile["stages"]],
            "machine": view(profile.get("machine", {}))}


def simulate_run(run: MeasuredRun, refined: bool = True, statistic: str = "mean",
                 action_s: dict | None = None):
    """Simulate the run's configuration from its profile (exact evaluator). With
    ``refined``, the program is re-timed from the profile (module docstring);
    ``statistic`` picks the profile's mean, median or fastest samples
    (:func:`profile_view`).

    ``action_s`` (a diagnostic, "replay"): ``{(stage, IR token): seconds}`` replacing
    the profiled time of those compute actions, e.g. their durations measured in the
    run itself; no contention model is applied on top (a measured duration holds the
    contention it met), posts and the tied all-reduce are priced as usual. The gap
    between this and the measured iteration is what the schedule, communication and
    posting model alone get wrong. Returns a :class:`~merak_sim.sim.result.SimResult`."""
    run = replace(run, profile=profile_view(run.profile, statistic))
    cfg = effective_config(run)
    table = cost_table_from_profile(run.profile, cfg)
    if not refined:
        return simulate(config=cfg, cost_table=table, engine="evaluator")
    sched = schedule_for(cfg)
    prog = compile_program(sched, table, recompute_fractions(cfg, sched))
    st = run.profile["stages"]
    dur = _profiled_durations(prog, st, action_s)
    # Posting a send or receive costs the runtime time on the rank's thread; the
    # program's posts are instantaneous, so each post's measured cost is added to the
    # compute action that follows it (and remembered, to compare actions alone).
    dur, extra = _refine(prog, dur, st, run.profile.get("machine", {}),
                         contended=cfg.dp * cfg.tp == 1 and cfg.pp > 1 and not action_s)
    _check_actions(prog, dur, extra)
    post_extra = {(prog.actions[x].stage, str(prog.actions[x])): v for x, v in extra.items()
                  if v > 0}
    prog = replace(prog, duration_s=tuple(dur))
    tr = evaluator_trace(prog, RankLayout.of(cfg), table.memory_capacity_bytes,
                         zero=cfg.zero)
    return build_result(tr, capacity=table.memory_capacity_bytes, peak_flops=1.0,
                        engine="evaluator", global_batch=cfg.global_batch_size,
                        seq_len=run.seq_len, config=cfg, notes=table.notes,
                        meta={"prediction": "replay" if action_s else "refined",
                              "post_extra_s": post_extra})


def _profiled_durations(prog, st: list[dict], action_s: dict | None) -> list[float]:
    """The program's durations with F* and R at their profiled times, the profiled
    cost of adding into existing gradients on the backwards that do, and ``action_s``
    (the replay's measured times) in place of the actions it names.

    An accumulating backward is priced no faster than the fastest fresh one the
    profiler timed (``<key>_min_s``; without it, than the fresh figure): the paired
    difference is a small effect under two samples' noise, and a stall in one
    pair's fresh sample (a descheduled rank, or under TP a peer late to a
    collective) can make it more negative than the backward is long."""
    dur = list(prog.duration_s)
    for i, a in enumerate(prog.actions):
        if a.kind is Kind.FORWARD_NOGRAD:
            dur[i] = st[a.stage]["forward_nograd_s"]
        elif a.kind is Kind.RECOMPUTE:
            dur[i] = st[a.stage]["reforward_s"]
    for i in _accumulating(prog):
        # all but a rank's first backward add into existing gradients: their profiled
        # extra time (older profiles have none: priced as before), floored (below)
        p = st[prog.actions[i].stage]
        key = ("backward_weight" if prog.actions[i].kind is Kind.BACKWARD_WEIGHT else
               "backward_ckpt" if prog.recompute_s[i] > 0 else "backward")
        dur[i] = max(dur[i] + p.get(key + "_accum_delta_s", 0.0),
                     p.get(key + "_min_s", dur[i]))
    if action_s:
        for i, a in enumerate(prog.actions):
            dur[i] = action_s.get((a.stage, str(a)), dur[i])
    return dur


def _check_actions(prog, dur: list[float], extra: dict[int, float]) -> None:
    """Each (stage, IR token) names one action of the program (the post costs, the
    replay's times and the per-action table are keyed so), and no action's own time
    (its duration less the posts added to it) is negative: the evaluator would run
    it backwards in time."""
    seen = set()
    for x, (a, d) in enumerate(zip(prog.actions, dur, strict=True)):
        key = (a.stage, str(a))
        if key in seen:
            raise ValidationError(f"stage {a.stage} action {a} occurs twice in the "
                                  "program; validation needs one action per token")
        seen.add(key)
        own = d - extra.get(x, 0.0)
        if own < 0:
            raise ValidationError(f"stage {a.stage} action {a} priced at {own:.3g} s; "
                                  f"fix the profile's figures for {a.kind.name}")


def _accumulating(prog) -> list[int]:
    """Action ids of the backwards (B, W) that find their parameters' gradients already
    there: every one of a rank's chunk but its first of the step, since the runtime
    clears the gradients (sets them to None) with each optimizer step."""
    seen, out = set(), []
    for r, ops in enumerate(prog.ops):
        for code, x, _ in ops:
            a = prog.actions[x] if code == OP_COMPUTE else None
            if a is None or a.kind not in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT):
                continue
            if (r, a.chunk) in seen:
                out.append(x)
            seen.add((r, a.chunk))
    return out


_SOLO_KEY = {"FORWARD": "forward_s", "FORWARD_NOGRAD": "forward_nograd_s",
             "RECOMPUTE": "reforward_s", "BACKWARD_INPUT": "backward_input_s",
             "BACKWARD_WEIGHT": "backward_weight_s"}


def _solo_ratios(prog, stages: list[dict]) -> list[float]:
    """Per action id, its measured alone time over its all-busy time (1 if unknown)."""
    ratio = []
    for i, a in enumerate(prog.actions):
        p = stages[a.stage]
        key = _SOLO_KEY.get(a.kind.name)
        if a.kind.name == "BACKWARD":
            key = "backward_ckpt_s" if prog.recompute_s[i] > 0 else "backward_s"
        t, so = (p.get(key), p.get(key[:-2] + "_solo_s")) if key else (None, None)
        ratio.append(so / t if t and so else 1.0)
    return ratio


def _post_groups(prog) -> tuple[dict, dict]:
    """The posts of each rank grouped by the compute action that follows them:
    ``{action id: (previous action id on the rank or -1, [(transfer id, is_send)])}``,
    and for every transfer the action id after which its send is posted (-1: before
    the rank's first action)."""
    groups: dict[int, tuple[int, list]] = {}
    send_after: dict[int, int] = {}
    for ops in prog.ops:
        prev, pending = -1, []
        for code, x, y in ops:
            if code == OP_POST:
                pending.append((x, bool(y)))
                if y:
                    send_after[x] = prev
                continue
            if pending:
                groups[x] = (prev, pending)
                pending = []
            prev = x
    return groups, send_after


#: A receive posted against a pending send is priced as blocked when the peer computes
#: within this long of the post: the peer may start the moment this post's own send
#: reaches it, which on the loopback machine takes a transfer (about 0.2 ms) plus the
#: wake-up of its thread, up to several scheduler ticks when the cores are busy. The
#: measuring side classifies measured posts with the same window.
POST_BLOCK_WINDOW_S = 1e-3


def _compute_spans(prog, ev) -> dict[int, list[tuple[float, float]]]:
    """Per rank, the (start, end) of its actions in evaluation ``ev`` (AR excluded)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for x, r in enumerate(prog.rank_of_action):
        if prog.actions[x].kind is not Kind.ALL_REDUCE:
            spans.setdefault(r, []).append((ev.start[x], ev.end[x]))
    return spans


def _post_costs(prog, ev, spans, groups: dict, send_after: dict, post_s: float,
                blocked_s: float) -> dict[int, float]:
    """Per action id, the cost of the posts before it: ``post_s`` each, plus the
    blocked figure's excess when a receive meets a pending send of a peer computing at
    the post or within :data:`POST_BLOCK_WINDOW_S` of it (it may have been waiting
    for exactly this post's send)."""

    def busy(rank: int, t0: float, t1: float) -> bool:
        return any(s0 < t1 and e0 > t0 for s0, e0 in spans.get(rank, ()))

    extra = {}
    for x, (prev, ops) in groups.items():
        t_post = ev.end[prev] if prev >= 0 else 0.0
        hit = False
        for tid, is_send in ops:
            tr = prog.transfers[tid]
            sp = send_after.get(tid, -1)
            pending = (ev.end[sp] if sp >= 0 else 0.0) <= t_post
            hit = hit or (not is_send and pending and busy(tr.src, t_post,
                                                           t_post + POST_BLOCK_WINDOW_S))
        extra[x] = post_s * len(ops) + (blocked_s - post_s if hit else 0.0)
    return extra


def _contended(prog, ev, spans, base: list[float], ratio: list[float],
               extra: dict[int, float]) -> list[float]:
    """Durations for the next fixed-point round: each action's alone time plus the
    all-busy slowdown scaled by the fraction of it overlapping another rank's compute
    in ``ev``, plus its post cost."""
    nxt = []
    for x, r in enumerate(prog.rank_of_action):
        f = 1.0
        if ratio[x] != 1.0:
            s0, e0 = ev.start[x], ev.end[x]
            ov = sum(max(0.0, min(e0, e1) - max(s0, s1)) for q, sp in spans.items()
                     if q != r for s1, e1 in sp)
            f = min(1.0, ov / (e0 - s0)) if e0 > s0 else 1.0
        nxt.append(extra.get(x, 0.0) + base[x] * (ratio[x] + (1.0 - ratio[x]) * f))
    return nxt


def _refine(prog, base: list[float], stages: list[dict], machine: dict, contended: bool,
            iterations: int = 8) -> tuple[list[float], dict[int, float]]:
    """Durations with the measured costs that depend on what the other rank is doing
    (a fixed point of a few exact evaluations, starting from the all-busy times):

    - posts: each costs ``p2p_post_s``, except a receive whose send the peer already
      posted while the peer computes within :data:`POST_BLOCK_WINDOW_S` of the post
      (it may have waited for exactly this post's send), which costs
      ``p2p_post_blocked_s`` (gloo's receive then often waits for a thread to get one
      of the busy cores; measured through the runtime with the same rule);
    - contention (``contended``: pipeline ranks without replicas, which do not always
      compute together): an action costs its alone time plus the measured slowdown of
      all ranks computing at once, scaled by the fraction of it that overlaps another
      rank's compute in the simulated timeline. Data- and tensor-parallel replicas
      always run together, so their all-busy times stand.

    Returns the durations and the post cost added to each action id."""
    post_s = float(machine.get("p2p_post_s", 0.0))
    blocked_s = float(machine.get("p2p_post_blocked_s", post_s))
    groups, send_after = _post_groups(prog)
    ratio = _solo_ratios(prog, stages) if contended else [1.0] * len(base)
    extra = {x: post_s * len(ops) for x, (_p, ops) in groups.items()}
    if blocked_s == post_s and all(abs(r - 1.0) < 1e-12 for r in ratio):
        return [d + extra.get(x, 0.0) for x, d in enumerate(base)], extra
    pl = plan(prog)
    cur = [d + extra.get(x, 0.0) for x, d in enumerate(base)]
    for _ in range(iterations):
        ev = evaluate(replace(prog, duration_s=tuple(cur)), pl)
        spans = _compute_spans(prog, ev)
        extra = _post_costs(prog, ev, spans, groups, send_after, post_s, blocked_s)
        nxt = _contended(prog, ev, spans, base, ratio, extra)
        if nxt == cur:
            break
        cur = nxt
    return cur, extra
