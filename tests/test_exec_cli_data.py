"""merak-exec train on real data from the command line: --data with evaluation, a
final checkpoint and --export-hf in one process; --config TOML with flags winning;
merak-exec export; the batch and checkpoint options' clashes as one line."""

import subprocess
import sys

import numpy as np
import pytest

ENV_KEYS = {"OMP_NUM_THREADS": "1"}


def _run(args, cwd, timeout=240):
    import os

    env = {**os.environ, **ENV_KEYS}
    return subprocess.run([sys.executable, "-m", "merak_exec", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-data")
    rng = np.random.default_rng(0)
    np.tile(rng.integers(0, 256, 200, dtype=np.uint16), 12).tofile(d / "tokens.bin")
    (d / "job.toml").write_text('steps = 4\nlr = 3e-3\neval-every = 2\n'
                                'eval_fraction = 0.1\nsave-dir = "ck"\nseed = 1\n')
    p = _run(["train", "--data", "tokens.bin", "--config", "job.toml", "--steps", "5",
              "--export-hf", "hf"], d)
    return d, p


def test_token_ids_beyond_the_vocabulary_are_one_line(run):
    d, _ = run
    p = _run(["train", "--data", "tokens.bin", "--vocab", "100"], d)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "outside the model's vocabulary of 100" in p.stderr


def test_train_on_data_evaluates_saves_and_exports(run):
    d, p = run
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split()[2] for ln in lines if ln.startswith("eval step")] == ["2", "4", "5"]
    assert sum(ln.startswith("step ") for ln in lines) == 5  # --steps beats the file's 4
    assert sorted(x.name for x in (d / "ck").iterdir()) == ["checkpoint-5"]
    assert (d / "hf" / "config.json").is_file() and (d / "hf" / "model.safetensors").is_file()
    again = _run(["export", "ck/checkpoint-5", "--hf", "hf2"], d)
    assert again.returncode == 0 and (d / "hf2" / "model.safetensors").is_file()
    exists = _run(["export", "ck/checkpoint-5", "--hf", "hf2"], d)
    assert exists.returncode == 2 and exists.stderr.count("\n") == 1
    assert "hf2 exists" in exists.stderr


@pytest.mark.parametrize("args,text", [
    (["--config", "bad.toml"], "unknown key 'stepz'"),
    (["--save-every", "2"], "--save-every needs --save-dir"),
    (["--microbatches", "2", "--global-batch-size", "8"], "disagree"),
    (["--global-batch-size", "3", "--dp", "1", "--micro-batch-size", "2"], "not divisible"),
    (["--data", "missing.bin"], "no data at missing.bin"),
])
def test_clashes_and_bad_data_are_one_line(tmp_path, monkeypatch, capsys, args, text):
    """Refused before any rank starts: run in this process (merak_exec.__main__.run)."""
    from merak_exec.__main__ import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "bad.toml").write_text("stepz = 3\n")
    code = run(["train", *args])
    err = capsys.readouterr().err
    assert code == 2 and text in err and err.count("\n") == 1, err
