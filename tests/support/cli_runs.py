"""Many ``merak-exec`` command lines for the price of one interpreter start.

:func:`run_commands` starts one Python process that imports the backend (torch
included) once and then forks a child per command line. Each child changes to its own
working directory, points its stdout and stderr at files of its own and calls the
console entry point ``merak_exec.__main__.main`` with the command's arguments, so it
runs the same code as ``python -m merak_exec ...`` after that command's imports, and
ends with that command's exit status. The tests of what a command prints and returns
use it; the real console script keeps its own subprocess tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["run_commands"]


def run_commands(commands: list[tuple[list[str], str]], env: dict,
                 timeout_s: float = 300) -> list[subprocess.CompletedProcess]:
    """Run every ``(argv, cwd)`` of ``commands`` (argv without the program name) as
    described in the module docstring; return one CompletedProcess per command, in
    order (``args`` is the argv, ``stdout`` / ``stderr`` text)."""
    with tempfile.TemporaryDirectory(prefix="merak-cli-") as scratch:
        job = Path(scratch) / "job.json"
        job.write_text(json.dumps({"commands": commands, "dir": scratch}))
        p = subprocess.run([sys.executable, __file__, str(job)], env=env, cwd=scratch,
                           capture_output=True, text=True, timeout=timeout_s)
        codes_file = Path(scratch) / "codes.json"
        if p.returncode != 0 or not codes_file.exists():
            raise RuntimeError(f"command driver failed ({p.returncode}): {p.stderr[-2000:]}")
        codes = json.loads(codes_file.read_text())
        return [subprocess.CompletedProcess(
            argv, code, (Path(scratch) / f"{i}.out").read_text(),
            (Path(scratch) / f"{i}.err").read_text())
            for i, ((argv, _), code) in enumerate(zip(commands, codes, strict=True))]


def _child(argv: list[str], cwd: str, out: str, err: str) -> None:
    """In the forked child: run one command line and exit with its status."""
    code = 1
    try:
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = [sys.argv[0], *argv]
        from merak_exec.__main__ import main

        main(argv)  # exits by itself on an error (os._exit); returns on success
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report anything, as an interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _drive(job_path: str) -> None:
    """The driver process: import once, fork per command, record the exit statuses."""
    # The imports the commands would each pay, paid once here.
    import torch  # noqa: F401

    import merak_exec  # noqa: F401
    import merak_exec.__main__  # noqa: F401
    import merak_exec.builders  # noqa: F401
    import merak_sim.executable  # noqa: F401
    import merak_sim.plan  # noqa: F401
    import merak_sim.resolve  # noqa: F401

    job = json.loads(Path(job_path).read_text())
    codes = []
    for i, (argv, cwd) in enumerate(job["commands"]):
        out, err = (os.path.join(job["dir"], f"{i}.{s}") for s in ("out", "err"))
        pid = os.fork()
        if pid == 0:
            _child(argv, cwd, out, err)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    Path(job["dir"], "codes.json").write_text(json.dumps(codes))


if __name__ == "__main__":
    _drive(sys.argv[1])
