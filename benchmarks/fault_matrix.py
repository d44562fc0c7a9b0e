"""Fault matrix of ``merak-exec train``: a rank killed or stalled, and what the others say.

For every layout (pp2, tp2, dp2, pp2xtp2, ZeRO-3 over dp2), fault (``kill``: the rank
SIGKILLs itself; ``stall``: it sleeps past every timeout) and phase (``startup``: before
the rendezvous; ``mid-step``: the middle of iteration 2's program; ``checkpoint``:
entering the second checkpoint collective of the first save, after the rank wrote its
share), one rank (the last, or ``--victim``) is faulted through ``MERAK_FAULT``
(:mod:`merak_exec.mesh`). A run passes when every other rank exits within
``MERAK_TIMEOUT_S + 10`` s of the fault with exactly one stderr line, the merak line
naming itself and a peer, no traceback, exit status 1.

The ranks are forked from one driver process that imported torch and the backend once
(each command then runs ``merak_exec.__main__.main`` with its arguments, as
``python -m merak_exec`` does after its imports), so a scenario costs its training
start and its timeout, not interpreter starts; ``--jobs`` scenarios run side by side
(their ranks mostly wait). The rendezvous store is the launcher's, as under torchrun
(a forked store process bound to a port the kernel picks, so no launch races for a
port), or with ``--store rank0`` hosted by rank 0, as under srun (then a lost rank 0
takes the store with it). Run:

    .venv/bin/python benchmarks/fault_matrix.py [--timeout 3] [--jobs 3] [--layouts pp2,tp2]
        [--modes kill,stall] [--phases startup,mid-step,checkpoint] [--victim last|N]
        [--store launcher|rank0]

prints a table (one row per layout and phase, one column per fault) and exits 1 when
any run failed; ``--verbose`` adds every survivor's line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = ["--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "32", "--seq", "8",
         "--microbatches", "2", "--steps", "6"]
LAYOUTS = {"pp2": (2, ["--pp", "2"]), "tp2": (2, ["--tp", "2"]), "dp2": (2, ["--dp", "2"]),
           "pp2xtp2": (4, ["--pp", "2", "--tp", "2"]),
           "zero3": (2, ["--dp", "2", "--zero", "3"])}
#: phase -> the MERAK_FAULT place (the checkpoint's second collective of its first save:
#: the rank has written its share and the others wait for it)
PHASES = {"startup": "startup", "mid-step": "step@2", "checkpoint": "op:checkpoint@2"}
#: further places, asked for by name (--phases): the groups' creation after the
#: rendezvous and the world-wide gradient-norm all-reduce of iteration 2
EXTRA_PHASES = {"groups": "op:creating the process groups",
                "grad-norm": "op:gradient-norm@2"}
MODES = ("kill", "stall")
ALL_PHASES = {**PHASES, **EXTRA_PHASES}
SLACK_S = 10.0  # the promise: every survivor ends within MERAK_TIMEOUT_S + SLACK_S
SETUP_LIMIT_S = 180.0  # a scenario whose fault has not fired by then is abandoned

__all__ = ["MODEL", "LAYOUTS", "PHASES", "EXTRA_PHASES", "ALL_PHASES", "MODES", "SLACK_S",
           "scenarios", "run_matrix", "judge", "table"]


def scenarios(layouts=None, modes=None, phases=None, victim: str = "last",
              store: str = "launcher") -> list[dict]:
    """Every (layout, mode, phase) asked for, as scenario dicts for :func:`run_matrix`
    (``victim``: "last" or a rank; ``store``: "launcher" or "rank0")."""
    out = []
    for lay in layouts or LAYOUTS:
        world, degrees = LAYOUTS[lay]
        v = world - 1 if victim == "last" else int(victim)
        for phase in phases or PHASES:
            extra = ["--save-dir", "ckpt", "--save-every", "2"] if phase == "checkpoint" else []
            for mode in modes or MODES:
                argv = ["train", *MODEL, *degrees, *extra]
                out.append({"layout": lay, "mode": mode, "phase": phase, "world": world,
                            "victim": v, "store": store, "argv": argv,
                            "fault": f"{v}:{mode}:{ALL_PHASES[phase]}"})
    return out


def run_matrix(cases: list[dict], timeout_s: float = 3.0, jobs: int = 3) -> list[dict]:
    """Run ``cases`` (:func:`scenarios`) in a fresh driver process; each comes back with
    ``fired`` (seconds from its start to the fault, None if it never fired) and
    ``ranks``: for every survivor its exit ``code`` (None: killed at the hard limit),
    ``after_s`` (from the fault to its exit) and ``stderr`` (non-empty lines)."""
    with tempfile.TemporaryDirectory(prefix="merak-faults-") as scratch:
        job = Path(scratch) / "job.json"
        job.write_text(json.dumps({"cases": cases, "timeout_s": timeout_s, "jobs": jobs,
                                   "dir": scratch}))
        limit = len(cases) * (SETUP_LIMIT_S + timeout_s + 40)
        p = subprocess.run([sys.executable, __file__, "--driver", str(job)], cwd=scratch,
                           capture_output=True, text=True, timeout=limit)
        res = Path(scratch) / "results.json"
        if p.returncode != 0 or not res.exists():
            raise RuntimeError(f"fault driver failed ({p.returncode}): {p.stderr[-2000:]}")
        return json.loads(res.read_text())


def judge(case: dict, timeout_s: float) -> list[str]:
    """What is wrong with one finished case (empty: it passed)."""
    if case["fired"] is None:
        return ["the fault never fired"]
    bad = []
    for r, got in case["ranks"].items():
        lines, head = got["stderr"], f"merak-exec: error: merak_exec: rank {r} "
        if got["code"] is None or got["after_s"] > timeout_s + SLACK_S:
            bad.append(f"rank {r} ended {got['after_s']:.1f} s after the fault")
        elif got["code"] != 1:
            bad.append(f"rank {r} exit status {got['code']}")
        if len(lines) != 1:
            bad.append(f"rank {r} printed {len(lines)} lines: {lines[:3]}")
        elif not lines[0].startswith(head) or "rank" not in lines[0][len(head):]:
            bad.append(f"rank {r}: {lines[0][:200]}")
        if any("Traceback" in ln or ln.startswith("frame #") for ln in lines):
            bad.append(f"rank {r} printed a traceback")
    return bad


def table(results: list[dict], timeout_s: float, verbose: bool = False) -> str:
    """A markdown table: one row per (layout, phase), one column per fault mode; each
    cell "ok, N s" (the slowest survivor) or what went wrong."""
    modes = list(dict.fromkeys(c["mode"] for c in results))
    rows = {}
    for c in results:
        bad = judge(c, timeout_s)
        slowest = max((g["after_s"] for g in c["ranks"].values()), default=0.0)
        cell = f"ok, {slowest:.1f} s" if not bad else "FAIL: " + "; ".join(bad)[:120]
        rows.setdefault((c["layout"], c["phase"]), {})[c["mode"]] = cell
    out = [f"| layout | phase | {' | '.join(modes)} |", "|" + " --- |" * (2 + len(modes))]
    for (lay, phase), cells in rows.items():
        out.append(f"| {lay} | {phase} | " + " | ".join(cells.get(m, "") for m in modes) + " |")
    if verbose:
        for c in results:
            for r, g in c["ranks"].items():
                out.append(f"{c['layout']} {c['phase']} {c['mode']} rank {r} "
                           f"({g['after_s']:.1f} s): " + " / ".join(g["stderr"])[:300])
    return "\n".join(out)


# -- the driver (a process of its own: it forks the ranks) ----------------------------
def _store_host(world: int) -> tuple[int, int]:
    """Fork a process serving a rendezvous store on a port the kernel picks (the
    launcher's store, as torchrun's agent serves one); returns (its pid, the port)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            import datetime

            import torch.distributed as dist

            os.close(r)
            store = dist.TCPStore("127.0.0.1", 0, world, is_master=True,
                                  wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=SETUP_LIMIT_S))
            os.write(w, str(store.port).encode())
            os.close(w)
            time.sleep(10 * SETUP_LIMIT_S)  # until the scenario ends it
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        return pid, int(f.read() or 0)


def _child(case: dict, rank: int, port: int, timeout_s: float, folder: Path) -> None:
    """A forked rank: the launcher's environment, its own files, the console entry."""
    code = 1
    try:
        os.chdir(folder)
        if case["store"] == "launcher":
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(case["world"]), LOCAL_RANK=str(rank),
                          GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                          MERAK_TIMEOUT_S=str(timeout_s), MERAK_FAULT=case["fault"])
        for fd, name in ((1, f"rank{rank}.out"), (2, f"rank{rank}.err")):
            f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        from merak_exec.__main__ import main

        main(case["argv"])  # ends the process itself on an error
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - an escaped exception shows as an interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Running:
    """One scenario's forked ranks, watched until the survivors have ended."""

    def __init__(self, case: dict, timeout_s: float, folder: Path) -> None:
        from merak_exec.launch import free_port

        self.case, self.timeout_s, self.folder = case, timeout_s, folder
        folder.mkdir(parents=True)
        self.store_pid = None
        if case["store"] == "launcher":
            self.store_pid, port = _store_host(case["world"])
        else:
            port = free_port()
        self.pids = {}
        for r in range(case["world"]):
            pid = os.fork()
            if pid == 0:
                _child(case, r, port, timeout_s, folder)
            self.pids[r] = pid
        self.start = time.monotonic()
        self.ended: dict[int, tuple[float, int]] = {}
        self.fault: float | None = None

    def poll(self) -> bool:
        """Reap what ended and notice the fault; True when the scenario is over."""
        now = time.monotonic()
        for r, pid in self.pids.items():
            if r not in self.ended:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.ended[r] = (now, os.waitstatus_to_exitcode(status))
        v = self.case["victim"]
        if self.fault is None and "MERAK_FAULT" in self._err(v):  # written just before
            self.fault = now
        survivors = [r for r in self.pids if r != v]
        if all(r in self.ended for r in survivors):
            return True
        hard = (self.start + SETUP_LIMIT_S if self.fault is None
                else self.fault + self.timeout_s + 3 * SLACK_S)
        return now > hard

    def _err(self, r: int) -> str:
        try:
            return (self.folder / f"rank{r}.err").read_text(errors="replace")
        except OSError:
            return ""

    def finish(self) -> dict:
        """Kill what is left, reap it; the scenario's result."""
        for r, pid in self.pids.items():
            if r not in self.ended:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
        if self.store_pid is not None:
            os.kill(self.store_pid, 9)
            os.waitpid(self.store_pid, 0)
        v, ranks = self.case["victim"], {}
        for r in self.pids:
            if r == v:
                continue
            t, code = self.ended.get(r, (None, None))
            after = (t - self.fault) if (t is not None and self.fault is not None) else None
            ranks[str(r)] = {"code": code, "after_s": after if after is not None else
                             float("inf"),
                             "stderr": [ln for ln in self._err(r).splitlines() if ln.strip()]}
        fired = None if self.fault is None else self.fault - self.start
        return {**self.case, "fired": fired, "ranks": ranks}


def _drive(job_path: str) -> None:
    """Import once, then run the job's cases, ``jobs`` at a time; write the results."""
    import torch
    import torch._dynamo  # noqa: F401  (imported lazily by the first model build)

    import merak_exec.__main__  # noqa: F401
    import merak_exec.builders  # noqa: F401
    import merak_exec.trainer  # noqa: F401

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    todo = list(enumerate(job["cases"]))
    running: list[tuple[int, _Running]] = []
    results: list = [None] * len(todo)
    while todo or running:
        while todo and len(running) < job["jobs"]:
            i, case = todo.pop(0)
            running.append((i, _Running(case, job["timeout_s"], Path(job["dir"]) / f"case{i}")))
        time.sleep(0.02)
        for i, run in list(running):
            if run.poll():
                results[i] = run.finish()
                running.remove((i, run))
    Path(job["dir"], "results.json").write_text(json.dumps(results))


def main() -> None:
    """Command line: run the matrix, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=3.0, help="MERAK_TIMEOUT_S of the runs")
    ap.add_argument("--jobs", type=int, default=3, help="scenarios run side by side")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"of {', '.join(ALL_PHASES)}")
    ap.add_argument("--victim", default="last", help="the faulted rank: last or a number")
    ap.add_argument("--store", choices=["launcher", "rank0"], default="launcher",
                    help="who hosts the rendezvous store")
    ap.add_argument("--verbose", action="store_true", help="also every survivor's line")
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver:
        _drive(a.driver)
        return
    picks = {k: [x for x in getattr(a, k).split(",") if x] for k in ("layouts", "modes", "phases")}
    known = {"layouts": LAYOUTS, "modes": MODES, "phases": ALL_PHASES}
    for k, vals in picks.items():
        wrong = [x for x in vals if x not in known[k]]
        if wrong:
            ap.error(f"--{k}: unknown {', '.join(wrong)}; choose from {', '.join(known[k])}")
    t0 = time.monotonic()
    res = run_matrix(scenarios(victim=a.victim, store=a.store, **picks), a.timeout, a.jobs)
    print(table(res, a.timeout, a.verbose))
    failed = sum(1 for c in res if judge(c, a.timeout))
    print(f"\n{len(res) - failed} of {len(res)} runs passed (MERAK_TIMEOUT_S={a.timeout:g}, "
          f"{time.monotonic() - t0:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
