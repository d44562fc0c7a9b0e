"""Reading measured runs: the runs CSV ``merak-sim calibrate`` documents, vTrain's
published ground-truth files, and merak-exec run folders.

The runs CSV (one run per row; docs/calibrate.md shows an example):

=====================  =========================================================
column                 meaning
=====================  =========================================================
``step_time_s``        measured seconds per training step (required, > 0)
``model``              a model preset name or JSON file; or instead the shape
                       columns ``hidden``, ``heads``, ``layers``, ``seq_len``,
                       ``vocab`` (optional ``family`` gpt | llama | bert,
                       ``ffn_hidden``, ``kv_heads``)
``cluster``            a cluster preset name or JSON file (required)
``nodes``              nodes used (default: the fewest that hold the run's GPUs)
``dp tp pp``           parallel degrees (required)
``micro_batch_size``   samples per micro-batch (required)
``global_batch_size``  samples per step (required)
``schedule``           pipeline schedule (default 1f1b)
``recompute``          none | full | selective (default none)
``dtype``              bf16 | fp16 | fp32 | fp8 (default bf16)
``attention``          auto | flash | unfused (default auto)
``zero cp``            ZeRO stage, context-parallel degree (default 0, 1)
``virtual_stages``     model chunks per pipeline rank (default 1)
``sequence_parallel``  0 / 1 (default 0)
``stack``              the software stack that ran it
                       (:data:`~merak_sim.calibrate.stacks.STACKS`; default default)
=====================  =========================================================

A file whose header is vTrain's (``iteration time (ms)``, ``# GPUs``, ...) is read as
vTrain's data (:mod:`merak_sim.calibrate.vtrain`). Every problem is one line naming
the file, the line and the fix (:class:`~merak_sim.calibrate.measured.RunsError`).
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from merak_sim.calibrate.measured import MeasuredRun, RunsError
from merak_sim.calibrate.stacks import STACKS
from merak_sim.calibrate.vtrain import VTRAIN_COLUMNS, vtrain_runs
from merak_sim.config import ParallelConfig
from merak_sim.hardware import get_cluster
from merak_sim.model import ModelSpec, get_model

__all__ = ["RUN_COLUMNS", "REQUIRED_COLUMNS", "load_runs", "read_csv_runs", "read_run_folder"]

#: Every column of the runs CSV (module docstring).
RUN_COLUMNS = ("step_time_s", "model", "hidden", "heads", "layers", "seq_len", "vocab",
               "family", "ffn_hidden", "kv_heads", "cluster", "nodes", "dp", "tp", "pp",
               "micro_batch_size", "global_batch_size", "schedule", "recompute", "dtype",
               "attention", "zero", "cp", "virtual_stages", "sequence_parallel", "stack")
#: Columns every runs CSV has.
REQUIRED_COLUMNS = ("step_time_s", "cluster", "dp", "tp", "pp", "micro_batch_size",
                    "global_batch_size")
_SHAPE = ("hidden", "heads", "layers", "seq_len", "vocab")
_INTS = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size", "zero", "cp",
         "virtual_stages", "nodes", "hidden", "heads", "layers", "seq_len", "vocab",
         "ffn_hidden", "kv_heads")
_FIX = "the columns are listed in docs/calibrate.md"


def _int(text: str, col: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RunsError(f"{where}: column {col}: {text!r} is not a whole number") from None


def _step_time(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise RunsError(f"{where}: step_time_s {text!r} is not a positive number of "
                        "seconds; give the measured seconds per training step")
    return v


def _model(d: dict[str, str], where: str) -> ModelSpec:
    if d.get("model"):
        return get_model(d["model"])
    missing = [c for c in _SHAPE if not d.get(c)]
    if missing:
        raise RunsError(f"{where}: no model: give a model preset in column model or the "
                        f"shape columns ({', '.join(missing)} missing)")
    n = {c: _int(d[c], c, where) for c in (*_SHAPE, "ffn_hidden", "kv_heads") if d.get(c)}
    return ModelSpec(name=f"h{n['hidden']}-L{n['layers']}", family=d.get("family") or "gpt",
                     dtype=d.get("dtype") or "bf16", source=where, **n)


def _run(d: dict[str, str], where: str) -> MeasuredRun:
    """One CSV row as a MeasuredRun (ValueError from the presets and the configuration
    are turned into one line naming the row by the caller)."""
    ints = {c: _int(d[c], c, where) for c in _INTS if d.get(c)}
    stack = d.get("stack") or "default"
    if stack not in STACKS:
        raise RunsError(f"{where}: unknown stack {stack!r}; choose one of: "
                        f"{', '.join(STACKS)}")
    cfg = ParallelConfig(
        dp=ints["dp"], tp=ints["tp"], pp=ints["pp"], cp=ints.get("cp", 1),
        virtual_stages=ints.get("virtual_stages", 1),
        micro_batch_size=ints["micro_batch_size"],
        global_batch_size=ints["global_batch_size"], schedule=d.get("schedule") or "1f1b",
        recompute=d.get("recompute") or "none", dtype=d.get("dtype") or "bf16",
        attention=d.get("attention") or "auto", zero=ints.get("zero", 0),
        sequence_parallel=(d.get("sequence_parallel") or "0").lower() in ("1", "true", "yes"))
    model = _model(d, where)
    model.check_tp(cfg.tp)
    model.check_pp(cfg.pp, cfg.virtual_stages)
    preset = get_cluster(d["cluster"])
    nodes = ints.get("nodes") or max(1, math.ceil(cfg.world_size / preset.gpus_per_node))
    cluster = preset.with_nodes(nodes)
    if cfg.world_size > cluster.world_size:
        raise RunsError(f"{where}: the run uses {cfg.world_size} GPUs, {nodes} node(s) of "
                        f"{d['cluster']} hold {cluster.world_size}; fix nodes or the degrees")
    return MeasuredRun(where, model, cluster, cfg, _step_time(d["step_time_s"], where), stack)


def read_csv_runs(path: str | Path) -> list[MeasuredRun]:
    """The runs of a runs CSV (module docstring); one-line RunsError on any problem."""
    name = Path(path).name
    try:
        return _read_csv(path, name)
    except csv.Error as e:
        raise RunsError(f"{name}: not a CSV file ({e})") from None
    except UnicodeDecodeError:
        raise RunsError(f"{name}: not UTF-8 text; save the runs CSV as UTF-8") from None


def _read_csv(path: str | Path, name: str) -> list[MeasuredRun]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        unknown = [h for h in header if h not in RUN_COLUMNS]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if not header:
            raise RunsError(f"{name}: empty file; {_FIX}")
        if unknown or missing:
            what = "; ".join(x for x in (unknown and f"unknown column(s) {', '.join(unknown)}",
                                         missing and f"missing column(s) {', '.join(missing)}")
                             if x)
            raise RunsError(f"{name}: {what}; {_FIX}")
        reader.fieldnames = header
        runs = []
        for d in reader:
            where = f"{name}:{reader.line_num}"
            if None in d or any(v is None for v in d.values()):
                raise RunsError(f"{where}: {len(header)} columns in the header, another "
                                "count in this row; one value per column")
            try:
                runs.append(_run({k: v.strip() for k, v in d.items()}, where))
            except RunsError:
                raise
            except (ValueError, OSError) as e:
                raise RunsError(f"{where}: {e}") from None
    if not runs:
        raise RunsError(f"{name}: no runs (a header only); add one row per measured run")
    return runs


def load_runs(path: str | Path) -> list[MeasuredRun]:
    """The runs of one file: vTrain's ground-truth CSV when its header is vTrain's,
    else the runs CSV (module docstring). A missing or unreadable file is one line."""
    p = Path(path)
    if not p.is_file():
        raise RunsError(f"{path}: no such file; give a runs CSV (docs/calibrate.md)")
    try:
        with open(p, "rb") as f:
            # Only the header decides the format; the reader reports bad bytes later.
            first = f.readline().decode("utf-8-sig", errors="replace")
    except OSError as e:
        raise RunsError(f"{path}: cannot read it ({e.strerror or e})") from None
    if set(VTRAIN_COLUMNS) <= {c.strip() for c in first.split(",")}:
        return vtrain_runs(p)
    return read_csv_runs(p)


def _exec_model(d: dict, seq_len: int, where: str) -> ModelSpec:
    """merak-exec's built-in GPT (run.json's ``model``: HF-style GPT-2 settings)."""
    try:
        return ModelSpec(name=f"exec-gpt-h{d['n_embd']}-L{d['n_layer']}", family="gpt",
                         layers=int(d["n_layer"]), hidden=int(d["n_embd"]),
                         heads=int(d["n_head"]), seq_len=seq_len, vocab=int(d["vocab_size"]),
                         max_positions=int(d.get("n_positions", seq_len)),
                         dropout=float(d.get("dropout", 0.0)), source=where)
    except (KeyError, TypeError, ValueError) as e:
        raise RunsError(f"{where}: run.json's model is not merak-exec's GPT ({e})") from None


def read_run_folder(path: str | Path, cluster: str | None = None) -> MeasuredRun:
    """A merak-exec run folder (``merak-run/1``: run.json with the configuration, the
    model and the timed steps) as one run: the median timed step. The cluster is
    ``cluster``, else the one run.json's ``meta`` names, else ``local-cpu`` for a gloo
    run; sized to the run's ranks."""
    from merak_sim.validation.rundir import read_run_files

    run, _events = read_run_files(path)
    where = Path(path).name
    meta = run.get("meta") or {}
    name = cluster or meta.get("cluster") or ("local-cpu" if meta.get("backend") == "gloo"
                                              else None)
    if name is None:
        raise RunsError(f"{where}: run.json names no cluster; pass --cluster NAME")
    wall = [float(w) for w in run.get("wall_s") or []]
    if not wall or min(wall) <= 0:
        raise RunsError(f"{where}: run.json has no positive step times (wall_s)")
    try:
        cfg = ParallelConfig.from_dict(run["config"])
        preset = get_cluster(name)
        clus = preset.with_nodes(max(1, math.ceil(cfg.world_size / preset.gpus_per_node)))
    except (KeyError, TypeError, ValueError) as e:
        raise RunsError(f"{where}: {e}") from None
    model = _exec_model(run.get("model") or {}, int(run.get("seq_len") or 0), where)
    return MeasuredRun(where, model, clus, cfg, statistics.median(wall))
