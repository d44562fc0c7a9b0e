"""Plan files (versioned, validated) and launch-script generation."""

import json

import pytest

from merak_sim.cli import main
from merak_sim.config import ParallelConfig
from merak_sim.dispatch import DispatchError, write_launch
from merak_sim.plan import Plan, PlanError

MODEL = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128}


def _plan(**kw):
    cfg = dict(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4, schedule="1f1b")
    cfg.update(kw)
    return Plan(model=MODEL, cluster={"preset": "local-cpu"}, parallel=ParallelConfig(**cfg))


def test_plan_round_trip(tmp_path):
    p = _plan(schedule="shifted-critical-path", recompute="stage-aware")
    p.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == p


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(format="merak-plan/0"), "format"),
        (lambda d: d.pop("model"), "model"),
        (lambda d: d["parallel"].update(dp=0), "parallel"),
        (lambda d: d["parallel"].update(schedule="shifted-critical-path", global_batch_size=2),
         "parallel.schedule"),
        (lambda d: d["parallel"].update(wat=1), "wat"),
        (lambda d: d.update(cluster=3), "cluster"),
    ],
)
def test_invalid_plans_name_the_field(tmp_path, mutate, field):
    d = _plan().to_dict()
    mutate(d)
    with pytest.raises(PlanError) as e:
        Plan.from_dict(d)
    assert field in str(e.value)


def test_torchrun_and_slurm_scripts(tmp_path):
    p = _plan(dp=2, tp=2, pp=2, global_batch_size=8)
    f = write_launch(p, "torchrun", nodes=2, gpus_per_node=4, out_dir=tmp_path / "t")
    text = f.launcher.read_text()
    assert "--nnodes=2" in text and "--nproc-per-node=4" in text and "merak_exec" in text
    assert len(f.node_commands) == 2 and "--node-rank=1" in f.node_commands[1]
    assert Plan.load(f.plan) == p
    (tmp_path / "train.py").write_text("")
    f = write_launch(p, "slurm", nodes=2, gpus_per_node=4, out_dir=tmp_path / "s",
                     script=str(tmp_path / "train.py"))
    text = f.launcher.read_text()
    assert "#SBATCH --nodes=2" in text and "--kill-on-bad-exit=1 torchrun" in text
    assert f"{tmp_path / 'train.py'} --plan" in text


@pytest.mark.parametrize("nodes, gpn, fragment", [(1, 2, "4 GPUs"), (4, 1, "must divide")])
def test_shape_mismatch_rejected_before_writing(tmp_path, nodes, gpn, fragment):
    p = _plan(tp=2, pp=2)
    with pytest.raises(DispatchError, match=fragment):
        write_launch(p, "torchrun", nodes=nodes, gpus_per_node=gpn, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_dispatch_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "merak-plan/9"}))
    assert main(["dispatch", str(bad), "--nodes", "1", "--gpus-per-node", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format" in err[0]
    assert main(["dispatch", str(tmp_path / "missing.json"), "--nodes", "1",
                 "--gpus-per-node", "2"]) == 2


def test_written_files_get_normal_permissions(tmp_path):
    import os

    from merak_sim.io import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_unexecutable_plan_refused_unless_forced(tmp_path):
    p = _plan(pp=2, global_batch_size=4, zero=3, schedule="zb-h1")
    with pytest.raises(DispatchError, match="ZeRO.*--force"):
        write_launch(p, "torchrun", nodes=1, gpus_per_node=2, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    f = write_launch(p, "torchrun", nodes=1, gpus_per_node=2, out_dir=tmp_path / "x",
                     force=True)
    assert "ZeRO" in f.forced


def test_other_cluster_shape_refused_unless_forced(tmp_path, capsys):
    cfg = ParallelConfig(dp=4, tp=4, pp=4, micro_batch_size=1, global_batch_size=64)
    p = Plan(model=MODEL, cluster={"preset": "paper-3090", "nodes": 16}, parallel=cfg)
    p.save(tmp_path / "p.json")
    assert main(["dispatch", str(tmp_path / "p.json"), "--nodes", "8", "--gpus-per-node",
                 "8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "16 node(s) x 4 GPUs" in err[0] and "--force" in err[0]
    assert main(["dispatch", str(tmp_path / "p.json"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out.splitlines()
    # 16 nodes: the first two, a summary and the last, as in the script's header
    assert [ln.split(":")[0] for ln in out[2:]] == ["node 0", "node 1", "nodes 2-14",
                                                     "node 15"]
    header = (tmp_path / "o" / "launch.sh").read_text()
    assert all(f"#   {ln}" in header for ln in out[2:])


def test_multi_node_launch_needs_node_rank_and_master_addr(tmp_path):
    import os
    import subprocess

    p = _plan(dp=2, tp=2, pp=2, global_batch_size=8)
    f = write_launch(p, "torchrun", nodes=2, gpus_per_node=4, out_dir=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR")}
    for extra, fragment in (({}, "MASTER_ADDR"), ({"MASTER_ADDR": "h"}, "NODE_RANK"),
                            ({"MASTER_ADDR": "h", "NODE_RANK": "2"}, "got '2'")):
        r = subprocess.run(["bash", str(f.launcher)], env={**env, **extra},
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and fragment in r.stderr and r.stderr.count("\n") == 1


def test_sbatch_options_and_its_own_directory(tmp_path):
    p = _plan()
    f = write_launch(p, "slurm", nodes=1, gpus_per_node=2, out_dir=tmp_path, time="1-02:00:00",
                     partition="gpu", output="merak-%j.out")
    text = f.launcher.read_text()
    for line in ("#SBATCH --time=1-02:00:00", "#SBATCH --partition=gpu",
                 "#SBATCH --output=merak-%j.out",
                 f"else here={tmp_path.resolve()}; fi"):
        assert line in text
    assert f.node_commands == (next(f"every node: {ln}" for ln in text.splitlines()
                                    if ln.startswith("srun ")),)
    assert "SLURM_SUBMIT_DIR" not in text
    for kw, frag in (({"time": "soon"}, "Slurm time"), ({"partition": "a b"}, "partition")):
        with pytest.raises(DispatchError, match=frag):
            write_launch(p, "slurm", nodes=1, gpus_per_node=2, out_dir=tmp_path / "y", **kw)
    with pytest.raises(DispatchError, match="--launcher slurm"):
        write_launch(p, "torchrun", nodes=1, gpus_per_node=2, out_dir=tmp_path / "y",
                     time="10")


def test_slurm_master_from_the_node_list():
    from merak_exec.mesh import ExecError, first_slurm_host, slurm_env

    assert first_slurm_host("gpu[01-04,07]") == "gpu01"
    assert first_slurm_host("gpu[07,01-04],cpu3") == "gpu07"
    assert first_slurm_host("rack[2-3]-n[5-6]") == "rack2-n5"
    assert first_slurm_host("a1,a2") == "a1"
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_ID": "1234"}
    assert slurm_env(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                              "MASTER_ADDR": "gpu01", "MASTER_PORT": "29734"}
    assert slurm_env({**env, "MASTER_ADDR": "x", "MASTER_PORT": "1"}).keys() == {
        "RANK", "WORLD_SIZE", "LOCAL_RANK"}
    assert slurm_env({"RANK": "0", **env}) == {}
    with pytest.raises(ExecError, match="MASTER_ADDR"):
        slurm_env({"SLURM_PROCID": "0"})


def test_plan_executable_keeps_what_merak_exec_runs(tmp_path, capsys):
    from merak_sim.executable import unsupported
    from merak_sim.resolve import resolve_model

    model = {"family": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2,
             "seq_len": 32, "vocab": 128}
    (tmp_path / "m.json").write_text(json.dumps(model))
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", str(tmp_path / "m.json"), "--cluster", "local-cpu",
                 "--global-batch-size", "8", "--tp", "1,2,4", "--executable", "--no-confirm",
                 "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # a LLaMA: tp must divide its 2 kv heads, no sequence parallelism (built-in GPT only)
    assert all(row["tp"] in (1, 2) and not row["sequence_parallel"] and row["zero"] <= 1
               for row in d["top"])
    plan = Plan.load(out)
    assert unsupported(plan.parallel, resolve_model(plan.model)) is None
    assert main(["plan", "--model", "bert-large", "--cluster", "local-cpu",
                 "--global-batch-size", "8", "--executable", "--out", str(tmp_path / "b.json")]
                ) == 2
    assert "simulate-only" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
