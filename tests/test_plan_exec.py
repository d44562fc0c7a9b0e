"""The plan is the contract: merak-exec builds the planned model (shape, kv heads, MLP
width), says its parameter count, refuses what it cannot run, and checks every value
before any work."""

import json
import os
import re
import subprocess
import sys

import pytest

from merak_exec.builders import model_from_spec, parameter_count
from merak_sim.config import ParallelConfig
from merak_sim.executable import NOT_EXECUTED, executable_space, unsupported
from merak_sim.model import ModelSpec, get_model
from merak_sim.planner import SearchSpace
from merak_sim.plan import Plan

# CUDA_VISIBLE_DEVICES="" hides any GPU from the child processes, so the paths of a
# CPU build (e.g. --device cuda refused in one line) run the same on every machine.
ENV = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MERAK_TIMEOUT_S="60",
           CUDA_VISIBLE_DEVICES="")
GQA = {"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
       "ffn_hidden": 176, "seq_len": 16, "vocab": 128}
GPT = {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 96,
       "seq_len": 16, "vocab": 128}


BAD_VALUES = [
    (["train", "--steps", "0"], "'--steps': 0 is not in the range"),
    (["train", "--mbs", "0"], "'--micro-batch-size'"),  # errors name the current spelling
    (["train", "--trace", "/proc/nope/t.json"], "--chrome-trace /proc/nope/t.json: cannot write"),
    (["train", "--chrome-trace", "."], "is a directory"),
    (["profile", "--out", "/proc/nope/x.json"], "--out /proc/nope/x.json: cannot write"),
    (["profile", "--out", "x.json", "--micro-batch-size", "0,2"], "positive integers"),
    (["profile", "--out", "x.json", "--device", "tpu"], "choose cpu, cuda"),
    (["train", "--plan", "missing.json"], "cannot read plan file"),
    (["train", "--order", "tp-dp"], "order must list tp, cp, dp and pp"),
]
HELP_AND_ALIASES = [
    ["--version"],
    ["train", "-h"],
    ["train", "--steps", "1", "--layers", "2", "--hidden", "16", "--seq", "8", "--vocab", "32",
     "--mbs", "2", "--micro-batch-size", "2"],
    ["train", "--steps", "1", "--layers", "2", "--hidden", "16", "--seq", "8", "--vocab", "32",
     "--mbs", "2", "--trace", "t.json"],
]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Every command line of the tests below, run once by one interpreter
    (support.cli_runs): ``cli[key]`` is ``(CompletedProcess, working directory)``."""
    from support.cli_runs import run_commands

    plan_dir = tmp_path_factory.mktemp("refused")
    Plan(model=GPT, cluster={"preset": "local-cpu"},
         parallel=ParallelConfig(dp=2, micro_batch_size=1, global_batch_size=4,
                                 zero=3, zero_group=2)).save(plan_dir / "z.json")
    jobs = {("bad", i): (args, tmp_path_factory.mktemp("bad"))
            for i, (args, _) in enumerate(BAD_VALUES)}
    jobs["cuda"] = (["profile", "--out", "x.json", "--device", "cuda"],
                    tmp_path_factory.mktemp("cuda"))
    jobs["refused"] = (["train", "--plan", "z.json"], plan_dir)
    aliases = tmp_path_factory.mktemp("aliases")
    for i, args in enumerate(HELP_AND_ALIASES):
        jobs[("aliases", i)] = (args, aliases)
    done = run_commands([(args, str(cwd)) for args, cwd in jobs.values()], ENV)
    return {k: (r, cwd) for (k, (_, cwd)), r in zip(jobs.items(), done, strict=True)}


@pytest.mark.parametrize("model", [GQA, GPT], ids=["llama-gqa", "gpt-ffn96"])
def test_plan_runs_with_the_planned_parameter_count(tmp_path, model):
    plan = Plan(model=model, cluster={"preset": "local-cpu"},
                parallel=ParallelConfig(pp=2, micro_batch_size=1, global_batch_size=4,
                                        dtype="fp32"))
    plan.save(tmp_path / "plan.json")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        "2", "--standalone", "-m", "merak_exec", "train",
                        "--plan", "plan.json", "--steps", "1"],
                       capture_output=True, text=True, timeout=400, env=ENV, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("parameters")]
    expected = ModelSpec.from_json(model).total_params()
    assert lines == [f"parameters: {expected}"]
    # the default MLP / kv-head count would have given another number
    default = ModelSpec.from_json({k: v for k, v in model.items()
                                   if k not in ("ffn_hidden", "kv_heads")}).total_params()
    assert default != expected


@pytest.mark.parametrize("preset", ["llama2-70b", "gpt-1.5b"])
def test_presets_build_with_the_simulated_count(preset):
    spec = get_model(preset)
    assert parameter_count(model_from_spec(spec, 0.0, meta=True)) == spec.total_params()
    if preset == "llama2-70b":
        assert round(spec.total_params() / 1e9, 1) == 69.0


def test_capability_table_refuses_and_restricts():
    spec = ModelSpec.from_json(GQA)
    assert unsupported(ParallelConfig(dp=2, global_batch_size=2), spec) is None
    assert unsupported(ParallelConfig(dp=2, global_batch_size=2, zero=1)) is None
    assert unsupported(ParallelConfig(recompute="selective")) is None
    assert unsupported(ParallelConfig(dp=2, global_batch_size=2, zero=3)) is None
    assert "ZeRO-3 (torch FSDP2) with schedule 'zb-h1'" in unsupported(
        ParallelConfig(pp=2, global_batch_size=2, zero=3, schedule="zb-h1"))
    assert "context parallelism" in unsupported(ParallelConfig(cp=2, global_batch_size=2))
    assert "sequence" in unsupported(ParallelConfig(tp=2, sequence_parallel=True), spec)
    assert "kv_heads" in unsupported(ParallelConfig(tp=4), spec)
    assert "simulate-only" in unsupported(ParallelConfig(), get_model("bert-large"))
    space = executable_space(SearchSpace(), spec)
    for name, (rule, _, _why) in NOT_EXECUTED.items():
        for v in getattr(space, name, ()) or ():
            assert not (rule(v) if callable(rule) else v in rule)
    assert set(space.tp) <= {1, 2}
    assert space.sequence_parallel == (False,)  # a LLaMA: built-in GPT only
    with pytest.raises(ValueError, match="allows only cp=2"):
        executable_space(SearchSpace().with_(cp=(2,)), get_model("gpt-1.5b"))


def test_non_executable_plan_refused_before_any_work(cli):
    r, cwd = cli["refused"]
    assert r.returncode == 2 and r.stdout == ""
    assert sorted(p.name for p in cwd.iterdir()) == ["z.json"]
    assert r.stderr.strip().splitlines() == [
        "merak-exec: error: cannot run this plan: HSDP shard groups (zero_group=2) is "
        "simulated but not executed by merak-exec (ZeRO shards over all of dp)"]


@pytest.mark.parametrize("i, args, fragment", [(i, a, f) for i, (a, f) in enumerate(BAD_VALUES)],
                         ids=[str(i) for i in range(len(BAD_VALUES))])
def test_bad_values_one_line_exit_2(cli, i, args, fragment):
    r, cwd = cli[("bad", i)]
    assert r.args == args
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and fragment in lines[0], r.stderr
    assert list(cwd.iterdir()) == []  # nothing left behind


def test_cuda_device_on_a_cpu_build_is_one_line(cli):
    r, _ = cli["cuda"]
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no CUDA" in r.stderr


def test_version_help_and_aliases(cli):
    r, cwd = cli[("aliases", 0)]
    assert r.returncode == 0 and r.stdout.startswith("merak-exec, version")
    r, _ = cli[("aliases", 1)]
    assert r.returncode == 0 and "--micro-batch-size" in r.stdout
    assert "--mbs" not in r.stdout and "--trace " not in r.stdout  # hidden old spellings
    r, _ = cli[("aliases", 2)]  # both spellings of one option, as merak-sim: the last wins
    assert r.returncode == 0 and "parameters:" in r.stdout, r.stderr
    r, _ = cli[("aliases", 3)]
    assert r.returncode == 0, r.stderr
    assert re.match(r"parameters: \d+\n", r.stdout) and (cwd / "t.json").exists()
    json.loads((cwd / "t.json").read_text())


def test_executable_search_pairs_zero_2_3_only_with_whole_backwards():
    """FSDP2 (ZeRO-2/3) needs whole backwards and no sequence parallelism: a joint rule
    the per-option tuples cannot state, so the executable space excludes the pairs and
    keeps them as pruned rows naming why."""
    from merak_sim.planner import search

    spec = get_model("gpt-1.5b")
    space = executable_space(SearchSpace(zero=(0, 1, 2, 3), pp=(2,), tp=(1, 2),
                                         micro_batch_sizes=(1,), virtual_stages=(2,)), spec)
    res = search(spec, "paper-3090", 16, nodes=2, space=space, top_k=1, confirm=False)
    t = res.table
    ran = t[t.status.isin(["best", "confirmed", "evaluated", "bounded"])]
    deep = ran[ran.zero >= 2]
    assert len(deep) > 0
    assert set(deep.schedule) <= {"gpipe", "1f1b", "interleaved-1f1b"}
    assert not deep.sequence_parallel.any()
    split = t[(t.zero >= 2) & (t.schedule == "zb-h1")]
    assert len(split) > 0 and split.status.eq("pruned").all()
    assert split.reason.str.contains("split the backward").all()
    assert unsupported(res.best_config, spec) is None
