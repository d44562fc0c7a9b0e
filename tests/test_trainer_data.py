"""The Trainer on real data, end to end on 2 gloo ranks (pp2): a token file packed by
merak_exec.data with a held-out tail, evaluation every 2 steps and at the end,
checkpoints every 2 steps and at the end, and save_model: the export loads in
transformers and its own held-out loss equals the Trainer's last evaluation."""

import math

import pytest

from support.checkpoint_workers import run_jobs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer-data")
    return run_jobs(2, [("trainer", {"job": "job_trainer_data", "dir": str(root)})],
                    str(root))["trainer"]


def test_trainer_evaluates_checkpoints_and_exports(run):
    for r in run:
        assert r is not None and "exception" not in r, (r or {}).get("exception")
        assert [e["step"] for e in r["eval"]] == [2, 4, 5]
        assert r["eval"][-1]["eval_loss"] < r["eval"][0]["eval_loss"]  # the data repeats
        for e in r["eval"]:
            assert e["perplexity"] == pytest.approx(math.exp(e["eval_loss"]))
        assert r["checkpoints"] == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    assert run[0]["eval"] == run[1]["eval"]
    assert run[0]["hf_eval"] == pytest.approx(run[0]["eval"][-1]["eval_loss"], rel=1e-5)
