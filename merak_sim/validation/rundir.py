"""Run directories (``merak-run/1``): a measured run plus the profile of its machine.

merak_exec's :class:`~merak_exec.result.RunResult` has no save/load, so the validation
loop keeps a measured run in a directory of plain files::

    RUNDIR/
      run.json      {"format": "merak-run/1", "config": ParallelConfig dict,
                     "model": built-in GPT settings, "seq_len": int,
                     "wall_s": [per timed iteration, rank 0's clock],
                     "losses": [...], "memory": [per global rank: activation_peak_bytes,
                     param_bytes, grad_bytes, optimizer_bytes, pp_rank],
                     "step_block": [per timed iteration: the block of iterations it
                     ran in (optional)], "cpu_s": [per global rank: per timed
                     iteration, the CPU seconds of its main thread (optional)],
                     "meta": {...}}
      events.csv    the events of every timed iteration, columns EVENT_COLUMNS + step,
                    times in seconds from that iteration's earliest rank origin (one
                    clock for all ranks)
      profile.json  {"format": "merak-stage-profile/1", "stages": [per pipeline stage:
                     measured action seconds and kept bytes], "machine": {gloo p2p
                     alpha/beta, contention factor, ...}, "ranks": raw per-rank figures,
                     "samples": [optional, per profiler step k: {"stages": [the action
                     times of that step alone]}; block b ran between steps b and b+1]}

``profile.json`` is what the validation prices the configuration from; it can be
replaced by a profile from elsewhere (``merak-sim validate --profile``). Every file
is written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merak_sim.io import atomic_write_text

__all__ = ["RUN_FORMAT", "PROFILE_FORMAT", "RunDirError", "MeasuredRun", "read_run",
           "write_run", "write_measured", "combine_profiles", "EVENT_COLUMNS"]

RUN_FORMAT = "merak-run/1"
PROFILE_FORMAT = "merak-stage-profile/1"
EVENT_COLUMNS = ("rank", "stage", "chunk", "stream", "kind", "action", "microbatch",
                 "start_s", "end_s", "bytes")
_INT_COLS = {"rank", "stage", "chunk", "microbatch", "step"}
_FLOAT_COLS = {"start_s", "end_s", "bytes"}


class RunDirError(ValueError):
    """A run directory is missing, of another version or malformed (one line)."""


@dataclass(frozen=True)
class MeasuredRun:
    """A measured run as read from a run directory.

    Attributes:
        path: the directory.
        config: ParallelConfig dict.
        model: model settings (built-in GPT fields).
        seq_len: sequence length.
        events: rows (dicts) in :data:`EVENT_COLUMNS` plus ``step``.
        wall_s: wall time of each timed iteration.
        losses: loss of each timed iteration.
        memory: per global rank, measured bytes (see module docstring).
        profile: the ``merak-stage-profile/1`` dict.
        meta: free-form provenance.
        step_block: per timed iteration, the block of iterations it ran in (empty
            for run directories written before blocks were recorded).
        cpu_s: per global rank, per timed iteration, the CPU seconds of the rank's
            main thread during the iteration (empty for older run directories);
            compared with its busy time it shows when other work took the rank's
            core (see :func:`merak_sim.validation.cpu_shares`).
    """

    path: Path
    config: dict
    model: dict
    seq_len: int
    events: list[dict]
    wall_s: list[float]
    losses: list[float]
    memory: list[dict]
    profile: dict
    meta: dict = field(default_factory=dict)
    step_block: tuple[int, ...] = ()
    cpu_s: tuple[tuple[float, ...], ...] = ()

    def events_frame(self, step: int | None = None):
        """Events as a DataFrame (one step, or all with a ``step`` column)."""
        import pandas as pd

        df = pd.DataFrame(self.events, columns=[*EVENT_COLUMNS, "step"])
        if step is not None:
            df = df[df["step"] == step].drop(columns="step").reset_index(drop=True)
        return df

    @property
    def steps(self) -> list[int]:
        """Indices of the timed iterations."""
        return sorted({int(e["step"]) for e in self.events})


def _events_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[*EVENT_COLUMNS, "step"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r[k] for k in (*EVENT_COLUMNS, "step")})
    return buf.getvalue()


def write_run(path: str | Path, run: dict, events: list[dict], profile: dict) -> Path:
    """Write a run directory from its three parts (run.json body without ``format``)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p / "run.json", json.dumps({"format": RUN_FORMAT, **run}, indent=1))
    atomic_write_text(p / "events.csv", _events_csv(events))
    atomic_write_text(p / "profile.json", json.dumps(profile, indent=1))
    return p


def read_run(path: str | Path, profile: str | Path | None = None) -> MeasuredRun:
    """Read a run directory (and optionally another profile file)."""
    p = Path(path)
    if not p.is_dir():
        raise RunDirError(f"run directory {p} does not exist; measure one with "
                          "benchmarks/cpu_validation.py or merak_sim.validation_measure")
    try:
        run = json.loads((p / "run.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{p} has no run.json; it is not a merak-run/1 directory") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{p / 'run.json'} is not valid JSON: {e.msg} at line "
                          f"{e.lineno}") from None
    if run.get("format") != RUN_FORMAT:
        raise RunDirError(f"{p / 'run.json'} has format {run.get('format')!r}; expected "
                          f"{RUN_FORMAT!r}")
    for k in ("config", "model", "seq_len", "wall_s", "memory"):
        if k not in run:
            raise RunDirError(f"{p / 'run.json'} lacks field {k!r}")
    prof_path = Path(profile) if profile is not None else p / "profile.json"
    try:
        prof = json.loads(prof_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"profile {prof_path} does not exist") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{prof_path} is not valid JSON: {e.msg}") from None
    if prof.get("format") != PROFILE_FORMAT:
        raise RunDirError(f"{prof_path} has format {prof.get('format')!r}; expected "
                          f"{PROFILE_FORMAT!r}")
    try:
        text = (p / "events.csv").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(f"{p} has no events.csv") from None
    rows = []
    reader = csv.DictReader(io.StringIO(text))
    missing = {*EVENT_COLUMNS, "step"} - set(reader.fieldnames or [])
    if missing:
        raise RunDirError(f"{p / 'events.csv'} lacks column(s) {', '.join(sorted(missing))}")
    for i, r in enumerate(reader, start=2):
        try:
            row: dict[str, Any] = {}
            for k in (*EVENT_COLUMNS, "step"):
                v = r[k]
                row[k] = int(v) if k in _INT_COLS else float(v) if k in _FLOAT_COLS else v
        except (TypeError, ValueError):
            raise RunDirError(f"{p / 'events.csv'} line {i}: bad value {r!r}") from None
        rows.append(row)
    if not rows:
        raise RunDirError(f"{p / 'events.csv'} has no events")
    return MeasuredRun(path=p, config=run["config"], model=run["model"],
                       seq_len=int(run["seq_len"]), events=rows,
                       wall_s=[float(x) for x in run["wall_s"]],
                       losses=[float(x) for x in run.get("losses", [])],
                       memory=list(run["memory"]), profile=prof, meta=run.get("meta", {}),
                       step_block=tuple(int(b) for b in run.get("step_block", ())),
                       cpu_s=tuple(tuple(float(x) for x in r) for r in run.get("cpu_s", ())))


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


def _stage_times(group: list[dict]) -> dict:
    """The action times of one stage: the median over the ranks holding it."""
    return {k: statistics.median(g[k] for g in group) for k in _TIME_KEYS
            if all(k in g for g in group)}


def write_measured(path: str | Path, res: dict, machine: dict, opts: dict) -> Path:
    """Write the run directory from the gathered per-rank measurements of
    :mod:`merak_sim.validation_measure` (events aligned to one clock per iteration;
    stage profile = median over the ranks holding the stage)."""
    import platform
    import time

    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    n_steps = len(ranks[0]["origins"])
    events = []
    for k in range(n_steps):
        origin = min(r["origins"][k] for r in ranks)
        for r in ranks:
            shift = r["origins"][k] - origin
            for e in r["events"]:
                if e["step"] == k:
                    events.append(dict(e, start_s=e["start_s"] + shift,
                                       end_s=e["end_s"] + shift))
    pp = max(r["pp_rank"] for r in ranks) + 1
    stages = []
    for s in range(pp):
        group = [r["profile"] for r in ranks if r["pp_rank"] == s]
        st = _stage_times(group)
        first = next(r["profile"] for r in ranks if r["pp_rank"] == s)
        for k, v in first.items():
            st.setdefault(k, v)
        stages.append(st)
    profile = {"format": PROFILE_FORMAT, "stages": stages, "machine": machine,
               "ranks": [{"rank": r["rank"], "pp_rank": r["pp_rank"], **r["profile"]}
                         for r in ranks],
               "provenance": {"host": platform.node(), "options": opts,
                              "date_unix_s": int(time.time())}}
    n_samples = min(len(r.get("profile_samples", [])) for r in ranks)
    if n_samples:
        profile["samples"] = [
            {"stages": [_stage_times([r["profile_samples"][k] for r in ranks
                                      if r["pp_rank"] == s]) for s in range(pp)]}
            for k in range(n_samples)]
    memory = [{"rank": r["rank"], "pp_rank": r["pp_rank"], **r["memory"]} for r in ranks]
    run = {"config": res["config"], "model": res["model"], "seq_len": res["seq_len"],
           "wall_s": ranks[0]["wall_s"], "losses": ranks[0]["losses"], "memory": memory,
           "step_block": ranks[0].get("step_block", []),
           "cpu_s": [r.get("cpu_s", []) for r in ranks],
           "meta": {"world": len(ranks), "backend": opts.get("backend", "gloo"),
                    "threads_per_rank": 1}}
    return write_run(path, run, events, profile)
