"""Reproduction of Merak's headline speed-ups (Lai et al., TPDS 2023).

Claim (Lai et al., TPDS 2023): on 64 GPUs Merak trains GPT models of 1.5B, 2.5B,
8.3B and 20B parameters up to 1.42x, 1.39x, 1.43x and 1.61x faster than Megatron-LM and
DeepSpeed. Recipe, per model, each system at *its own* best configuration found by the
planner within the system's restricted search space
(:data:`merak_sim.planner.SYSTEMS`):

- Megatron-LM-like: 1F1B, full recompute on every stage, synchronous TP all-reduces;
- DeepSpeed-like: the same with ZeRO-1;
- Merak: shifted critical path (T1) + stage-aware recompute (T2, per-stage fractions
  chosen from the memory model) + sub-pipelined TP (T3);
- ablation: from the better of the two baselines, add T1, then T2, then T3;
- free baselines: the same two systems free to choose their own recompute (none,
  selective or full) besides their degrees and micro-batch size, as a user would when
  memory allows. Merak's speed-up over them is what its techniques buy beyond turning
  recomputation off (:mod:`merak_sim.reproduce.regimes` maps it over memory levels).

Every system computes attention unfused, as the paper's did (``attention="unfused"`` in
each space and in :func:`hand_configs`), not the simulator's GPU default of flash.

The cluster and shapes are not stated by the paper; :func:`assumptions` lists every
assumption and the reproduction prints them. The paper's "up to" is read as the larger
of the speed-ups over the two baselines; the speed-up over the faster baseline is shown
too. Constants are never tuned to the paper: where the reproduced figure differs by
more than 15 %, :func:`explain` derives the reason from the simulations (which
technique gained what, which stage recomputes how much, what the winning degrees are).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from merak_sim.config import ParallelConfig
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.planner import SYSTEMS, search
from merak_sim.schedule import SCHEDULES
from merak_sim.sim import simulate

__all__ = ["PAPER_SPEEDUPS", "PAPER_MODELS", "SYSTEM_ORDER", "FREE_ORDER", "ABLATION_ORDER",
           "SystemRun", "ModelReproduction", "Reproduction", "reproduce_merak",
           "assumptions", "explain", "hand_configs", "describe", "check_models",
           "DEFAULT_GLOBAL_BATCH"]

#: Merak's published speed-ups per model (Lai et al., TPDS 2023, headline claim).
PAPER_SPEEDUPS: dict[str, float] = {"gpt-1.5b": 1.42, "gpt-2.5b": 1.39, "gpt-8.3b": 1.43,
                                    "gpt-20b": 1.61}
PAPER_MODELS: tuple[str, ...] = tuple(PAPER_SPEEDUPS)
SYSTEM_ORDER = ("megatron", "deepspeed", "merak")
#: The baselines free to choose their own recompute (keys of SYSTEMS).
FREE_ORDER = ("megatron-free", "deepspeed-free")
ABLATION_ORDER = ("baseline", "+T1", "+T2", "merak")
#: Global batch (sequences) per iteration: an assumption, the paper does not state it.
DEFAULT_GLOBAL_BATCH = 128


@dataclass(frozen=True)
class SystemRun:
    """One system at its best configuration on one model.

    Attributes:
        system: key of :data:`merak_sim.planner.SYSTEMS`.
        label: readable name.
        config: the planner's best ParallelConfig for that system.
        result: its SimPy SimResult.
        counts: the search's candidate counts.
    """

    system: str
    label: str
    config: ParallelConfig
    result: Any
    counts: dict

    @property
    def time_s(self) -> float:
        """Iteration time of the best configuration."""
        return self.result.iteration_time_s


@dataclass(frozen=True)
class ModelReproduction:
    """Every system and ablation step on one model, with speed-ups and explanation."""

    model: str
    runs: dict[str, SystemRun]
    paper: float
    cluster: str = "paper-3090"

    @property
    def speedup_vs(self) -> dict[str, float]:
        """Merak's speed-up over each baseline system."""
        m = self.runs["merak"].time_s
        return {s: self.runs[s].time_s / m for s in ("megatron", "deepspeed")}

    @property
    def speedup_vs_free(self) -> dict[str, float]:
        """Merak's speed-up over each free baseline (own recompute choice)."""
        m = self.runs["merak"].time_s
        return {s: self.runs[s].time_s / m for s in FREE_ORDER}

    @property
    def speedup_vs_free_baselines(self) -> float:
        """Speed-up over the faster free baseline: what Merak's techniques buy beyond
        turning recomputation off (below 1: Merak's plan is slower)."""
        return min(self.speedup_vs_free.values())

    @property
    def speedup(self) -> float:
        """The paper's "up to": the larger speed-up over the two baselines."""
        return max(self.speedup_vs.values())

    @property
    def speedup_vs_best_baseline(self) -> float:
        """Speed-up over the faster baseline."""
        return min(self.speedup_vs.values())

    @property
    def ablation(self) -> list[tuple[str, str, float, float]]:
        """(step, label, iteration time, speed-up over the ablation baseline)."""
        base = self.runs["baseline"].time_s
        return [(s, self.runs[s].label, self.runs[s].time_s, base / self.runs[s].time_s)
                for s in ABLATION_ORDER]

    @property
    def deviation(self) -> float:
        """Relative difference of the reproduced speed-up from the paper's."""
        return self.speedup / self.paper - 1.0


@dataclass(frozen=True)
class Reproduction:
    """The whole reproduction: per-model results, assumptions, timing."""

    models: tuple[ModelReproduction, ...]
    cluster: str
    global_batch_size: int
    assumptions: tuple[str, ...]
    seconds: float
    meta: dict = field(default_factory=dict)

    def table(self):
        """pandas DataFrame: one row per model with each system's time and the
        speed-ups next to the paper's."""
        import pandas as pd

        rows = []
        for m in self.models:
            r = {"model": m.model}
            for s in SYSTEM_ORDER:
                r[f"{s}_time_s"] = m.runs[s].time_s
            r["speedup_vs_megatron"] = m.speedup_vs["megatron"]
            r["speedup_vs_deepspeed"] = m.speedup_vs["deepspeed"]
            r["speedup_up_to"] = m.speedup
            for s in FREE_ORDER:
                r[f"{s.replace('-', '_')}_time_s"] = m.runs[s].time_s
                r[f"speedup_vs_{s.replace('-', '_')}"] = m.speedup_vs_free[s]
            r["speedup_vs_free_baselines"] = m.speedup_vs_free_baselines
            r["paper_speedup"] = m.paper
            r["deviation"] = m.deviation
            for s in SYSTEM_ORDER + FREE_ORDER:
                r[f"{s.replace('-', '_')}_config"] = describe(m.runs[s].config)
            rows.append(r)
        return pd.DataFrame(rows)

    def ablation_table(self):
        """pandas DataFrame: model x ablation step -> time and speed-up."""
        import pandas as pd

        return pd.DataFrame([{"model": m.model, "step": s, "label": lab, "time_s": t,
                              "speedup": x, "config": describe(m.runs[s].config)}
                             for m in self.models for s, lab, t, x in m.ablation])

    def explanations(self, threshold: float = 0.15) -> dict[str, str]:
        """Per model whose reproduced speed-up differs from the paper's by more than
        ``threshold``, the explanation from :func:`explain`."""
        return {m.model: explain(m) for m in self.models if abs(m.deviation) > threshold}


def describe(cfg: ParallelConfig) -> str:
    """Short one-line form of a configuration."""
    s = (f"dp{cfg.dp} tp{cfg.tp} pp{cfg.pp} mbs{cfg.micro_batch_size} "
         f"M{cfg.num_microbatches} {cfg.schedule} {cfg.recompute}")
    if cfg.recompute_fractions is not None:
        s += "[" + ",".join(f"{x:.2g}" for x in cfg.recompute_fractions) + "]"
    if cfg.tp_overlap != "none":
        s += " sub-TP"
    if cfg.zero:
        s += " zero1"
    if cfg.sequence_parallel:
        s += " sp"
    return s


def assumptions(cluster: str = "paper-3090", global_batch_size: int = DEFAULT_GLOBAL_BATCH,
                models: tuple[str, ...] = PAPER_MODELS) -> tuple[str, ...]:
    """Every assumption the reproduction rests on (printed with the results)."""
    c = get_cluster(cluster)
    out = [
        f"cluster {c.name}: {c.nodes} nodes x {c.gpus_per_node} {c.gpu.name} "
        f"({c.gpu.memory_bytes / 2**30:.1f} GiB, {c.gpu.peak('bf16') / 1e12:.0f} TFLOP/s "
        f"16-bit peak); intra-node {c.intra.name} {c.intra.bandwidth_Bps / 1e9:.0f} GB/s; "
        f"network {c.inter.name} {c.inter.bandwidth_Bps / 1e9:.1f} GB/s per node",
        *c.notes,
    ]
    for name in models:
        m = get_model(name)
        out.append(f"model {name}: L={m.layers} h={m.hidden} heads={m.heads} "
                   f"seq={m.seq_len} vocab={m.vocab} ({m.total_params() / 1e9:.2f}B params); "
                   f"{m.source}")
    out += [
        f"global batch {global_batch_size} sequences per iteration (not stated by the "
        "paper), bf16 mixed precision with Adam (16 bytes/parameter)",
        "cost model: analytic roofline with the default efficiency curve for the GPU "
        "(no RTX 3090 measurements to calibrate against); uniform layer partition",
        "each system runs at its best configuration found by the planner in its own "
        "search space (degrees, micro-batch size); sequence parallelism off for all "
        "(it postdates the compared systems)",
        "Megatron-LM-like = 1F1B + full recompute + synchronous TP; DeepSpeed-like = "
        "that + ZeRO-1; Merak = shifted critical path + stage-aware recompute (fractions "
        "chosen from the memory model) + sub-pipelined TP (2 parts), ZeRO-1 allowed",
        "paper's 'up to' read as the larger speed-up over the two baselines",
        "free baselines: the same two systems choosing their own recompute among none, "
        "selective and full (and their own degrees and micro-batch size)",
        "iteration times from the SimPy engine with link contention; data-parallel "
        "all-reduce after the backward (no overlap) for every system",
    ]
    return tuple(out)


def reproduce_merak(models: tuple[str, ...] = PAPER_MODELS, cluster: str = "paper-3090",
                    global_batch_size: int = DEFAULT_GLOBAL_BATCH, top_k: int = 2,
                    progress: bool = False, log=None) -> Reproduction:
    """Run the reproduction (module docstring). ``log`` receives progress lines."""

    t0 = time.perf_counter()
    check_models(models)
    out = []
    for name in models:
        runs: dict[str, SystemRun] = {}
        for key in ("megatron", "deepspeed", *FREE_ORDER, "+T1", "+T2", "merak"):
            space = SYSTEMS[key]
            res = search(name, cluster, global_batch_size, space=space, top_k=top_k,
                         progress=progress)
            runs[key] = SystemRun(key, space.name, res.best_config, res.best_result,
                                  dict(res.counts))
            if log:
                log(f"{name}: {space.name}: {res.best_result.iteration_time_s:.3f} s "
                    f"({describe(res.best_config)}; {res.seconds:.1f} s search)")
        # The ablation baseline searches the union of the two baselines' spaces.
        b = min((runs["megatron"], runs["deepspeed"]), key=lambda r: r.time_s)
        runs["baseline"] = SystemRun("baseline", SYSTEMS["baseline"].name, b.config,
                                     b.result, b.counts)
        out.append(ModelReproduction(name, runs, PAPER_SPEEDUPS[name], cluster))
    return Reproduction(tuple(out), cluster, global_batch_size,
                        assumptions(cluster, global_batch_size, models),
                        time.perf_counter() - t0)


def check_models(models) -> None:
    """Raise ValueError (one line) unless every name is a paper model."""
    for name in models:
        if name not in PAPER_SPEEDUPS:
            raise ValueError(f"unknown paper model {name!r}; choose from "
                             f"{', '.join(PAPER_MODELS)}")
    if not models:
        raise ValueError(f"no model given; choose from {', '.join(PAPER_MODELS)}")


def _stage_lines(res, what: str) -> list[float]:
    return [getattr(r, what) for r in res.ranks]


def explain(m: ModelReproduction) -> str:
    """Why the reproduced speed-up differs from the paper's, from the simulations:
    each technique's share (ablation), where the baseline spends its time per stage
    (recompute, bubble, exposed communication) and what Merak's best plan changes."""
    base, merak = m.runs["baseline"], m.runs["merak"]
    steps = m.ablation
    gains = []
    for (_s0, _l0, t0, _x0), (s1, _l1, t1, _x1) in zip(steps, steps[1:], strict=False):
        gains.append((s1, (t0 / t1 - 1) * 100))
    names = {"+T1": "T1 shifted critical path", "+T2": "T2 stage-aware recompute",
             "merak": "T3 sub-pipelined TP"}
    parts = [f"{m.model}: reproduced {m.speedup:.2f}x vs the paper's {m.paper:.2f}x "
             f"({m.deviation:+.0%})."]
    parts.append("Step by step over the better baseline: " + "; ".join(
        f"{names[s]} {g:+.1f} %" for s, g in gains) + ".")
    br = base.result
    T = br.iteration_time_s
    rec = _stage_lines(br, "recompute_s")
    bub = _stage_lines(br, "bubble_s")
    com = _stage_lines(br, "exposed_comm_s")
    smax = max(range(len(rec)), key=lambda i: rec[i])
    parts.append(
        f"The baseline's best plan ({describe(base.config)}) recomputes "
        f"{sum(rec) / len(rec) / T:.0%} of the iteration on average per stage (most on "
        f"stage {smax}: {rec[smax]:.3f} of {T:.3f} s), idles {sum(bub) / len(bub) / T:.0%} "
        f"in bubbles and waits {sum(com) / len(com) / T:.0%} on exposed communication.")
    mr = merak.result
    mrec = _stage_lines(mr, "recompute_s")
    parts.append(
        f"Merak's best plan ({describe(merak.config)}) recomputes "
        f"{sum(mrec) / len(mrec) / mr.iteration_time_s:.0%} per stage on average "
        f"(stage {smax if smax < len(mrec) else len(mrec) - 1}: "
        f"{mrec[min(smax, len(mrec) - 1)]:.3f} s).")
    mc = merak.config
    if mc.tp == 1:
        parts.append("Merak's best plan uses tp=1 (TP all-reduces over PCIe without "
                     "peer-to-peer cost more than the memory they save), so T3 has nothing "
                     "to overlap.")
    elif mc.tp_overlap == "none":
        parts.append(f"Merak's best plan runs tp={mc.tp} with micro-batch "
                     f"{mc.micro_batch_size}, which sub-pipelined TP cannot split (it needs "
                     "an even micro-batch); every plan with an even micro-batch was slower.")
    else:
        parts.append(f"Merak runs tp={mc.tp} with sub-pipelined TP: it hides the TP "
                     "all-reduces but splits every GEMM in two (lower efficiency), which "
                     "the cost model charges.")
    no_rc = _without_recompute(m.model, m.cluster, base.config)
    if no_rc is not None:
        parts.append(
            f"The baseline's own plan with no recomputation at all would take "
            f"{no_rc:.3f} s ({T / no_rc:.2f}x): recompute is the bulk of what Merak "
            "removes here, and it cannot exceed the forward share of the work.")
    if m.deviation < 0:
        parts.append("A larger paper figure implies baselines that lost more than "
                     "simulated here (e.g. slower collectives, less favourable micro-batch "
                     "sizes or degrees than the planner picks for them).")
    else:
        parts.append("The simulated baselines lose more to recompute and bubbles than "
                     "the paper's did.")
    return " ".join(parts)


def _without_recompute(model: str, cluster: str, cfg: ParallelConfig) -> float | None:
    """SimPy time of ``cfg`` with recompute off, or None if it does not fit."""

    d = cfg.to_dict()
    d.update(recompute="none", recompute_fractions=None)
    res = simulate(model, cluster, ParallelConfig.from_dict(d), keep_trace=False)
    return res.iteration_time_s if res.fits_in_memory else None


def hand_configs(model: str, global_batch_size: int = DEFAULT_GLOBAL_BATCH
                 ) -> dict[str, list[ParallelConfig]]:
    """Hand-written configurations per system for the paper models on 64 GPUs (the kind
    a user would try: tp within the 4-GPU node, pp to fit, micro-batch 1-4), used by
    notebook 02 and the planner-quality check (the planner must match or beat them)."""

    shapes = {"gpt-1.5b": [(16, 1, 4), (8, 1, 8), (4, 1, 16)],
              "gpt-2.5b": [(8, 2, 4), (4, 4, 4), (8, 1, 8)],
              "gpt-8.3b": [(2, 4, 8), (4, 2, 8), (1, 4, 16)],
              "gpt-20b": [(1, 4, 16), (2, 4, 8), (1, 2, 32)]}[model]
    out: dict[str, list[ParallelConfig]] = {}
    merak_floor = SCHEDULES[SYSTEMS["merak"].schedules[0]].min_microbatches
    for sys_key in SYSTEM_ORDER:
        sp = SYSTEMS[sys_key]
        cfgs = []
        for dp, tp, pp in shapes:
            for mbs in (1, 2, 4):
                if global_batch_size % (dp * mbs):
                    continue
                M = global_batch_size // (dp * mbs)
                if M < merak_floor(pp):  # every system runs the shapes Merak's can
                    continue
                ov = sp.tp_overlap[0] if (tp > 1 and mbs % 2 == 0) else "none"
                rc = sp.recompute[0]
                cfgs.append(ParallelConfig(
                    dp=dp, tp=tp, pp=pp, micro_batch_size=mbs,
                    global_batch_size=global_batch_size, schedule=sp.schedules[0],
                    recompute=rc, recompute_c0=0.75, tp_overlap=ov,
                    zero=sp.zero[-1] if dp > 1 else 0, attention=sp.attention[0]))
        out[sys_key] = cfgs
    return out
