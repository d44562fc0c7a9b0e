"""``merak-sim costs``: the table, --json, traces, and one-line errors with exit 2."""

import json
from pathlib import Path

import pytest

from merak_sim.cli import main

SHIPPED = str(Path(__file__).resolve().parents[1] / "traces" / "cpu-gpt-tiny.json")


def run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_issue_example_table(capsys):
    rc, out, _ = run(capsys, "costs", "--model", "gpt-8.3b", "--cluster", "paper-3090",
                     "--tp", "4", "--micro-batch-size", "2")
    assert rc == 0
    for needle in ("Per layer", "embedding", "layer", "head", "Per model stage", "act MiB",
                   "peak memory", "ASSUMPTION"):
        assert needle in out
    # one stage with all 72 layers (pp=1)
    stage_rows = [ln for ln in out.splitlines() if ln.strip().startswith("0  ")]
    assert stage_rows and " 72 " in stage_rows[0]


def test_issue_example_json(capsys):
    rc, out, _ = run(capsys, "costs", "--model", "gpt-8.3b", "--cluster", "paper-3090",
                     "--tp", "4", "--micro-batch-size", "2", "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d["layers"]) == {"embedding", "layer", "head"}
    lay = d["layers"]["layer"]
    assert lay["forward_s"] > 0 and lay["tp_comm_fwd_s"] > 0 and lay["activation_bytes"] > 0
    assert len(d["stages"]) == 1 and d["stages"][0]["layers"] == 72
    assert d["config"]["tp"] == 4 and d["cluster"]["name"] == "paper-3090"


def test_pipeline_and_trace(capsys):
    rc, out, _ = run(capsys, "costs", "--model", SHIPPED, "--cluster", "local-cpu",
                     "--trace", SHIPPED, "--dtype", "fp32", "--pp", "2",
                     "--micro-batch-size", "2", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["meta"]["source"] == "trace"
    assert d["layers"]["layer"]["source"] == "trace (exact)"
    assert [s["layers"] for s in d["stages"]] == [2, 2]
    assert [r["peak_in_flight"] for r in d["ranks"]] == [2, 1]


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt-8.3b", "--tp", "3"], "tp=3 does not divide 32 attention heads"),
    (["--model", "gpt-9b"], "unknown model preset 'gpt-9b'"),
    (["--model", "gpt-8.3b", "--cluster", "moon"], "unknown cluster preset 'moon'"),
    (["--model", "gpt-8.3b", "--pp", "80", "--nodes", "20"], "exceeds the model's 72 layers"),
    (["--model", "gpt-8.3b", "--micro-batch-size", "0"],
     "micro_batch_size must be a positive integer, got 0"),
    (["--model", "gpt-8.3b", "--dp", "128"], "needs dp*tp*pp = 128 GPUs"),
])
def test_bad_input_one_line_exit_2(capsys, args, needle):
    if "--cluster" not in args:
        args = [*args, "--cluster", "paper-3090"]
    rc, out, err = run(capsys, "costs", *args)
    assert rc == 2
    assert needle in err and err.startswith("merak-sim: error:")
    assert len(err.strip().splitlines()) == 1
