"""Checkpoints resume at another layout and refuse unsafe or foreign folders.

The matrix (gloo, CPU, tiny GPT with a tied head, AdamW, clipping and a cosine
schedule): a run trains 2 steps at one layout and saves; a model built from another
random start at a second layout loads it and trains 2 more steps, which must equal
steps 3-4 of an uninterrupted run at the second layout (relative 1e-5). Pairs:
1 -> dp2, dp2 -> pp2, pp2 -> tp2, tp2 -> 1, zero1 -> zero3, zero3 -> zero0,
pp2 (1f1b) -> zb-v, and fp32 -> a bf16 run. Then exports to HuggingFace's layout of
checkpoints saved at ZeRO-3, pp2 and tp2. Three launches (1, 2, then 1 rank)."""

import pytest

from support.checkpoint_workers import run_jobs

PAIRS_2 = [("one", "dp2"), ("dp2", "pp2"), ("pp2", "tp2"), ("zero1", "zero3"),
           ("zero3", "dp2"), ("pp2", "zb-v"), ("dp2", "bf16")]
#: (model, layout saved at) pairs exported to HuggingFace's layout.
EXPORTS = [("gpt", "zero3"), ("gpt2", "pp2"), ("llama-tied", "tp2")]
#: layouts whose evaluation (forward-only schedule) is compared with one process.
EVAL_LAYOUTS = ["dp2", "pp2", "zb-v", "tp2", "zero3"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    ck = {name: str(root / f"ck-{name}") for name in ("one", "dp2", "pp2", "tp2", "zero1",
                                                       "zero3")}
    first = run_jobs(1, [("save-one", {"job": "job_save", "layout": "one", "dir": ck["one"]})],
                     str(root))
    jobs = [(f"save-{n}", {"job": "job_save", "layout": n, "dir": ck[n]})
            for n in ("dp2", "pp2", "tp2", "zero1", "zero3")]
    jobs += [(f"{a}->{b}", {"job": "job_resume", "layout": b, "dir": ck[a]}) for a, b in PAIRS_2]
    jobs += [(f"save-{k}-{lay}", {"job": "job_save_kind", "kind": k, "layout": lay,
                                  "dir": str(root / f"ck-{k}-{lay}")}) for k, lay in EXPORTS]
    jobs += [(f"eval-{n}", {"job": "job_evaluate", "layout": n}) for n in EVAL_LAYOUTS]
    second = run_jobs(2, jobs, str(root))
    work = root / "refusals"
    work.mkdir()
    jobs = [("tp2->one", {"job": "job_resume", "layout": "one", "dir": ck["tp2"]}),
            ("refusals", {"job": "job_refusals", "dir": ck["one"], "work": str(work)}),
            ("eval-one", {"job": "job_evaluate", "layout": "one"})]
    jobs += [(f"export-{k}-{lay}", {"job": "job_export", "kind": k,
                                    "dir": str(root / f"ck-{k}-{lay}"),
                                    "out": str(root / f"hf-{k}-{lay}")}) for k, lay in EXPORTS]
    third = run_jobs(1, jobs, str(root))
    return {**first, **second, **third}


def _ok(results):
    for r in results:
        assert r is not None and "exception" not in r, (r or {}).get("exception")
    return results


@pytest.mark.parametrize("pair", [f"{a}->{b}" for a, b in PAIRS_2] + ["tp2->one"])
def test_resume_at_another_layout_continues_the_run(matrix, pair):
    for r in _ok(matrix[pair]):
        assert r["step"] == 2 and r["samples"] == 8 and r["iteration"] == 4
        if pair.endswith("bf16"):  # same degrees; autocast: close, not equal
            assert r["resharded"] is False
            assert r["tail"] == pytest.approx(r["full"][2:], rel=2e-2)
        else:
            assert r["resharded"] is True
            assert r["tail"] == pytest.approx(r["full"][2:], rel=1e-5)


def test_saves_at_every_layout_agree(matrix):
    """The first two steps are the same model at every layout (the saved state)."""
    ref = _ok(matrix["save-one"])[0]["losses"]
    for name in ("dp2", "pp2", "tp2", "zero1", "zero3"):
        for r in _ok(matrix[f"save-{name}"]):
            assert r["losses"] == pytest.approx(ref, rel=1e-5), name


def test_unsafe_or_foreign_checkpoints_are_refused_in_one_line(matrix):
    r = _ok(matrix["refusals"])[0]
    assert r["pickle_ran"] is False
    assert ".metadata is not part of the checkpoint" in r["planted"]
    assert "torch.distributed.checkpoint folder" in r["dcp"] and "pickle" in r["dcp"]
    assert "rank00000.safetensors does not match its SHA-256" in r["flipped"]
    assert "manifest.json is not a valid checkpoint manifest" in r["manifest"]
    assert "rank00000.safetensors has 100 bytes" in r["truncated"]
    assert "holds another model" in r["other-model"] and "[8, 32] here" in r["other-model"]
    for name, msg in r.items():
        if name != "pickle_ran":
            assert msg and "\n" not in msg, name


@pytest.mark.parametrize("kind,layout", EXPORTS)
def test_export_loads_in_transformers_with_equal_logits(matrix, kind, layout):
    """A checkpoint saved at ``layout`` exports to a folder AutoModelForCausalLM loads;
    its logits equal the checkpoint's model (the built-in GPT as GPT2LMHeadModel)."""
    r = _ok(matrix[f"export-{kind}-{layout}"])[0]
    assert r["class"] == ("LlamaForCausalLM" if kind.startswith("llama") else "GPT2LMHeadModel")
    assert r["scale"] > 0 and r["max_abs"] <= 1e-5 * r["scale"]


@pytest.mark.parametrize("layout", EVAL_LAYOUTS)
def test_evaluation_runs_the_forwards_only_and_equals_one_process(matrix, layout):
    """evaluate() before training equals the training loss of the same batch, drops
    after two steps, and equals the single process's values at every layout."""
    one = _ok(matrix["eval-one"])[0]
    assert one["before"] == pytest.approx(one["train"], rel=1e-6)
    assert one["after"] < one["before"]
    for r in _ok(matrix[f"eval-{layout}"]):
        for key in ("before", "train", "after"):
            assert r[key] == pytest.approx(one[key], rel=1e-5), key
