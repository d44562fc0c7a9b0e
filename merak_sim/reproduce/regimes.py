"""Where each Merak technique pays: a memory-pressure map over the free baseline.

The headline reproduction (:mod:`merak_sim.reproduce.merak`) compares Merak with
baselines forced into full recomputation, as the paper ran them. With 24 GB per GPU
every paper model fits without recomputation, so a baseline free to turn it off
matches Merak. The techniques can only pay where memory forces a trade:

- T1 (shifted critical path) removes the recompute from the critical path of the
  pipeline's steady phase: it pays where some recompute is unavoidable;
- T2 (stage-aware recompute) checkpoints only what each stage needs (later stages hold
  fewer live micro-batches): it pays where the baseline's uniform policy recomputes
  more than the tightest stage requires;
- T3 (sub-pipelined TP) hides tensor-parallel all-reduces behind the other half of a
  split micro-batch: it pays where TP communication is exposed and the split GEMMs
  lose less efficiency than the hidden time.

The level varied is the GPU memory (24 GB, the RTX 3090 of the assumed cluster, then
16, 12 and 8 GB), everything else as in the reproduction: memory is the one knob that
moves every plan from "no recompute needed" to "recompute everywhere" without changing
the work per iteration (a longer sequence or a bigger micro-batch would change the
work, so speed-ups at different levels would not be comparable). Each level runs the
ladder free -> +T1 -> +T2 -> +T3, each step a superset of the previous space, ranked by
the exact fast evaluator (no SimPy confirmation: the map is about the ranking the
planner sees, and it keeps the map to seconds per model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from merak_sim.config import ParallelConfig
from merak_sim.costs.calibrated import calibrated_cost_model
from merak_sim.hardware import Cluster
from merak_sim.model import ModelSpec, get_model
from merak_sim.planner import SYSTEMS, NoFeasiblePlanError, SearchSpace, search
from merak_sim.resolve import resolve_cluster
from merak_sim.sim import simulate

from .merak import DEFAULT_GLOBAL_BATCH, PAPER_MODELS, check_models, describe

__all__ = ["MEMORY_LEVELS_GB", "LADDER_ORDER", "ladder", "with_memory", "Regime",
           "regime_map", "T3Margin", "t3_margin", "explain_regimes", "cpu_tp_overlap"]

#: GPU memory levels of the map (GB = 1e9 bytes): the assumed RTX 3090, then tighter.
MEMORY_LEVELS_GB: tuple[float, ...] = (24, 16, 12, 8)
LADDER_ORDER = ("free", "+T1", "+T2", "+T3")


def ladder() -> dict[str, SearchSpace]:
    """The cumulative search spaces: the free baseline (1F1B, own recompute among none /
    selective / full, ZeRO-1 allowed), then + shifted critical path, + stage-aware
    recompute, + sub-pipelined TP as options (each space contains the previous)."""
    free = SYSTEMS["megatron-free"].with_(zero=(0, 1), name="free baseline")
    t1 = free.with_(schedules=("1f1b", "shifted-critical-path"), name="+T1")
    t2 = t1.with_(recompute=(*free.recompute, "stage-aware"), name="+T2")
    t3 = t2.with_(tp_overlap=("none", "sub-pipelined"), name="+T3")
    return {"free": free, "+T1": t1, "+T2": t2, "+T3": t3}


def with_memory(cluster, memory_gb: float) -> Cluster:
    """The cluster with every GPU's memory set to ``memory_gb`` GB."""
    c = resolve_cluster(cluster)
    return dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, memory_bytes=memory_gb * 1e9))


@dataclass(frozen=True)
class T3Margin:
    """The best plan that runs sub-pipelined TP at one level, against the best plan.

    Attributes:
        config: the best configuration with sub-pipelined TP (tp >= 2, even micro-batch).
        time_s: its evaluator time; ``loss`` = time_s / best - 1 (0 when it is the best).
        twin_time_s: the same configuration with synchronous TP.
        hidden_s: TP all-reduce time the overlap hides per micro-batch (forward +
            backward, summed over stages).
        split_s: compute time the split GEMMs add per micro-batch (same sum).
    """

    config: str
    time_s: float
    loss: float
    twin_time_s: float
    hidden_s: float
    split_s: float

    @property
    def overlap_gain(self) -> float:
        """Speed-up of sub-pipelined over synchronous TP on this configuration."""
        return self.twin_time_s / self.time_s

    @property
    def decides(self) -> str:
        """The cost that decides, in words."""
        if self.overlap_gain >= 1.0:
            return (f"overlap pays on its own plan ({self.overlap_gain:.3f}x: hides "
                    f"{self.hidden_s * 1e3:.1f} ms, splits cost {self.split_s * 1e3:.1f} ms "
                    "per micro-batch) but tp>=2 with an even micro-batch is "
                    f"{self.loss:+.1%} off the best plan")
        return (f"split GEMMs cost {self.split_s * 1e3:.1f} ms per micro-batch, more than "
                f"the {self.hidden_s * 1e3:.1f} ms of all-reduce they hide "
                f"({self.overlap_gain:.3f}x on its own plan)")

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        d = dataclasses.asdict(self)
        d.update(overlap_gain=self.overlap_gain, decides=self.decides)
        return d


@dataclass(frozen=True)
class Regime:
    """One model at one memory level: each ladder step's best time and plan.

    ``times`` / ``configs`` map a step of :data:`LADDER_ORDER` to its evaluator time
    and plan (None where no plan fits; ``no_fit`` then gives the shortfall).
    ``free_recompute_share``: the free baseline's recompute time over its iteration
    (mean per stage); ``free_exposed_comm_share``: the same for exposed communication;
    ``free_recompute``: the free baseline's recompute policy.
    """

    model: str
    memory_gb: float
    times: dict
    configs: dict
    no_fit: str = ""
    free_recompute_share: float = 0.0
    free_exposed_comm_share: float = 0.0
    free_recompute: str = ""
    t3: T3Margin | None = None

    def factor(self, step: str) -> float | None:
        """Speed-up of ``step`` over the previous ladder step (1.0 = no gain)."""
        i = LADDER_ORDER.index(step)
        a, b = self.times.get(LADDER_ORDER[i - 1]), self.times.get(step)
        return None if a is None or b is None else a / b

    @property
    def total(self) -> float | None:
        """Speed-up of +T3 (all three) over the free baseline."""
        a, b = self.times.get("free"), self.times.get("+T3")
        return None if a is None or b is None else a / b

    def to_dict(self) -> dict:
        """Plain-JSON row: ``t1``/``t2``/``t3`` are speed-up factors over the step before."""
        return {"model": self.model, "memory_gb": self.memory_gb,
                "t1": self.factor("+T1"), "t2": self.factor("+T2"),
                "t3": self.factor("+T3"), "total": self.total,
                "times_s": dict(self.times), "configs": dict(self.configs),
                "no_fit": self.no_fit, "free_recompute_share": self.free_recompute_share,
                "free_exposed_comm_share": self.free_exposed_comm_share,
                "free_recompute": self.free_recompute,
                "t3_margin": self.t3.to_dict() if self.t3 else None}


def _tp_split(model, cluster, cfg) -> tuple[float, float]:
    """(hidden all-reduce s, added split compute s) per micro-batch of ``cfg``'s
    sub-pipelined TP against the same configuration with synchronous TP."""
    cm = calibrated_cost_model()
    spec, clus = get_model(model), resolve_cluster(cluster)
    on = cm.cost_table(spec, clus, cfg).stages
    off = cm.cost_table(spec, clus, dataclasses.replace(cfg, tp_overlap="none")).stages
    hidden = sum(b.tp_exposed_fwd_s + b.tp_exposed_bwd_s - a.tp_exposed_fwd_s
                 - a.tp_exposed_bwd_s for a, b in zip(on, off, strict=True))
    work_on = sum(a.forward_s + a.backward_s - a.tp_exposed_fwd_s - a.tp_exposed_bwd_s
                  for a in on)
    work_off = sum(b.forward_s + b.backward_s - b.tp_exposed_fwd_s - b.tp_exposed_bwd_s
                   for b in off)
    return hidden, work_on - work_off


def t3_margin(model: str, cluster, global_batch_size: int, best_s: float) -> T3Margin | None:
    """The best plan forced to run sub-pipelined TP (tp >= 2, even micro-batch) against
    ``best_s``, with the cost that decides; None when no such plan fits."""
    space = ladder()["+T3"].with_(tp=(2, 4), tp_overlap=("sub-pipelined",),
                                  micro_batch_sizes=(2, 4, 8), name="forced sub-pipelined TP")
    try:
        res = search(model, cluster, global_batch_size, space=space, top_k=1, confirm=False)
    except NoFeasiblePlanError:
        return None
    cfg = res.best_config
    if cfg.tp_overlap != "sub-pipelined":
        return None
    t = res.best_result.iteration_time_s
    twin = simulate(model, cluster, dataclasses.replace(cfg, tp_overlap="none"),
                    engine="evaluator", keep_trace=False)
    hidden, split = _tp_split(model, cluster, cfg)
    return T3Margin(describe(cfg), t, t / best_s - 1.0, twin.iteration_time_s, hidden, split)


def _one(model: str, cluster, gbs: int, gb: float) -> Regime:
    c = with_memory(cluster, gb)
    times, configs, no_fit, best, policy = {}, {}, "", None, ""
    for step, space in ladder().items():
        try:
            res = search(model, c, gbs, space=space, top_k=1, confirm=False)
        except NoFeasiblePlanError as e:
            times[step] = configs[step] = None
            short = (e.shortfall_bytes or 0) / 1e9
            no_fit = no_fit or f"no plan fits: short {short:.2f} GB"
            continue
        times[step] = res.best_result.iteration_time_s
        configs[step] = describe(res.best_config)
        if step == "free":
            best, policy = res.best_result, res.best_config.recompute
    rc = cm = 0.0
    if best is not None:
        T = best.iteration_time_s
        rc = sum(r.recompute_s for r in best.ranks) / len(best.ranks) / T
        cm = sum(r.exposed_comm_s for r in best.ranks) / len(best.ranks) / T
    t3 = t3_margin(model, c, gbs, times["+T3"]) if times.get("+T3") else None
    return Regime(model, gb, times, configs, no_fit, rc, cm, policy, t3)


def regime_map(models: tuple[str, ...] = PAPER_MODELS, cluster="paper-3090",
               global_batch_size: int = DEFAULT_GLOBAL_BATCH,
               levels: tuple[float, ...] = MEMORY_LEVELS_GB, log=None) -> tuple[Regime, ...]:
    """Every model at every memory level (module docstring); ``log`` gets a line each."""
    check_models(models)
    out = []
    for name in models:
        for gb in levels:
            r = _one(name, cluster, global_batch_size, gb)
            out.append(r)
            if log:
                f = [r.factor(s) for s in LADDER_ORDER[1:]]
                log(f"regime {name} {gb:g} GB: " + (r.no_fit or " ".join(
                    f"{s} {x:.3f}x" for s, x in zip(LADDER_ORDER[1:], f, strict=True))))
    return tuple(out)


def explain_regimes(regimes: tuple[Regime, ...]) -> list[str]:
    """A few lines on where each technique pays and why, from the map's breakdowns."""
    lines = []
    fitting = [r for r in regimes if r.total is not None]
    if not fitting:
        return ["No memory level of the map fits any plan."]
    for step, what in (("+T1", "T1 (shifted critical path)"),
                       ("+T2", "T2 (stage-aware recompute)"),
                       ("+T3", "T3 (sub-pipelined TP)")):
        best = max(fitting, key=lambda r: r.factor(step) or 0.0)
        x = best.factor(step) or 1.0
        pays = [f"{r.model}@{r.memory_gb:g}GB" for r in fitting if (r.factor(step) or 1) > 1.001]
        if not pays:
            lines.append(f"{what}: never pays on this map (every step ties).")
            continue
        lines.append(
            f"{what}: pays in {len(pays)} of {len(fitting)} cells, most {x:.3f}x at "
            f"{best.model} {best.memory_gb:g} GB, where the free baseline "
            f"({best.configs['free']}) spends {best.free_recompute_share:.0%} of its "
            f"iteration in separate recompute passes and {best.free_exposed_comm_share:.0%} "
            "on exposed communication"
            + (" (its selective recompute is priced inside the backward)"
               if "selective" in best.configs["free"] else "") + ".")
    roomy = [r for r in fitting if r.free_recompute == "none"]
    if roomy:
        gains = [r for r in roomy if (r.total or 1.0) > 1.001]
        lines.append(
            f"Where the free baseline needs no recompute ({len(roomy)} cells, levels "
            f"{', '.join(sorted({f'{r.memory_gb:g}' for r in roomy}, key=float))} GB), "
            f"{len(gains)} gain(s) anything, by trading some recompute for better "
            "degrees; the paper-like speed-up there is only the recomputation the "
            "paper-like baselines are forced into.")
    t3s = [r.t3 for r in fitting if r.t3 is not None]
    if t3s:
        closest = min(t3s, key=lambda m: m.loss)
        lines.append(f"T3's closest call: {closest.config} is {closest.loss:+.1%} off the "
                     f"best plan; {closest.decides}.")
    return lines


def cpu_tp_overlap() -> dict:
    """Sub-pipelined over plain TP (step-time ratio) simulated for the 2-CPU-rank
    setting of the backend's TP-overlap benchmark (GPT h=512, 4 layers, 8 heads,
    sequence 128, vocabulary 2048, micro-batch 4, 2 micro-batches, fp32, tp=2) on the
    ``local-cpu`` preset with the analytic cost model (no profile)."""
    spec = ModelSpec("exec-gpt", "gpt", 4, 512, 8, 128, 2048, dtype="fp32", dropout=0.0,
                     source="the backend's TP-overlap benchmark shape")
    t = {}
    for ov in ("none", "sub-pipelined"):
        cfg = ParallelConfig(tp=2, micro_batch_size=4, global_batch_size=8, tp_overlap=ov,
                             dtype="fp32")
        t[ov] = simulate(spec, "local-cpu", cfg, sub_cluster=True,
                         keep_trace=False).iteration_time_s
    return {"plain_s": t["none"], "sub_pipelined_s": t["sub-pipelined"],
            "ratio_sub_over_plain": t["sub-pipelined"] / t["none"]}
