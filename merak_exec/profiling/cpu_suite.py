"""The CPU validation suite: its configurations and targets.

Shared by ``benchmarks/cpu_validation.py`` (the suite) and
``benchmarks/speedup_repeats.py`` (the baseline / Merak pair measured again and again).
"""

from __future__ import annotations

from merak_exec.profiling.cases import Case, small_gpt

__all__ = ["BASELINE", "MERAK", "SPEEDUP_GAP_POINTS", "TARGETS", "suite"]

TARGETS = {"iteration_median_abs_error": 0.05, "iteration_worst_abs_error": 0.10,
           "action_median_abs_error": 0.10, "activation_worst_abs_error": 0.03}
SPEEDUP_GAP_POINTS = 5  # simulated and measured speed-up agree within this
BASELINE, MERAK = "pp2-1f1b-full", "pp2-scp-stage-aware"


def suite(quick: bool = False, pairs: int = 3) -> list[Case]:
    """The validation configurations (``quick``: a smaller GPT and fewer cases;
    ``pairs``: how many baseline / Merak pairs, the first one among the distinct
    configurations, the others repeats named ``~1``, ``~2``, ...)."""
    m = small_gpt(layers=4, hidden=64, seq=64) if quick else small_gpt()
    base = dict(micro_batch_size=2, global_batch_size=8, dtype="fp32")

    def pp(sched, rec):
        return dict(base, pp=2, schedule=sched, recompute=rec)
    cases = [Case("pp2-1f1b-none", pp("1f1b", "none"), m),
             Case(BASELINE, pp("1f1b", "full"), m),
             Case(MERAK, pp("shifted-critical-path", "stage-aware"), m)]
    if quick:
        return cases
    # Repeated baseline / Merak pairs: the speed-up is the median over pairs measured
    # back to back, which is less exposed to the machine's load drifting.
    repeats = [Case(f"{n}~{i}", c.config, m) for i in range(1, pairs) for n, c in
               ((BASELINE, cases[1]), (MERAK, cases[2]))]
    return cases + repeats + [
        Case("pp2-gpipe-none", pp("gpipe", "none"), m),
        Case("pp2-zbh1-none", pp("1f1b-split", "none"), m),  # named before the split was renamed
        Case("pp2-1f1b-stage-aware", pp("1f1b", "stage-aware"), m),
        Case("tp2-plain", dict(base, tp=2), m),
        Case("tp2-sub-pipelined", dict(base, tp=2, tp_overlap="sub-pipelined"), m),
        Case("dp2", dict(base, dp=2), m),
    ]
