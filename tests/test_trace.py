"""merak-trace/1: round trip, shipped trace, rejection of malformed files, exec profiles."""

import copy
import json
from pathlib import Path

import pytest

from merak_sim.model import get_model
from merak_sim.trace import (
    TRACE_FORMAT,
    CollectiveRecord,
    LayerRecord,
    Provenance,
    Trace,
    TraceError,
    from_exec_profile,
    merge_traces,
    read_trace,
    write_trace,
)

SHIPPED = Path(__file__).resolve().parents[1] / "traces" / "cpu-gpt-tiny.json"


def make_trace() -> Trace:
    prov = Provenance("cpu (test)", "fp32", "2.13.0", "abc1234", "pytest", "2026-11-30T00:00:00Z")
    recs = (
        LayerRecord("block", 1, 128, 1e-3, 2e-3, 1e-3, 1e6, 4e5, backward_input_s=1.2e-3,
                    backward_weight_s=0.8e-3, repeats=5),
        LayerRecord("block", 2, 128, 2e-3, 4e-3, 2e-3, 2e6, 4e5),
        LayerRecord("head", 1, 128, 3e-3, 5e-3, 3e-3, 3e6, 1e6),
    )
    colls = (CollectiveRecord("all-reduce", 2, "intra", 1e6, 1e-3),)
    return Trace(prov, get_model("gpt-1.5b"), recs, colls)


def test_round_trip(tmp_path):
    t = make_trace()
    p = tmp_path / "t.json"
    write_trace(t, p)
    assert read_trace(p) == t
    assert json.loads(p.read_text())["format"] == TRACE_FORMAT


def test_shipped_trace_reads_and_is_complete():
    t = read_trace(SHIPPED)
    kinds = {(r.kind, r.micro_batch_size, r.seq_len) for r in t.layers}
    for k in ("embedding", "block", "head"):
        for mbs in (1, 2, 4):
            for s in (64, 128):
                assert (k, mbs, s) in kinds
    assert t.provenance.torch.startswith("2.13")
    assert t.provenance.command and t.provenance.git_commit and t.provenance.date
    assert {c.collective for c in t.collectives} >= {"all-reduce", "p2p"}
    blocks = sorted((r.micro_batch_size, r.activation_bytes) for r in t.layers
                    if r.kind == "block" and r.seq_len == 128)
    # Activations are linear in the micro-batch size.
    assert blocks[2][1] == pytest.approx(4 * blocks[0][1], rel=0.01)


def _mutated(fn):
    d = json.loads(make_trace().to_json())
    fn(d)
    return d


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(format="merak-trace/2"), "format 'merak-trace/2' is not supported"),
    (lambda d: d.pop("format"), "format None is not supported"),
    (lambda d: d.pop("layers"), "missing field 'layers'"),
    (lambda d: d["layers"][0].pop("forward_s"), "layers[0]: missing field 'forward_s'"),
    (lambda d: d["layers"][1].update(backward_s="fast"),
     "layers[1]: field 'backward_s' has wrong type: 'fast'"),
    (lambda d: d["layers"][0].update(forward_s=-1.0), "field 'forward_s' must be >= 0, got -1.0"),
    (lambda d: d["layers"][0].update(kind="moe"), "kind 'moe' unknown"),
    (lambda d: d["layers"][0].update(micro_batch_size=0), "'micro_batch_size' must be >= 1"),
    (lambda d: d["layers"][0].update(colour=1), "unknown field(s) colour"),
    (lambda d: d["layers"].append(copy.deepcopy(d["layers"][0])), "layers[3] duplicates"),
    (lambda d: d["provenance"].pop("torch"), "provenance: missing field 'torch'"),
    (lambda d: d["model"].update(heads=7), "model: model hidden 1600 is not divisible by heads 7"),
    (lambda d: d["collectives"][0].update(placement="moon"), "placement 'moon' unknown"),
    (lambda d: d.update(layers=[]), "'layers' must be a non-empty list"),
])
def test_rejects_malformed(mutate, needle, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_mutated(mutate)))
    with pytest.raises(TraceError) as e:
        read_trace(p)
    msg = str(e.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_rejects_non_json_and_missing(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{oops")
    with pytest.raises(TraceError, match="not valid JSON"):
        read_trace(p)
    with pytest.raises(TraceError, match="cannot read trace file"):
        read_trace(tmp_path / "absent.json")


def test_from_exec_profile_converts_and_validates():
    prof = {
        "format": "merak-exec-profile/1",
        "model": {"family": "gpt", "hidden": 64, "layers": 2, "vocab": 100,
                  "config": {"n_head": 4, "n_positions": 32, "ffn_mult": 4, "dropout": 0.0,
                             "n_layer": 2, "vocab_size": 100, "n_embd": 64}},
        "micro_batch_size": 2, "seq_len": 32, "dtype": "float32", "device": "cpu (x86_64)",
        "meta": {"torch": "2.13.0", "repeats": 5, "threads": 1, "created_unix_s": 0},
        "layers": [
            {"name": k, "count": 1, "forward_s": 1e-3, "backward_s": 2e-3,
             "backward_input_s": 1e-3, "backward_weight_s": 1e-3, "recompute_s": 1e-3,
             "activation_bytes": 1000, "checkpoint_bytes": 100, "output_bytes": 100,
             "param_bytes": 10, "flops": 5} for k in ("embedding", "block", "head")],
    }
    d = from_exec_profile(prof)
    t = Trace.from_dict(d)
    assert t.model.heads == 4 and t.model.ffn_hidden == 256 and t.model.seq_len == 32
    assert t.provenance.date == "1970-01-01T00:00:00Z"
    assert [r.kind for r in t.layers] == ["embedding", "block", "head"]
    bad = copy.deepcopy(prof)
    bad["model"]["config"].pop("n_head")
    with pytest.raises(TraceError, match="head count"):
        from_exec_profile(bad)


def test_merge_traces():
    a = make_trace()
    b = Trace(a.provenance, a.model, (LayerRecord("block", 4, 128, 4e-3, 8e-3, 4e-3, 4e6, 4e5),))
    m = merge_traces([a, b])
    assert len(m.layers) == 4
    other = Trace(a.provenance, get_model("gpt-8.3b"), a.layers)
    with pytest.raises(TraceError, match="different model shapes"):
        merge_traces([a, other])
