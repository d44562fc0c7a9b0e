"""The large-run options through ``merak-sim simulate | costs | plan`` and the Python
API: flags pass through, bad values are one line with exit 2, and the 405B example
fits with flash attention and no forced full recompute."""

import json

import pytest

import merak_sim
from merak_sim.cli import main
from merak_sim.planner import SearchSpace, search
from merak_sim.planner.space import enumerate_candidates

SIM = ["simulate", "--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "1",
       "--dp", "2", "--tp", "2", "--pp", "2", "--micro-batch-size", "1",
       "--global-batch-size", "8", "--schedule", "1f1b", "--recompute", "none",
       "--engine", "evaluator", "--json"]


def run_json(argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_simulate_flags_pass_through(capsys):
    base = run_json(SIM + ["--attention", "unfused"], capsys)
    flash = run_json(SIM + ["--attention", "flash"], capsys)
    assert max(flash["peak_memory_bytes"]) < max(base["peak_memory_bytes"])
    auto = run_json(SIM, capsys)  # auto is flash on a GPU preset
    assert auto["config"]["attention"] == "auto"
    assert {k: v for k, v in auto.items() if k != "config"} == \
        {k: v for k, v in flash.items() if k != "config"}
    fsdp = run_json(SIM + ["--zero", "3", "--attention", "flash"], capsys)
    assert max(fsdp["peak_memory_bytes"]) < max(flash["peak_memory_bytes"])
    cp = run_json([*SIM[:SIM.index("--dp")], "--dp", "1", "--cp", "2",
                   *SIM[SIM.index("--dp") + 2:], "--attention", "flash"], capsys)
    assert cp["iteration_time_s"] > 0
    f8 = run_json(SIM + ["--dtype", "fp8", "--attention", "flash"], capsys)
    assert f8["iteration_time_s"] < flash["iteration_time_s"]


def test_costs_flags(capsys):
    out = run_json(["costs", "--model", "llama2-7b", "--cluster", "dgx-h100", "--tp", "2",
                    "--cp", "2", "--dp", "2", "--zero", "2", "--zero-group", "2",
                    "--attention", "flash", "--dtype", "fp8", "--json"], capsys)
    assert out["config"]["cp"] == 2 and out["config"]["zero"] == 2
    assert out["config"]["attention"] == "flash" and out["config"]["dtype"] == "fp8"


@pytest.mark.parametrize("extra, msg", [
    (["--attention", "fast"], "fast"),
    (["--zero", "4"], "4"),
    (["--cp", "3"], "cp=3 does not divide the sequence"),
    (["--dp", "4"], "GPUs"),
])
def test_simulate_bad_values_exit_2(capsys, extra, msg):
    argv = SIM[:]
    if extra[0] in argv:
        i = argv.index(extra[0])
        argv[i + 1] = extra[1]
    else:
        argv += extra
    if extra[0] == "--cp":
        argv[argv.index("--dp") + 1] = "1"
        argv[argv.index("--pp") + 1] = "1"
        argv += ["--sub-cluster"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("merak-sim: error:") and msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_fp8_on_a100_refused(capsys):
    argv = SIM[:]
    argv[argv.index("--cluster") + 1] = "dgx-a100-80g"
    assert main(argv + ["--dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "no FP8 tensor cores" in err and "--dtype bf16" in err


def test_python_api_and_bad_values():
    r = merak_sim.simulate("llama2-7b", "dgx-h100", dp=2, tp=2, pp=2, cp=1,
                           micro_batch_size=1, global_batch_size=8, schedule="1f1b",
                           zero=3, attention="flash", engine="evaluator")
    assert r.fits_in_memory and r.mfu > 0
    with pytest.raises(ValueError, match="unknown attention"):
        merak_sim.simulate("llama2-7b", "dgx-h100", dp=8, micro_batch_size=1,
                           global_batch_size=8, attention="sdpa")


def test_planner_searches_cp_and_zero(capsys, tmp_path):
    space = SearchSpace(cp=(1, 2), zero=(0, 3), attention=("flash",), schedules=("1f1b",),
                        recompute=("none",), tp=(2,), pp=(2,), sequence_parallel=(False,),
                        tp_overlap=("none",), micro_batch_sizes=(1,))
    from merak_sim.model import get_model
    cands = [c for c in enumerate_candidates(get_model("llama2-7b"), 8, 8, 8, space)
             if not c.pruned]
    assert {(c.cp, c.dp) for c in cands} == {(1, 2), (2, 1)}
    assert {c.zero for c in cands if c.cp == 1} == {0, 3}
    res = search("llama2-7b", "dgx-h100", 8, space=space, confirm=False)
    assert set(res.table.cp) == {1, 2}
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "llama2-7b", "--cluster", "dgx-h100",
                 "--global-batch-size", "8", "--tp", "2", "--pp", "2", "--cp", "1,2",
                 "--zero", "0,1,2,3", "--attention", "flash", "--schedules", "1f1b",
                 "--no-confirm", "--out", str(out), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["parallel"]["attention"] == "flash"


def test_405b_example_fits_without_full_recompute():
    """LLaMA-style 405B on 1,024 DGX H100 nodes, tp 8 pp 16 dp 64: flash attention,
    sequence parallelism and the distributed optimizer fit with no recomputation."""
    r = merak_sim.simulate("llama3-405b-like", "dgx-h100", nodes=1024, dp=64, tp=8, pp=16,
                           micro_batch_size=1, global_batch_size=2048, schedule="1f1b",
                           recompute="none", sequence_parallel=True, zero=1,
                           attention="flash", engine="evaluator", keep_trace=False)
    assert r.fits_in_memory
    assert 0.2 < r.mfu < 0.7
    unfused = merak_sim.simulate("llama3-405b-like", "dgx-h100", nodes=1024, dp=64, tp=8,
                                 pp=16, micro_batch_size=1, global_batch_size=2048,
                                 schedule="1f1b", recompute="none", sequence_parallel=True,
                                 zero=1, attention="unfused", engine="evaluator",
                                 keep_trace=False)
    assert not unfused.fits_in_memory


def test_cp_mfu_counts_every_gpu():
    """Model FLOP/s per GPU times every GPU (dp * cp * tp * pp) and the iteration time
    give back the model's training FLOPs."""
    from merak_sim.model import get_model

    r = merak_sim.simulate("llama2-7b", "dgx-h100", dp=1, cp=2, tp=2, pp=2,
                           micro_batch_size=1, global_batch_size=8, schedule="1f1b",
                           attention="flash", engine="evaluator", keep_trace=False)
    want = get_model("llama2-7b").training_flops(8)
    assert r.model_flops_per_gpu * 8 * r.iteration_time_s == pytest.approx(want)


@pytest.mark.parametrize("att, label", [("auto", "attention=auto (flash)"),
                                        ("unfused", "attention=unfused")])
def test_costs_plan_simulate_print_attention_alike(att, label, capsys, tmp_path):
    """The three commands name the kernel the same way ("auto" with what it resolved
    to), each exactly once."""
    gpu = ["--model", "gpt-2.5b", "--cluster", "dgx-a100-80g", "--attention", att]
    shape = ["--dp", "2", "--tp", "2", "--pp", "2", "--micro-batch-size", "2",
             "--global-batch-size", "16"]
    for argv in (["costs", *gpu, *shape],
                 ["simulate", *gpu, *shape, "--schedule", "1f1b", "--recompute", "none",
                  "--engine", "evaluator"],
                 ["plan", *gpu, "--global-batch-size", "16", "--top", "1",
                  "--out", str(tmp_path / "plan.json")]):
        assert main(argv) == 0, argv[0]
        out = capsys.readouterr().out
        assert out.count("attention=") == 1 and label in out, (argv[0], out)
