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
import signal
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
#: rendezvous, the world-wide gradient-norm all-reduce of iteration 2, the first
#: checkpoint collective of a resume (from a checkpoint a clean run saved first), and
#: "outside": real ``python -m merak_exec`` processes, the victim stopped (SIGSTOP) or
#: killed (SIGKILL) by the driver once rank 0 logged step 3, no fault hook involved
EXTRA_PHASES = {"groups": "op:creating the process groups",
                "grad-norm": "op:gradient-norm@2", "load": "op:checkpoint@1",
                "outside": None}
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
            extra = {"checkpoint": ["--save-dir", "ckpt", "--save-every", "2"],
                     "load": ["--resume", "ckpt/checkpoint-2"]}.get(phase, [])
            for mode in modes or MODES:
                case = {"layout": lay, "mode": mode, "phase": phase, "world": world,
                        "victim": v, "store": store,
                        "argv": ["train", *MODEL, *degrees, *extra],
                        "fault": f"{v}:{mode}:{ALL_PHASES[phase]}"}
                if phase == "outside":  # trains until stopped; the driver signals
                    case.update(real=True, signal={"stall": "stop"}.get(mode, mode),
                                fault=None, argv=["train", *MODEL[:-1], "100000", *degrees])
                if phase == "load":
                    case["pre_argv"] = ["train", *MODEL[:-1], "2", *degrees, "--save-dir",
                                        "ckpt", "--save-every", "2"]
                out.append(case)
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
    if case.get("setup_error"):
        return [f"the set-up run failed: {case['setup_error']}"]
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


def _rank_env(case: dict, rank: int, port: int, timeout_s: float) -> dict[str, str]:
    """What the launcher gives rank ``rank`` (torchrun's variables; the launcher's store
    or rank 0's; MERAK_FAULT when the case injects one)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
           "WORLD_SIZE": str(case["world"]), "LOCAL_RANK": str(rank),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "MERAK_TIMEOUT_S": str(timeout_s)}
    if case["store"] == "launcher":
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    if case["fault"]:
        env["MERAK_FAULT"] = case["fault"]
    return env


def _child(case: dict, env: dict[str, str], folder: Path, out: str, err: str) -> None:
    """A forked rank: its folder, environment and files, then the console entry with
    ``case["argv"]``; it never returns."""
    code = 1
    try:
        os.chdir(folder)
        os.environ.update(env)
        for fd, name in ((1, out), (2, err)):
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


class _Forked:
    """A forked rank, with the two calls of :class:`subprocess.Popen` used here."""

    def __init__(self, case: dict, env: dict[str, str], folder: Path, out: str,
                 err: str) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            _child(case, env, folder, out, err)
        self.returncode = None

    def poll(self) -> int | None:
        """The exit status once ended (reaped here), else None."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it."""
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        """Reap it (blocking); its exit status."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _start_rank(case: dict, rank: int, port: int, timeout_s: float, folder: Path,
                tag: str):
    """Rank ``rank`` of ``case``: forked from this driver, or with ``case["real"]`` a
    real ``python -m merak_exec`` process; its output in ``<tag>rank<r>.out/.err``."""
    env = _rank_env(case, rank, port, timeout_s)
    out, err = (str(folder / f"{tag}rank{rank}.{x}") for x in ("out", "err"))
    if not case.get("real"):
        return _Forked(case, env, folder, out, err)
    with open(out, "w") as fo, open(err, "w") as fe:
        return subprocess.Popen([sys.executable, "-m", "merak_exec", *case["argv"]],
                                cwd=folder, env={**os.environ, **env}, stdout=fo, stderr=fe)


class _Running:
    """One scenario's ranks, watched until the survivors have ended. A scenario with
    ``pre_argv`` first runs that command on every rank, without a fault, in a world of
    its own (it makes the checkpoint a faulted resume loads); one with ``signal``
    ("stop" or "kill") has no MERAK_FAULT: the victim gets SIGSTOP or SIGKILL from here
    once rank 0 has logged step 3."""

    def __init__(self, case: dict, timeout_s: float, folder: Path) -> None:
        self.case, self.timeout_s, self.folder = case, timeout_s, folder
        folder.mkdir(parents=True)
        self.stages = [(case["pre_argv"], None, "pre-")] if case.get("pre_argv") else []
        self.stages.append((case["argv"], case["fault"], ""))
        self.start = time.monotonic()
        self.fault: float | None = None
        self.setup_error: str | None = None
        self._launch()

    def _launch(self) -> None:
        """Start the first stage: its store (the launcher's) and its ranks."""
        from merak_exec.launch import free_port

        argv, fault, tag = self.stages[0]
        self.store_pid = None
        if self.case["store"] == "launcher":
            self.store_pid, port = _store_host(self.case["world"])
        else:
            port = free_port()
        stage = {**self.case, "argv": argv, "fault": fault}
        self.procs = {r: _start_rank(stage, r, port, self.timeout_s, self.folder, tag)
                      for r in range(self.case["world"])}
        self.ended: dict[int, tuple[float, int]] = {}

    def poll(self) -> bool:
        """Reap what ended and notice the fault; True when the scenario is over."""
        now = time.monotonic()
        for r, proc in self.procs.items():
            if r not in self.ended and proc.poll() is not None:
                self.ended[r] = (now, proc.returncode)
        if len(self.stages) > 1:  # the set-up run
            return self._setup_poll(now)
        v = self.case["victim"]
        if self.fault is None:
            self._notice_fault(v, now)
        if all(r in self.ended for r in self.procs if r != v):
            return True
        hard = (self.start + SETUP_LIMIT_S if self.fault is None
                else self.fault + self.timeout_s + 3 * SLACK_S)
        return now > hard

    def _setup_poll(self, now: float) -> bool:
        """The set-up run: once every rank ended well, start the faulted one."""
        if len(self.ended) == len(self.procs):
            bad = [r for r, (_, code) in self.ended.items() if code != 0]
            if bad:
                self.setup_error = f"rank {bad[0]}: {self._read(bad[0], 'pre-')[-300:]}"
                return True
            self._stop_store()
            self.stages.pop(0)
            self._launch()
        return now > self.start + SETUP_LIMIT_S

    def _notice_fault(self, v: int, now: float) -> None:
        """The fault's time: the victim's MERAK_FAULT line (written just before it), or
        the signal sent from here once rank 0 logged step 3."""
        sig = self.case.get("signal")
        if sig is None:
            if "MERAK_FAULT" in self._read(v):
                self.fault = now
        elif "step 3 " in self._read(0, ext="out") and v not in self.ended:
            os.kill(self.procs[v].pid, signal.SIGSTOP if sig == "stop" else signal.SIGKILL)
            self.fault = now

    def _read(self, r: int, tag: str = "", ext: str = "err") -> str:
        try:
            return (self.folder / f"{tag}rank{r}.{ext}").read_text(errors="replace")
        except OSError:
            return ""

    def _stop_store(self) -> None:
        if self.store_pid is not None:
            os.kill(self.store_pid, signal.SIGKILL)
            os.waitpid(self.store_pid, 0)
            self.store_pid = None

    def finish(self) -> dict:
        """Kill what is left, reap it; the scenario's result."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._stop_store()
        v, ranks = self.case["victim"], {}
        for r in self.procs:
            if r == v or self.setup_error:
                continue
            t, code = self.ended.get(r, (None, None))
            after = (t - self.fault) if (t is not None and self.fault is not None) else None
            ranks[str(r)] = {"code": code, "after_s": after if after is not None else
                             float("inf"),
                             "stderr": [ln for ln in self._read(r).splitlines() if ln.strip()]}
        fired = None if self.fault is None else self.fault - self.start
        return {**self.case, "fired": fired, "ranks": ranks, "setup_error": self.setup_error}


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
