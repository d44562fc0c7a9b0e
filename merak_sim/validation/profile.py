"""Stage profiles (``merak-stage-profile/1``): combining per-rank and per-step figures.

A stage profile holds, per pipeline stage, the measured seconds of every action kind
(median over the profiled samples under ``<key>_s``, their fastest under
``<key>_min_s``, their mean under ``<key>_mean_s``) and the bytes the stage keeps;
``machine`` holds the point-to-point figures of the machine. The pricing
(:mod:`merak_sim.validation.pricing`) reads these; the measuring side writes them
through :func:`merak_sim.validation.rundir.write_measured`.
"""

from __future__ import annotations

import statistics

__all__ = ["PROFILE_FORMAT", "combine_profiles", "stage_times", "profile_cpu_share"]

PROFILE_FORMAT = "merak-stage-profile/1"

_TIME_KEYS = ("forward_s", "forward_plain_s", "backward_ckpt_s", "backward_s",
              "forward_nograd_s", "reforward_s", "backward_input_s", "backward_weight_s",
              "bare_forward_nograd_s", "all_reduce_s", "optimizer_s", "forward_solo_s",
              "backward_ckpt_solo_s", "backward_solo_s", "forward_nograd_solo_s",
              "reforward_solo_s", "backward_input_solo_s", "backward_weight_solo_s")
_TIME_KEYS = _TIME_KEYS + tuple(k[:-2] + suffix for k in _TIME_KEYS
                                 for suffix in ("_min_s", "_mean_s")) + (
    # paired differences (adding into existing gradients minus fresh): no statistics
    "backward_ckpt_accum_delta_s", "backward_accum_delta_s", "backward_weight_accum_delta_s",
    # the profiled samples' main-thread CPU and wall seconds (their ratio: the CPU share)
    "lockstep_cpu_s", "lockstep_wall_s")


def combine_profiles(profiles: list[dict]) -> dict:
    """One profile from several of the same rank or stage: the mean of each time, the
    fastest of each ``*_min_s``, other entries (bytes, counts) from the first."""
    out = dict(profiles[0])
    for k, v in profiles[0].items():
        if isinstance(v, float) and k.endswith("_min_s"):
            out[k] = min(p[k] for p in profiles)
        elif isinstance(v, float) and k.endswith("_s"):
            out[k] = statistics.fmean(p[k] for p in profiles)
    out["profiles_combined"] = len(profiles)
    return out


def stage_times(group: list[dict]) -> dict:
    """The action times of one stage: the median over the ranks holding it (the time
    keys every rank of ``group`` has)."""
    return {k: statistics.median(g[k] for g in group) for k in _TIME_KEYS
            if all(k in g for g in group)}


def profile_cpu_share(profile: dict) -> float:
    """Main-thread CPU seconds over wall seconds of the profile's samples timed with all
    ranks busy, over every stage (NaN for profiles that did not record it): the share
    the actions got while profiled, to hold against the run's
    (:func:`merak_sim.validation.measured.cpu_shares`)."""
    st = profile.get("stages", [])
    wall = sum(x.get("lockstep_wall_s", 0.0) for x in st)
    return sum(x.get("lockstep_cpu_s", 0.0) for x in st) / wall if wall > 0 else float("nan")
