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
    f = write_launch(p, "slurm", nodes=2, gpus_per_node=4, out_dir=tmp_path / "s",
                     script="train.py")
    text = f.launcher.read_text()
    assert "#SBATCH --nodes=2" in text and "srun torchrun" in text and "train.py" in text


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
