"""The profiled-trace format ``merak-trace/1``: dataclasses, reader, writer, validation.

A trace is one JSON object::

    {
      "format": "merak-trace/1",
      "provenance": {"device": "cpu (2-core AMD EPYC)", "dtype": "fp32",
                     "torch": "2.13.0", "git_commit": "abc123", "command": "...",
                     "date": "2026-11-30T16:00:00Z", "notes": "..."},
      "model": {ModelSpec fields: family, layers, hidden, heads, seq_len, vocab, ...},
      "layers": [
        {"kind": "block", "micro_batch_size": 2, "seq_len": 128, "tp": 1,
         "forward_s": 0.0012, "backward_s": 0.0025, "recompute_s": 0.0012,
         "backward_input_s": null, "backward_weight_s": null,
         "activation_bytes": 1048576, "param_bytes": 4723712,
         "repeats": 20, "forward_std_s": 0.0001, "backward_std_s": 0.0002},
        ...
      ],
      "collectives": [
        {"collective": "all-reduce", "group_size": 2, "placement": "intra",
         "bytes": 4194304, "seconds": 0.0035},
        ...
      ]
    }

``kind`` is "embedding", "block" (one transformer layer) or "head" (final norm + LM
head + loss). Times are seconds of one pass on one device for one micro-batch
(median of ``repeats``); ``recompute_s`` is the re-forward of a checkpointed layer
(with grad enabled); bytes are per device. ``backward_input_s`` / ``backward_weight_s``
may be null when the profiler did not split the backward. ``placement`` says whether
the group sat in one node ("intra") or spanned nodes ("inter").

The reader rejects other versions and malformed files with a one-line
:class:`TraceError` naming the file, the field and the value. The real backend's
profiler (``merak-exec profile``) writes this format.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any

from merak_sim.io import atomic_write_text
from merak_sim.model import ModelSpec, ModelSpecError

__all__ = ["TRACE_FORMAT", "LAYER_KINDS", "TraceError", "Provenance", "LayerRecord",
           "from_exec_profile", "merge_traces",
           "CollectiveRecord", "Trace", "read_trace", "write_trace"]

TRACE_FORMAT = "merak-trace/1"
LAYER_KINDS = ("embedding", "block", "head")
PLACEMENTS = ("intra", "inter")
_COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "p2p")


class TraceError(ValueError):
    """A trace file is of another version or malformed (one line: file, field, value)."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where and how a trace was measured."""

    device: str
    dtype: str
    torch: str
    git_commit: str
    command: str
    date: str
    notes: str = ""


@dataclass(frozen=True, slots=True)
class LayerRecord:
    """Measured costs of one layer kind at one (micro-batch size, sequence, tp)."""

    kind: str
    micro_batch_size: int
    seq_len: int
    forward_s: float
    backward_s: float
    recompute_s: float
    activation_bytes: float
    param_bytes: float
    tp: int = 1
    backward_input_s: float | None = None
    backward_weight_s: float | None = None
    repeats: int = 1
    forward_std_s: float | None = None
    backward_std_s: float | None = None

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(kind, tp, seq_len, micro_batch_size)."""
        return (self.kind, self.tp, self.seq_len, self.micro_batch_size)


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """Measured time of one collective size on one group shape."""

    collective: str
    group_size: int
    placement: str
    bytes: float
    seconds: float


@dataclass(frozen=True)
class Trace:
    """A whole ``merak-trace/1`` file."""

    provenance: Provenance
    model: ModelSpec
    layers: tuple[LayerRecord, ...]
    collectives: tuple[CollectiveRecord, ...] = ()
    format: str = TRACE_FORMAT

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "format": self.format,
            "provenance": asdict(self.provenance),
            "model": self.model.to_dict(),
            "layers": [asdict(r) for r in self.layers],
            "collectives": [asdict(c) for c in self.collectives],
        }

    def to_json(self) -> str:
        """Pretty JSON text."""
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @staticmethod
    def from_dict(d: Any, where: str = "trace") -> Trace:
        """Validate and build; :class:`TraceError` names ``where`` and the field."""
        if not isinstance(d, dict):
            raise TraceError(f"{where}: top level must be a JSON object")
        fmt = d.get("format")
        if fmt != TRACE_FORMAT:
            raise TraceError(f"{where}: format {fmt!r} is not supported; this reader "
                             f"understands {TRACE_FORMAT!r}")
        for k in ("provenance", "model", "layers"):
            if k not in d:
                raise TraceError(f"{where}: missing field '{k}'")
        prov = _build(Provenance, d["provenance"], f"{where}: provenance", _PROV_TYPES)
        try:
            model = ModelSpec.from_json(d["model"]) if isinstance(d["model"], dict) else None
        except ModelSpecError as e:
            raise TraceError(f"{where}: model: {e}") from None
        if model is None:
            raise TraceError(f"{where}: field 'model' must be an object")
        if not isinstance(d["layers"], list) or not d["layers"]:
            raise TraceError(f"{where}: field 'layers' must be a non-empty list")
        layers = tuple(_layer(x, f"{where}: layers[{i}]") for i, x in enumerate(d["layers"]))
        seen: set = set()
        for i, r in enumerate(layers):
            if r.key in seen:
                raise TraceError(f"{where}: layers[{i}] duplicates kind={r.kind} tp={r.tp} "
                                 f"seq_len={r.seq_len} micro_batch_size={r.micro_batch_size}")
            seen.add(r.key)
        colls_raw = d.get("collectives", [])
        if not isinstance(colls_raw, list):
            raise TraceError(f"{where}: field 'collectives' must be a list")
        colls = tuple(_coll(x, f"{where}: collectives[{i}]") for i, x in enumerate(colls_raw))
        unknown = sorted(set(d) - {"format", "provenance", "model", "layers", "collectives"})
        if unknown:
            raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)}")
        return Trace(prov, model, layers, colls)


_PROV_TYPES = {k: str for k in Provenance.__dataclass_fields__}
_NUM = (int, float)
_LAYER_TYPES: dict[str, Any] = {
    "kind": str, "micro_batch_size": int, "seq_len": int, "tp": int, "forward_s": _NUM,
    "backward_s": _NUM, "recompute_s": _NUM, "activation_bytes": _NUM, "param_bytes": _NUM,
    "backward_input_s": (*_NUM, type(None)), "backward_weight_s": (*_NUM, type(None)),
    "repeats": int, "forward_std_s": (*_NUM, type(None)),
    "backward_std_s": (*_NUM, type(None)),
}
_COLL_TYPES: dict[str, Any] = {"collective": str, "group_size": int, "placement": str,
                               "bytes": _NUM, "seconds": _NUM}


def _build(cls: type, d: Any, where: str, types: dict[str, Any]) -> Any:
    if not isinstance(d, dict):
        raise TraceError(f"{where} must be an object")
    fields_ = cls.__dataclass_fields__
    for name, f in fields_.items():
        required = f.default is MISSING and f.default_factory is MISSING
        if name not in d:
            if required:
                raise TraceError(f"{where}: missing field '{name}'")
            continue
        v = d[name]
        t = types[name]
        if isinstance(v, bool) or not isinstance(v, t):
            raise TraceError(f"{where}: field '{name}' has wrong type: {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(f"{where}: field '{name}' must be finite, got {v!r}")
    unknown = sorted(set(d) - set(fields_))
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return cls(**d)


def _layer(d: Any, where: str) -> LayerRecord:
    r = _build(LayerRecord, d, where, _LAYER_TYPES)
    if r.kind not in LAYER_KINDS:
        raise TraceError(f"{where}: kind {r.kind!r} unknown; expected one of "
                         f"{', '.join(LAYER_KINDS)}")
    for name in ("micro_batch_size", "seq_len", "tp", "repeats"):
        if getattr(r, name) < 1:
            raise TraceError(f"{where}: field '{name}' must be >= 1, got {getattr(r, name)}")
    for name in ("forward_s", "backward_s", "recompute_s", "activation_bytes", "param_bytes",
                 "backward_input_s", "backward_weight_s"):
        v = getattr(r, name)
        if v is not None and v < 0:
            raise TraceError(f"{where}: field '{name}' must be >= 0, got {v}")
    return r


def _coll(d: Any, where: str) -> CollectiveRecord:
    c = _build(CollectiveRecord, d, where, _COLL_TYPES)
    if c.collective not in _COLLECTIVES:
        raise TraceError(f"{where}: collective {c.collective!r} unknown; expected one of "
                         f"{', '.join(_COLLECTIVES)}")
    if c.placement not in PLACEMENTS:
        raise TraceError(f"{where}: placement {c.placement!r} unknown; expected intra or inter")
    if c.group_size < 2 or c.bytes < 0 or c.seconds < 0:
        raise TraceError(f"{where}: needs group_size >= 2 and non-negative bytes/seconds, "
                         f"got {c.group_size}, {c.bytes}, {c.seconds}")
    return c


def read_trace(path: str | Path) -> Trace:
    """Read and validate a trace file (:class:`TraceError` on any problem)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{p}: cannot read trace file: {e.strerror}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return Trace.from_dict(d, str(p))


def write_trace(trace: Trace, path: str | Path) -> None:
    """Validate (by round-tripping) and write atomically."""
    Trace.from_dict(json.loads(trace.to_json()), str(path))
    atomic_write_text(path, trace.to_json())


_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def from_exec_profile(data: dict) -> dict:
    """Convert merak_exec's profiler output (``merak-exec-profile/1`` dict) into a
    ``merak-trace/1`` dict (validated); merak_exec.profiling.layer_trace.write_trace
    calls this.

    Model shape comes from ``data["model"]`` (family, hidden, layers, vocab) and its
    ``config`` (heads as n_head / num_attention_heads, kv heads, ffn size, dropout,
    positions); timing fields map one to one. Raises :class:`TraceError` naming the
    missing field.
    """
    where = "exec profile"
    try:
        m = data["model"]
        cfg = m.get("config", {}) or {}
        mbs, seq = int(data["micro_batch_size"]), int(data["seq_len"])
        meta = data.get("meta", {}) or {}
        rows = data["layers"]
    except (KeyError, TypeError, AttributeError) as e:
        raise TraceError(f"{where}: missing field {e}") from None

    def pick(*keys, default=None):
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return default

    fam = str(m.get("family", "gpt")).lower()
    family = "llama" if "llama" in fam else "bert" if "bert" in fam else "gpt"
    h = int(m["hidden"]) if "hidden" in m else int(pick("n_embd", "hidden_size", default=0))
    heads = pick("n_head", "num_attention_heads")
    if heads is None:
        raise TraceError(f"{where}: model config lacks the head count (n_head or "
                         "num_attention_heads)")
    ffn = pick("ffn_hidden", "n_inner", "intermediate_size")
    if ffn is None and pick("ffn_mult") is not None:
        ffn = int(pick("ffn_mult")) * h
    model = {
        "name": str(m.get("name", cfg.get("model_type", "profiled"))), "family": family,
        "layers": int(m.get("layers", pick("n_layer", "num_hidden_layers", default=1))),
        "hidden": h, "heads": int(heads), "seq_len": seq,
        "vocab": int(m.get("vocab", pick("vocab_size", default=0))),
        "ffn_hidden": int(ffn or 0), "kv_heads": int(pick("num_key_value_heads", default=0)),
        "dropout": float(pick("dropout", "resid_pdrop", "hidden_dropout_prob", default=0.0)),
        "dtype": _TORCH_DTYPES.get(str(data.get("dtype", "float32")), "fp32"),
    }
    pos = pick("n_positions", "max_position_embeddings")
    if family != "llama" and pos is not None:
        model["max_positions"] = int(pos)
    date = meta.get("date")
    if date is None and "created_unix_s" in meta:
        import datetime as _dt
        date = _dt.datetime.fromtimestamp(int(meta["created_unix_s"]), _dt.UTC) \
            .strftime("%Y-%m-%dT%H:%M:%SZ")
    prov = {"device": str(data.get("device", "unknown")), "dtype": model["dtype"],
            "torch": str(meta.get("torch", "unknown")),
            "git_commit": str(meta.get("git_commit", "unknown")),
            "command": str(meta.get("command",
                                    "merak_exec.profiling.layer_trace.profile_chain")),
            "date": str(date or "unknown"),
            "notes": f"converted from {data.get('format', 'merak-exec-profile')}; "
                     f"threads={meta.get('threads', '?')}, statistic="
                     f"{meta.get('statistic', 'median')}"}
    layers = []
    for i, r in enumerate(rows):
        try:
            layers.append({
                "kind": r["name"], "micro_batch_size": mbs, "seq_len": seq,
                "tp": int(meta.get("tp", 1)), "forward_s": r["forward_s"],
                "backward_s": r["backward_s"], "recompute_s": r["recompute_s"],
                "backward_input_s": r.get("backward_input_s"),
                "backward_weight_s": r.get("backward_weight_s"),
                "activation_bytes": r["activation_bytes"], "param_bytes": r["param_bytes"],
                "repeats": int(meta.get("repeats", 1)),
            })
        except (KeyError, TypeError) as e:
            raise TraceError(f"{where}: layers[{i}] missing field {e}") from None
    out = {"format": TRACE_FORMAT, "provenance": prov, "model": model, "layers": layers,
           "collectives": []}
    Trace.from_dict(out, where)  # validate now: a bad profile fails here, not at read
    return out


def merge_traces(traces: list[Trace]) -> Trace:
    """One trace holding the layer records of several traces of the same model shape
    (e.g. one profile per micro-batch size); provenance of the first, noted."""
    if not traces:
        raise TraceError("merge_traces needs at least one trace")
    first = traces[0]
    layers: dict = {}
    colls = []
    for t in traces:
        if (t.model.hidden, t.model.heads, t.model.ffn_hidden, t.model.family) != \
                (first.model.hidden, first.model.heads, first.model.ffn_hidden,
                 first.model.family):
            raise TraceError(f"cannot merge traces of different model shapes: "
                             f"{first.model.name} and {t.model.name}")
        for r in t.layers:
            layers[r.key] = r
        colls.extend(t.collectives)
    return Trace(first.provenance, first.model, tuple(layers.values()), tuple(colls))
