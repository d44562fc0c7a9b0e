"""Launch and topology: torch.distributed start-up and the dp/tp/pp process groups.

Ranks sit where :class:`merak_sim.layout.RankLayout` puts them (Megatron's order: tp
fastest, then dp, then pp), the placement the simulator prices.

Every process must create every group in the same order (``new_group`` is a
collective over the world), so :func:`build_mesh` creates all of the layout's groups,
in the layout's order, on every rank and keeps the ones it belongs to. Point-to-point
traffic gets one two-rank group per directed channel of
:func:`merak_sim.schedule.posting.channels` (activations forward, gradients back), each
initialised by a one-element all-reduce of both its ranks before any transfer: NCCL
creates a communicator collectively on its first use, and the posting proof
(:mod:`merak_sim.schedule.posting`) counts on one communicator (one stream) per channel.

Every collective and wait of the backend is bounded by ``MERAK_TIMEOUT_S``
(:func:`wait_for`, :func:`timed_collective`, :func:`bounded`): a lost or stalled peer
becomes one :class:`RankTimeoutError` line naming this rank, the operation and the
peer. When an operation with several peers times out, the survivors report to the
rendezvous store and wait a short grace for each other, so the line also says which
peers never reported (the lost ones; a kill shows at once as a closed connection, so
that probe is for timeouts only). The launch environment is checked before any
connection (:func:`check_launch_env`), and the rendezvous is merak's own check-in on
torch's TCPStore, so a rank that never arrives is named.

Fault injection (tests and ``benchmarks/fault_matrix.py``): ``MERAK_FAULT=RANK:MODE:WHERE``
makes rank RANK kill itself (``kill``, SIGKILL) or sleep past every timeout (``stall``)
at WHERE: ``startup`` (before the rendezvous), ``step@N`` (the middle of the N-th
iteration's program, :mod:`merak_exec.runtime`) or ``op:TEXT[@N]`` (entering the N-th
bounded operation whose description contains TEXT, e.g. ``op:checkpoint@2``); it
writes one ``MERAK_FAULT`` line to stderr first. Unset, :func:`fault_point` costs one
dictionary look-up.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.schedule.posting import channels

__all__ = ["ExecError", "RankTimeoutError", "NonFiniteError", "Mesh", "init_distributed",
           "build_mesh", "default_timeout_s", "check_launch_env", "wait_for",
           "timed_collective", "peers_text", "peer_failure", "is_comm_failure", "bounded",
           "fault_point", "fault_spec",
           "first_slurm_host",
           "slurm_env", "all_reduce_gradients"]


class ExecError(ValueError):
    """Bad input to the real backend (degrees, model, checkpoint): the message names the
    problem and the fix."""


class RankTimeoutError(RuntimeError):
    """A wait for a peer exceeded the timeout or the peer went away: it is probably
    dead or stuck (the message is one line naming this rank, the operation and the
    peer)."""


class NonFiniteError(ExecError):
    """Training diverged: the loss or the global gradient norm is not finite (for fp16,
    after the loss scaler has given up). The message is one line naming the step."""


#: Longest accepted MERAK_TIMEOUT_S (about 11.6 days): beyond it no wait is meaningful
#: and torch's timedelta arithmetic overflows.
MAX_TIMEOUT_S = 1e6


def default_timeout_s() -> float:
    """Timeout for every wait, from MERAK_TIMEOUT_S (default 60 s): short, so a lost
    rank turns into a clear error on the others rather than a hang. Anything but a
    finite number of seconds in (0, 1e6] is an :class:`ExecError`."""
    text = os.environ.get("MERAK_TIMEOUT_S", "60")
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        raise ExecError(f"MERAK_TIMEOUT_S={text!r}: give a finite number of seconds above 0 "
                        f"and at most {MAX_TIMEOUT_S:g} (the bound on every wait for a peer)")
    return t


def loopback_env(rank: int, world: int, port: int) -> None:
    """Make this process rank ``rank`` of a ``world``-process group on 127.0.0.1:``port``
    (the environment torchrun would set, gloo on the loopback device) with one torch
    thread, as each of several processes sharing a small CPU machine should run.
    Call :func:`init_distributed` afterwards."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)


def _first_line(e: BaseException) -> str:
    """The gist of a torch error: its first line without the C++ source location
    (``[/path/pair.cc:553] ``, a path outside this repository), at most 160 characters."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    line = re.sub(r"^\[[^\]]*:\d+\]\s*", "", line).strip() or type(e).__name__
    line = re.split(r"(?<=[.!]) (?=This is typically|Check the logs)", line)[0]
    line = line.rstrip(" .")
    return line if len(line) <= 160 else line[:157].rstrip() + "..."


def _my_rank() -> int | str:
    """This process's global rank (from the launcher's environment before the
    rendezvous)."""
    return dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")


# -- fault injection ----------------------------------------------------------------
_FAULT: dict = {}  # "spec": the parsed MERAK_FAULT (None when unset), "seen": matches


def fault_spec() -> tuple[int, str, str, int] | None:
    """MERAK_FAULT parsed once: (rank, mode, where, nth) or None."""
    if "spec" not in _FAULT:
        text = os.environ.get("MERAK_FAULT", "").strip()
        spec = None
        if text:
            m = re.fullmatch(r"(\d+):(kill|stall):(startup|step@\d+|op:.+?)(?:@(\d+))?", text)
            if m is None or (m.group(3).startswith("step@") and m.group(4)):
                raise ExecError(f"MERAK_FAULT={text!r}: write RANK:kill|stall:WHERE with WHERE "
                                "startup, step@N or op:TEXT[@N]")
            spec = (int(m.group(1)), m.group(2), m.group(3), int(m.group(4) or 1))
        _FAULT.update(spec=spec, seen=0)
    return _FAULT["spec"]


def fault_point(label: str, op: bool = False) -> None:
    """Kill or stall this process here if MERAK_FAULT says so (module docstring):
    ``label`` is ``"startup"`` or ``"step@N"``, or with ``op`` the description of a
    bounded operation, matched by the spec's ``op:TEXT``."""
    spec = _FAULT["spec"] if "spec" in _FAULT else fault_spec()
    if spec is None or str(_my_rank()) != str(spec[0]):
        return
    rank, mode, where, nth = spec
    if not (where == label if not op else where.startswith("op:") and where[3:] in label):
        return
    _FAULT["seen"] += 1
    if _FAULT["seen"] != nth:
        return
    sys.stderr.flush()
    os.write(2, f"merak_exec: MERAK_FAULT: rank {rank} {mode} at {label}\n".encode())
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3 * default_timeout_s() + 30)  # past every peer's timeout, yet bounded
    os._exit(1)


# -- bounded waits --------------------------------------------------------------------
_RDZV: dict = {}  # "store": the rendezvous TCPStore, "prefix": merak's keys in it


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 inside the block: torch's C++ side logs every failed
    connection attempt of a rendezvous or store call with a stack of frames, while the
    Python exception raised afterwards carries the one line worth showing."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _ranks(ranks: list[int], limit: int = 8) -> str:
    """"rank 3", "ranks 1, 3" (the first ``limit``, then how many more)."""
    shown = ", ".join(map(str, ranks[:limit]))
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


def _report_failure() -> bool:
    """Mark this rank in the rendezvous store as alive but failed (one short store call):
    what :func:`_silent_peers` on the other ranks looks for. False when the store cannot
    be reached (none kept, or its host ended)."""
    store = _RDZV.get("store")
    if store is None:
        return False
    try:
        with _quiet_stderr():
            store.set_timeout(datetime.timedelta(seconds=min(2.0, default_timeout_s() / 2)))
            store.set(f"{_RDZV['prefix']}/failed/{_my_rank()}", b"1")
        return True
    except RuntimeError:
        return False


def _silent_peers(peers: list[int]) -> str:
    """After an operation with several ``peers`` timed out: give them a short grace to
    report failing too (every rank reports any failure; the live peers of a lost rank
    time out alike, or fail at once when a neighbour ends) and name those that did not.
    Empty when the store cannot tell. Only after a timeout: a rank that failed at once
    (a closed connection) would otherwise blame live peers still inside their wait."""
    store, key, left = _RDZV.get("store"), f"{_RDZV.get('prefix')}/failed/", list(peers)
    deadline = time.monotonic() + min(2.0, default_timeout_s() / 2)
    try:
        with _quiet_stderr():
            while left and time.monotonic() < deadline:
                left = [p for p in left if not store.check([f"{key}{p}"])]
                time.sleep(0.05 if left else 0)
    except RuntimeError:  # the store's host ended; what was seen so far still holds
        if len(left) == len(peers):
            return ""
    return f"; {_ranks(left)} did not report in (dead or stalled)" if left else ""


def peer_failure(what: str, peers: list[int] | None, timeout_s: float,
                 error: BaseException | None) -> RankTimeoutError:
    """The one-line error of a failed bounded operation ``what`` with ``peers`` (global
    ranks; None: unknown): ``error`` is torch's (None for a plain timeout). What
    :func:`timed_collective` and :func:`bounded` raise; for other places that catch a
    torch.distributed failure themselves (an action's tensor-parallel collective)."""
    return RankTimeoutError(_failure(what, peers, timeout_s, error))


def _failure(what: str, peers: list[int] | None, t: float, e: BaseException | None) -> str:
    """The line of :func:`peer_failure`."""
    with_peers = f" with {_ranks(peers)}" if peers else ""
    cause = f"(timeout {t:g} s): {'timed out' if e is None else _first_line(e)}"
    timed_out = e is None or "timed out" in str(e).lower() or "timeout" in str(e).lower()
    reported = _report_failure()
    lost = _silent_peers(peers) if reported and timed_out and peers and len(peers) > 1 else ""
    return (f"merak_exec: rank {_my_rank()} failed in {what}{with_peers} {cause}"
            f"{lost or '; a peer rank probably died or stalled'}")


def wait_for(work, what: str, timeout_s: float | None = None, rank: int | None = None) -> None:
    """Wait for torch.distributed ``work`` at most ``timeout_s`` (default
    MERAK_TIMEOUT_S); raise a one-line :class:`RankTimeoutError` saying that ``rank``
    (default this process's) gave up waiting for ``what`` (name the peer in it)."""
    t = default_timeout_s() if timeout_s is None else timeout_s
    r = _my_rank() if rank is None else rank
    try:
        ok = work.wait(datetime.timedelta(seconds=t))
    except RuntimeError as e:
        _report_failure()
        raise RankTimeoutError(
            f"merak_exec: rank {r} failed waiting for {what} (timeout {t:g} s): "
            f"{_first_line(e)}; a peer rank probably died or stalled") from None
    if ok is False:
        _report_failure()
        raise RankTimeoutError(f"merak_exec: rank {r} timed out after {t:g} s waiting for "
                               f"{what}; a peer rank probably died or stalled")


#: What torch's communication errors say when they arrive as a plain RuntimeError (a
#: gloo work's ``wait()`` inside FSDP's hooks raises one).
_COMM_MARKERS = ("/gloo/", "NCCL", "c10d", "ProcessGroup", "Connection closed by peer",
                 "Connection reset by peer", "Timed out waiting", "Operation timed out")


def is_comm_failure(e: BaseException) -> bool:
    """Whether ``e`` is a torch.distributed failure (a store or group timeout, a closed
    connection): a DistError, a RuntimeError with a gloo / NCCL / c10d message, or
    DCP's CheckpointException gathering one."""
    return _comm_cause(e) is not None


def _comm_cause(e: BaseException) -> BaseException | None:
    """The communication failure ``e`` is or wraps (see :func:`is_comm_failure`)."""
    if isinstance(e, dist.DistError):
        return e
    if isinstance(e, RuntimeError) and not isinstance(e, RankTimeoutError):
        return e if any(m in str(e) for m in _COMM_MARKERS) else None
    api = sys.modules.get("torch.distributed.checkpoint.api")
    if api is not None and isinstance(e, api.CheckpointException):
        for f in getattr(e, "failures", {}).values():  # (exception, its stack) per rank
            inner = f[0] if isinstance(f, tuple) else f
            if isinstance(inner, BaseException) and _comm_cause(inner) is not None:
                return _comm_cause(inner)
    return None


@contextlib.contextmanager
def bounded(what: str, group=None, quiet: bool = False):
    """Turn a torch.distributed failure inside the block (a store or group timeout, a
    closed connection, DCP's CheckpointException of one) into one
    :class:`RankTimeoutError` line naming this rank, ``what`` and the other ranks of
    ``group`` (default: the whole world). The block is a fault point (``op:TEXT``).
    ``quiet``: silence stderr inside it (torch's C++ store client logs every timed-out
    poll with frames; for start-up blocks that print nothing else)."""
    fault_point(what, op=True)
    try:
        with _quiet_stderr() if quiet else contextlib.nullcontext():
            yield
    except RankTimeoutError:
        raise
    except BaseException as e:
        cause = _comm_cause(e)
        if cause is None:
            raise
        peers = _peers(group) if dist.is_initialized() else None
        raise RankTimeoutError(_failure(what, peers, default_timeout_s(), cause)) from None


def _peers(group) -> list[int]:
    """The other members of ``group`` (global ranks; None: the world)."""
    me = dist.get_rank()
    ranks = (range(dist.get_world_size()) if group is None
             else dist.get_process_group_ranks(group))
    return [r for r in ranks if r != me]


def peers_text(group) -> str:
    """"rank 3" or "ranks 1, 3": the other members of ``group`` (global ranks)."""
    return _ranks(_peers(group))


def timed_collective(fn: Callable, *args, group, what: str,
                     timeout_s: float | None = None, **kwargs) -> None:
    """Run the collective ``fn(*args, group=group, async_op=True, **kwargs)`` (e.g.
    ``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather``,
    ``dist.reduce_scatter``) and wait for it within ``timeout_s``
    (default MERAK_TIMEOUT_S); a failure, posting included, is one
    :class:`RankTimeoutError` line naming this rank, ``what`` and the group's other
    ranks (after a timeout with several, also those that did not report in: the lost
    ones). Entering it is a fault point (``op:TEXT``)."""
    fault_point(what, op=True)
    t = default_timeout_s() if timeout_s is None else timeout_s
    try:
        ok = fn(*args, group=group, async_op=True, **kwargs).wait(
            datetime.timedelta(seconds=t))
    except RuntimeError as e:
        raise RankTimeoutError(_failure(what, _peers(group), t, e)) from None
    if ok is False:
        raise RankTimeoutError(_failure(what, _peers(group), t, None))


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list, compressed or not: ``"gpu[01-04,07],cpu3"``
    -> ``"gpu01"``, ``"rack[2-3]-n[5-6]"`` -> ``"rack2-n5"``, ``"a1,a2"`` -> ``"a1"``
    (what ``scontrol show hostnames`` would print first, without needing scontrol)."""
    text, depth, first = nodelist.strip(), 0, []
    for ch in text:  # the first comma-separated entry; commas inside [...] do not count
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            break
        first.append(ch)
    entry = "".join(first)
    # Each [...] contributes the start of its first range ("01-04,07" -> "01").
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0].strip(), entry)
    if not host or any(c in host for c in "[],"):
        raise ExecError(f"cannot read the Slurm node list {nodelist!r}; set MASTER_ADDR")
    return host


def slurm_env(env) -> dict[str, str]:
    """What srun's environment implies for torch.distributed, as updates to ``env``
    (empty outside Slurm or under torchrun): RANK / WORLD_SIZE / LOCAL_RANK from
    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, and, when unset, MASTER_ADDR from the
    first host of SLURM_JOB_NODELIST (or SLURM_NODELIST) and MASTER_PORT from the job
    id (29500 + id mod 1000, so two jobs sharing a node do not collide)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    out = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env.get("SLURM_NTASKS", "1")}
    if "LOCAL_RANK" not in env:
        out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in env:
        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodes:
            raise ExecError("srun gave no SLURM_JOB_NODELIST to find the master node in; "
                            "set MASTER_ADDR")
        out["MASTER_ADDR"] = first_slurm_host(nodes)
    if "MASTER_PORT" not in env:
        job = env.get("SLURM_JOB_ID", "")
        out["MASTER_PORT"] = str(29500 + int(job) % 1000) if job.isdigit() else "29500"
    return out


def all_reduce_gradients(params, group, what: str, *, mean_over: int = 1,
                         timeout_s: float | None = None) -> None:
    """Sum the gradients of ``params`` over ``group`` in one flat buffer (divided by
    ``mean_over`` for a mean), bounded like :func:`timed_collective`; a parameter
    without a gradient takes part with zeros."""
    import torch

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    timed_collective(dist.all_reduce, flat, group=group, what=what, timeout_s=timeout_s)
    if mean_over != 1:
        flat.div_(mean_over)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def check_launch_env(env=None) -> None:
    """Refuse, in one :class:`ExecError` line before any connection, a launch
    environment that cannot work: RANK / WORLD_SIZE / LOCAL_RANK not integers, RANK
    outside ``[0, WORLD_SIZE)``, MASTER_PORT outside 1..65535, MASTER_ADDR unset or not
    resolvable, MERAK_TIMEOUT_S not a finite positive number of seconds. Without a
    launcher (no RANK, no srun) the process will be a world of one: only the timeout
    is checked. Cheap; call it first thing in a command (:func:`init_distributed` does)."""
    env = os.environ if env is None else env
    default_timeout_s()
    fault_spec()
    env = {**env, **slurm_env(env)}
    if "RANK" not in env:
        return

    def integer(name: str, low: int) -> int:
        """The variable ``name`` as an integer >= ``low``, else the one-line refusal."""
        text = env.get(name)
        try:
            v = int(text)
        except (TypeError, ValueError):
            v = None
        if v is None or v < low:
            raise ExecError(f"{name}={text!r}: the launcher must give an integer >= {low} "
                            "(torchrun and srun set it)")
        return v

    world, rank = integer("WORLD_SIZE", 1), integer("RANK", 0)
    if rank >= world:
        raise ExecError(f"RANK={rank} is not below WORLD_SIZE={world}: ranks run from 0 to "
                        f"{world - 1}")
    if "LOCAL_RANK" in env:
        integer("LOCAL_RANK", 0)
    port, addr = integer("MASTER_PORT", 1), env.get("MASTER_ADDR", "")
    if port > 65535:
        raise ExecError(f"MASTER_PORT={port} is not a TCP port (1..65535)")
    if not addr:
        raise ExecError("MASTER_ADDR is not set: give the host of rank 0 (torchrun and srun "
                        "set it)")
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        why = getattr(e, "strerror", None) or _first_line(e)
        raise ExecError(f"MASTER_ADDR={addr!r} does not resolve ({why}): give the host name "
                        "or address of rank 0") from None


def init_distributed(timeout_s: float | None = None, backend: str | None = None) -> None:
    """Initialise the default process group from the launcher's environment.

    Works under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) and Slurm's srun
    (:func:`slurm_env`: ranks from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, the master
    from the job's node list). Backend: NCCL when CUDA is available, else gloo. A process
    without any launcher environment becomes a world of one (its store on a port the
    system picks). The environment is checked first (:func:`check_launch_env`); a rank
    that does not arrive within the timeout is named on the others (the rendezvous is
    a fault point, ``startup``). No-op if already initialised.
    """
    if dist.is_initialized():
        return
    env = os.environ
    env.update(slurm_env(env))
    alone = "RANK" not in env
    if alone:  # a world of one: the store listens on a port the system picks
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_PORT="0")
        env.setdefault("MASTER_ADDR", "127.0.0.1")
    if env.get("MASTER_ADDR") in (None, "localhost", "127.0.0.1"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not alone:
        check_launch_env(env)
    t = timeout_s if timeout_s is not None else default_timeout_s()
    if not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        raise ExecError(f"timeout_s={t!r}: give a finite number of seconds above 0 and at "
                        f"most {MAX_TIMEOUT_S:g}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
    fault_point("startup")
    store = _rendezvous(t)
    with bounded(f"the rendezvous at {env['MASTER_ADDR']}:{env['MASTER_PORT']}", quiet=True):
        dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store),
                                rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                                timeout=datetime.timedelta(seconds=t))


def _rendezvous(t: float):
    """Connect to the rendezvous store (rank 0 hosts it, or the launcher's agent under
    torchrun, as torch's ``env://`` does) and check in: every rank waits until all
    have, else names the ranks that never came. Returns the store. A client first
    waits (at most ``t``) for the store to listen: TCPStore's own connect retries
    with back-off past its timeout, up to three times it."""
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    master = rank == 0 and not agent
    host = "the launcher's store" if agent else "rank 0"
    verb = "host" if master else f"reach {host} at"
    deadline = time.monotonic() + t
    if not master and not _listening(addr, port, deadline):
        raise RankTimeoutError(f"merak_exec: rank {rank} could not reach {host} at the "
                               f"rendezvous {addr}:{port} within {t:g} s: nothing listens "
                               f"there; is {host} running?")
    left = max(1.0, deadline - time.monotonic())
    try:
        with _quiet_stderr():
            store = dist.TCPStore(addr, port, world, is_master=master,
                                  timeout=datetime.timedelta(seconds=left),
                                  wait_for_workers=False, multi_tenant=True)
            store.set_timeout(datetime.timedelta(seconds=t))
    except RuntimeError as e:
        raise RankTimeoutError(f"merak_exec: rank {rank} could not {verb} the rendezvous "
                               f"{addr}:{port} (timeout {t:g} s): {_first_line(e)}") from None
    if port == 0:
        env["MASTER_PORT"] = str(store.port)
    prefix = f"merak/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    _RDZV.update(store=store, prefix=prefix)
    if world > 1:
        _check_in(store, f"{prefix}/joined", rank, world, t, f"{addr}:{port}")
    return store


def _listening(addr: str, port: int, deadline: float) -> bool:
    """Whether something accepts connections at ``addr:port`` before ``deadline``
    (monotonic seconds), trying every 0.1 s."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.create_connection((addr, port), timeout=min(1.0, left)):
                return True
        except OSError:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _check_in(store, key: str, rank: int, world: int, t: float, where: str) -> None:
    """Store barrier of the rendezvous, naming who never came. Each rank sets
    ``key/<rank>`` and counts itself in; the last to arrive sets ``key/all`` to "ok".
    Rank 0 waits ``t``; on a timeout it writes the absent ranks into ``key/all`` and
    stays (a short grace) until the ranks present have read them. The others wait a
    grace longer, so rank 0 decides for all; if it cannot (it is the one missing),
    they look for the absent ranks themselves."""
    grace = min(2.0, t / 2)
    try:
        with _quiet_stderr():
            store.set(f"{key}/{rank}", b"1")
            if store.add(f"{key}/count", 1) == world:
                store.set(f"{key}/all", b"ok")
            try:
                store.wait([f"{key}/all"], datetime.timedelta(seconds=t + (rank > 0) * grace))
                verdict = store.get(f"{key}/all").decode()
            except RuntimeError:
                verdict = None
            if verdict == "ok":
                return
            if verdict is None:
                missing = _absent(store, key, world)
                if rank == 0:
                    store.set(f"{key}/all", ",".join(map(str, missing)).encode())
                    _linger(store, f"{key}/read", world - len(missing) - 1, grace)
            else:
                missing = [int(r) for r in verdict.split(",") if r]
                store.add(f"{key}/read", 1)
    except RuntimeError as e:
        raise RankTimeoutError(f"merak_exec: rank {rank} lost the rendezvous store at {where} "
                               f"(timeout {t:g} s): {_first_line(e)}; its host (rank 0 or the "
                               "launcher) ended") from None
    raise RankTimeoutError(f"merak_exec: rank {rank} timed out after {t:g} s in the "
                           f"rendezvous at {where}: {_ranks(missing)} of {world} never "
                           "arrived; start it or look at why it did not") from None


def _linger(store, key: str, readers: int, grace: float) -> None:
    """Wait (at most ``grace`` s) until ``readers`` ranks have counted themselves in
    ``key``: the store lives in this process and must outlast their reading."""
    deadline = time.monotonic() + grace
    while store.add(key, 0) < readers and time.monotonic() < deadline:
        time.sleep(0.02)


def _absent(store, key: str, world: int, block: int = 64) -> list[int]:
    """Ranks that have not set ``key/<rank>``: blocks of keys checked at once, so a
    large world costs ``world / block`` calls when nearly everyone is there."""
    out = []
    for lo in range(0, world, block):
        keys = [f"{key}/{r}" for r in range(lo, min(world, lo + block))]
        if not store.check(keys):
            out += [lo + i for i, k in enumerate(keys) if not store.check([k])]
    return out


@dataclass
class Mesh:
    """This rank's coordinates and process groups.

    Attributes:
        config: the ParallelConfig the mesh was built from.
        layout: its rank layout.
        rank, world_size: global rank and size.
        dp_rank, tp_rank, pp_rank: coordinates.
        dp_group, tp_group, pp_group: groups this rank belongs to (None when degree 1).
        tied_group: {first, last} pipeline ranks of this (dp, tp) slice, for summing
            tied embedding gradients (None unless pp > 1).
        device: torch device this rank computes on.
        timeout_s: bound on every wait.
        p2p_groups: the two-rank group of every channel (kind, sending pp rank,
            receiving pp rank) of :func:`merak_sim.schedule.posting.channels` this rank
            is on; the runtime posts each transfer on its channel's group.
    """

    config: ParallelConfig
    layout: RankLayout
    rank: int
    world_size: int
    dp_rank: int
    tp_rank: int
    pp_rank: int
    dp_group: object
    tp_group: object
    pp_group: object
    tied_group: object
    device: torch.device
    timeout_s: float
    p2p_groups: dict = field(default_factory=dict)

    @property
    def dp(self) -> int:
        """Data-parallel degree."""
        return self.config.dp

    @property
    def tp(self) -> int:
        """Tensor-parallel degree."""
        return self.config.tp

    @property
    def pp(self) -> int:
        """Pipeline degree."""
        return self.config.pp

    def global_rank(self, pp_rank: int, dp_rank: int | None = None,
                    tp_rank: int | None = None) -> int:
        """Global rank of the given coordinates (missing ones default to this rank's)."""
        d = self.dp_rank if dp_rank is None else dp_rank
        t = self.tp_rank if tp_rank is None else tp_rank
        return self.layout.rank(pp_rank, d, t)


def build_mesh(config: ParallelConfig, timeout_s: float | None = None) -> Mesh:
    """Create the dp, tp, pp (and tied-embedding) groups for ``config``.

    Raises :class:`ExecError` on every rank if the degrees do not multiply to the
    world size.
    """
    if not dist.is_initialized():
        init_distributed(timeout_s)
    world, rank = dist.get_world_size(), dist.get_rank()
    if config.world_size != world:
        raise ExecError(
            f"dp*tp*pp = {config.dp}*{config.tp}*{config.pp} = {config.world_size} does not "
            f"match the world size {world}; launch {config.world_size} processes or change "
            "the degrees"
        )
    layout = RankLayout.of(config)
    here = layout.coords(rank)
    t = datetime.timedelta(seconds=timeout_s if timeout_s is not None else default_timeout_s())
    mine = {}
    with bounded("creating the process groups (every rank must reach it)", quiet=True):
        # Same creation order on every rank (new_group is collective over the world).
        for kind in ("tp", "dp", "pp", "tied"):
            for ranks in layout.groups(kind):
                if len(ranks) == 1:
                    continue
                grp = dist.new_group(list(ranks), timeout=t)
                if rank in ranks:
                    mine[kind] = grp
        p2p = _channel_groups(config, layout, rank, t)
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    for chan, grp in p2p.items():  # initialise each communicator before its first transfer
        timed_collective(dist.all_reduce, torch.zeros(1, device=device), group=grp,
                         what=f"the start-up all-reduce of pipeline channel {chan}",
                         timeout_s=t.total_seconds())
    return Mesh(
        config=config, layout=layout, rank=rank, world_size=world, dp_rank=here.dp,
        tp_rank=here.tp, pp_rank=here.pp, dp_group=mine.get("dp"), tp_group=mine.get("tp"),
        pp_group=mine.get("pp"), tied_group=mine.get("tied"), device=device,
        timeout_s=t.total_seconds(), p2p_groups=p2p,
    )


def _channel_groups(config: ParallelConfig, layout: RankLayout, rank: int,
                    timeout: datetime.timedelta) -> dict:
    """One group per (pipeline, channel), created in the same order on every rank;
    returns this rank's, keyed by channel."""
    mine = {}
    for ranks in layout.groups("pp"):
        for chan in channels(config.pp, config.virtual_stages, config.placement):
            pair = sorted({ranks[chan[1]], ranks[chan[2]]})
            grp = dist.new_group(pair, timeout=timeout)
            if rank in pair:
                mine[chan] = grp
    return mine
