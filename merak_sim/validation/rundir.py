"""Run directories (``merak-run/1``): a measured run plus the profile of its machine.

A measured run is kept in a directory of plain files::

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
is written atomically. The functions here work on plain data (dicts and lists), so
the backend's ``RunResult.save`` / ``RunResult.load`` use them without this package
knowing the backend: :func:`save_result` and :func:`load_result`.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merak_sim.io import atomic_write_text
from merak_sim.timeline import EVENT_COLUMNS
from merak_sim.validation.profile import PROFILE_FORMAT, stage_times

__all__ = ["RUN_FORMAT", "RunDirError", "MeasuredRun", "read_run",
           "read_run_files", "write_run", "write_measured", "save_result", "load_result"]

RUN_FORMAT = "merak-run/1"
_INT_COLS = {"rank", "stage", "chunk", "microbatch", "step"}
_FLOAT_COLS = {"start_s", "end_s", "bytes"}
# run.json fields a RunResult keeps in its ``meta`` (the rest of run.json's own "meta"
# there too); wall_s and losses are its step_times_s and losses.
_META_FIELDS = ("config", "model", "seq_len", "memory", "step_block", "cpu_s")


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
            core (see :func:`merak_sim.validation.measured.cpu_shares`).
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


# -- writing -----------------------------------------------------------------------------
def _events_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[*EVENT_COLUMNS, "step"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r[k] for k in (*EVENT_COLUMNS, "step")})
    return buf.getvalue()


def write_run(path: str | Path, run: dict, events: list[dict],
              profile: dict | None = None) -> Path:
    """Write a run directory from its parts (run.json body without ``format``; event
    rows with ``step``; the profile, if there is one)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p / "run.json", json.dumps({"format": RUN_FORMAT, **run}, indent=1))
    atomic_write_text(p / "events.csv", _events_csv(events))
    if profile is not None:
        atomic_write_text(p / "profile.json", json.dumps(profile, indent=1))
    return p


def save_result(path: str | Path, events: list[dict], step_times_s: list[float],
                losses: list[float], meta: dict, profile: dict | None = None) -> Path:
    """Write a gathered run's fields (those of the backend's ``RunResult``) as a run
    directory. ``meta`` entries named like run.json fields (config, model, seq_len,
    memory, step_block, cpu_s) become those fields, the rest run.json's ``meta``;
    events without a ``step`` are written as the last iteration's."""
    last = max(0, len(step_times_s) - 1)
    run = {k: meta[k] for k in _META_FIELDS if k in meta}
    run.update(wall_s=list(step_times_s), losses=list(losses),
               meta={k: v for k, v in meta.items() if k not in _META_FIELDS})
    rows = [e if "step" in e else {**e, "step": last} for e in events]
    return write_run(path, run, rows, profile)


# -- reading -----------------------------------------------------------------------------
def _read_json(path: Path, missing: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(missing) from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}") from None


def _parse_row(r: dict) -> dict[str, Any]:
    return {k: int(r[k]) if k in _INT_COLS else float(r[k]) if k in _FLOAT_COLS else r[k]
            for k in (*EVENT_COLUMNS, "step")}


def _read_events(p: Path) -> list[dict]:
    try:
        text = (p / "events.csv").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunDirError(f"{p} has no events.csv") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = {*EVENT_COLUMNS, "step"} - set(reader.fieldnames or [])
    if missing:
        raise RunDirError(f"{p / 'events.csv'} lacks column(s) {', '.join(sorted(missing))}")
    rows = []
    for i, r in enumerate(reader, start=2):
        try:
            rows.append(_parse_row(r))
        except (TypeError, ValueError):
            raise RunDirError(f"{p / 'events.csv'} line {i}: bad value {r!r}") from None
    if not rows:
        raise RunDirError(f"{p / 'events.csv'} has no events")
    return rows


def _read_run_json(p: Path) -> dict:
    if not p.is_dir():
        raise RunDirError(f"run directory {p} does not exist; measure one with "
                          "benchmarks/cpu_validation.py (merak_exec.profiling)")
    run = _read_json(p / "run.json", f"{p} has no run.json; it is not a merak-run/1 "
                     "directory")
    if run.get("format") != RUN_FORMAT:
        raise RunDirError(f"{p / 'run.json'} has format {run.get('format')!r}; expected "
                          f"{RUN_FORMAT!r}")
    return run


def _read_profile(path: Path) -> dict:
    prof = _read_json(path, f"profile {path} does not exist")
    if prof.get("format") != PROFILE_FORMAT:
        raise RunDirError(f"{path} has format {prof.get('format')!r}; expected "
                          f"{PROFILE_FORMAT!r}")
    return prof


def read_run_files(path: str | Path) -> tuple[dict, list[dict]]:
    """The run.json body (format checked) and the event rows (typed, with ``step``) of
    a run directory; the profile is not read."""
    p = Path(path)
    return _read_run_json(p), _read_events(p)


def read_run(path: str | Path, profile: str | Path | None = None) -> MeasuredRun:
    """Read a run directory (and optionally another profile file)."""
    p = Path(path)
    run = _read_run_json(p)
    for k in ("config", "model", "seq_len", "wall_s", "memory"):
        if k not in run:
            raise RunDirError(f"{p / 'run.json'} lacks field {k!r}")
    prof = _read_profile(Path(profile) if profile is not None else p / "profile.json")
    return MeasuredRun(path=p, config=run["config"], model=run["model"],
                       seq_len=int(run["seq_len"]), events=_read_events(p),
                       wall_s=[float(x) for x in run["wall_s"]],
                       losses=[float(x) for x in run.get("losses", [])],
                       memory=list(run["memory"]), profile=prof, meta=run.get("meta", {}),
                       step_block=tuple(int(b) for b in run.get("step_block", ())),
                       cpu_s=tuple(tuple(float(x) for x in r) for r in run.get("cpu_s", ())))


def load_result(path: str | Path) -> dict:
    """A run directory as the fields of the backend's ``RunResult`` (``events`` with
    their ``step``, ``step_times_s``, ``losses``, ``meta``: the inverse of
    :func:`save_result`); the profile, if any, is left in the directory."""
    run, rows = read_run_files(path)
    meta = {**run.get("meta", {}), **{k: run[k] for k in _META_FIELDS if k in run}}
    return {"events": rows, "step_times_s": [float(x) for x in run.get("wall_s", [])],
            "losses": [float(x) for x in run.get("losses", [])], "meta": meta}


# -- the validation measurement's run directory -------------------------------------------
def _aligned_events(ranks: list[dict]) -> list[dict]:
    """Every rank's events of each iteration on one clock: times from the iteration's
    earliest rank origin."""
    events = []
    for k in range(len(ranks[0]["origins"])):
        origin = min(r["origins"][k] for r in ranks)
        for r in ranks:
            shift = r["origins"][k] - origin
            events += [dict(e, start_s=e["start_s"] + shift, end_s=e["end_s"] + shift)
                       for e in r["events"] if e["step"] == k]
    return events


def _stage_profile(ranks: list[dict], machine: dict, opts: dict) -> dict:
    """The stage profile: per stage the median over the ranks holding it (other
    entries from the stage's first rank), and per profiler step its samples."""
    pp = max(r["pp_rank"] for r in ranks) + 1
    stages = []
    for s in range(pp):
        st = stage_times([r["profile"] for r in ranks if r["pp_rank"] == s])
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
            {"stages": [stage_times([r["profile_samples"][k] for r in ranks
                                     if r["pp_rank"] == s]) for s in range(pp)]}
            for k in range(n_samples)]
    return profile


def write_measured(path: str | Path, res: dict, machine: dict, opts: dict) -> Path:
    """Write the run directory from the gathered per-rank measurements of the
    validation measurement (events aligned to one clock per iteration; stage profile
    = median over the ranks holding the stage)."""
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    memory = [{"rank": r["rank"], "pp_rank": r["pp_rank"], **r["memory"]} for r in ranks]
    run = {"config": res["config"], "model": res["model"], "seq_len": res["seq_len"],
           "wall_s": ranks[0]["wall_s"], "losses": ranks[0]["losses"], "memory": memory,
           "step_block": ranks[0].get("step_block", []),
           "cpu_s": [r.get("cpu_s", []) for r in ranks],
           "meta": {"world": len(ranks), "backend": opts.get("backend", "gloo"),
                    "threads_per_rank": 1}}
    return write_run(path, run, _aligned_events(ranks), _stage_profile(ranks, machine, opts))
