"""Output paths: one checker (merak_sim.io.check_output_path) for merak-sim, merak-exec
and the Trainer refuses, in one line and before any work, an existing target that is
not a regular file (device, FIFO, socket, directory) and leaves it as it was; a
symlink is replaced as a link (its target untouched); an atomic write never renames
over a non-regular file, even one that appeared after the check."""

import os
import socket
import stat
from pathlib import Path

import pytest

from merak_sim.cli import main as sim_main
from merak_sim.io import OutputPathError, atomic_write_text, check_output_path

DEVICE = "/dev/full" if os.path.exists("/dev/full") else "/dev/null"
SCHEDULE = ["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]


def _identity(path: str) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, st.st_size


@pytest.fixture
def nodes(tmp_path):
    """kind -> an existing non-regular path of that kind."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir-link").symlink_to(tmp_path / "dir")
    yield {"a FIFO": str(fifo), "a socket": str(sock_path), "a character device": DEVICE,
           "a directory": str(tmp_path / "dir"), "a directory (symlink)":
           str(tmp_path / "dir-link")}
    sock.close()


def test_checker_refuses_every_non_regular_target_and_leaves_it(nodes):
    for kind, path in nodes.items():
        before = _identity(path)
        with pytest.raises(OutputPathError) as e:
            check_output_path(path)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{path}: is {kind.split(' (')[0]}")
        assert "give a file name" in msg
        assert _identity(path) == before


def test_checker_accepts_files_links_and_missing_folders(tmp_path):
    (tmp_path / "f.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "f.json")
    for p in ("f.json", "link.json", "new/deeper/t.json"):
        check_output_path(tmp_path / p)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "link.json"]
    atomic_write_text(tmp_path / "link.json", "new")
    assert not (tmp_path / "link.json").is_symlink()  # the link is replaced ...
    assert (tmp_path / "f.json").read_text() == "old"  # ... its target is not


def test_folder_outputs(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file, give a directory"):
        check_output_path(tmp_path / "file", folder=True)
    with pytest.raises(OutputPathError, match="is a character device, give a directory"):
        check_output_path(DEVICE, folder=True)
    with pytest.raises(OutputPathError, match="is not a directory; choose another path"):
        check_output_path(tmp_path / "file" / "sub", folder=True)
    check_output_path(tmp_path / "new" / "dir", folder=True)
    assert not (tmp_path / "new").exists()


def test_atomic_write_never_renames_over_a_node_that_appeared_later(tmp_path):
    fifo = tmp_path / "late"
    os.mkfifo(fifo)  # as if made between the check and the write
    before = _identity(str(fifo))
    with pytest.raises(OutputPathError, match="is a FIFO, not a regular file; not replaced"):
        atomic_write_text(fifo, "{}")
    assert _identity(str(fifo)) == before
    assert [p.name for p in tmp_path.iterdir()] == ["late"]  # no temporary file left


@pytest.mark.parametrize("flag", ["--csv", "--json-out", "--gantt"])
def test_merak_sim_refuses_nodes_in_one_line(nodes, capsys, flag):
    for kind, path in nodes.items():
        before = _identity(path)
        rc = sim_main([*SCHEDULE, flag, path])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert rc == 2 and len(err) == 1, (kind, err)
        assert err[0].startswith("merak-sim: error: ") and path in err[0], err
        if "directory" not in kind:  # click's own path type words a directory itself
            assert err[0].startswith(f"merak-sim: error: {flag} {path}: is {kind}"), err
        assert _identity(path) == before


def test_merak_exec_refuses_nodes_before_any_work(nodes, tmp_path):
    from support.cli_runs import run_commands

    (tmp_path / "plain").write_text("x")
    cases = [(["train", "--chrome-trace", nodes["a FIFO"]], nodes["a FIFO"]),
             (["train", "--chrome-trace", DEVICE], DEVICE),
             (["train", "--trace", nodes["a socket"]], nodes["a socket"]),
             (["profile", "--out", nodes["a directory"]], nodes["a directory"]),
             (["profile", "--out", DEVICE], DEVICE),
             (["train", "--save-dir", str(tmp_path / "plain")], str(tmp_path / "plain"))]
    before = {path: _identity(path) for _, path in cases}
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    done = run_commands([(argv, str(tmp_path)) for argv, _ in cases], env)
    for (argv, path), r in zip(cases, done, strict=True):
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(err) == 1, (argv, r.stderr)
        assert err[0].startswith("merak-exec: error: --") and f" {path}: is " in err[0], err
        assert "parameters:" not in r.stdout  # refused before the model was built
        assert _identity(path) == before[path]


def test_trainer_refuses_output_nodes_before_training(nodes, tmp_path):
    import torch

    from merak_exec.inputs import check_inputs
    from merak_exec.mesh import ExecError
    from merak_exec.trainer import TrainingArguments

    ds = [{"input_ids": torch.arange(4)}] * 2
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ExecError, match=f"TrainingArguments.trace_path {nodes['a FIFO']}: "
                                        "is a FIFO"):
        check_inputs(model, TrainingArguments(trace_path=nodes["a FIFO"]), ds, None)
    (tmp_path / "file").write_text("x")
    args = TrainingArguments(output_dir=str(tmp_path / "file" / "run"), save_steps=1)
    with pytest.raises(ExecError, match="TrainingArguments.output_dir .*is not a directory"):
        check_inputs(model, args, ds, None)
    assert Path(nodes["a FIFO"]).is_fifo()
