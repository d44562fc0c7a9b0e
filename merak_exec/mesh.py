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
(:func:`wait_for`, :func:`timed_collective`): a lost or stalled peer becomes one
:class:`RankTimeoutError` line naming this rank, the operation and the peer.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.schedule.posting import channels

__all__ = ["ExecError", "RankTimeoutError", "Mesh", "init_distributed", "build_mesh",
           "default_timeout_s", "wait_for", "timed_collective", "peers_text", "bounded",
           "first_slurm_host", "slurm_env", "all_reduce_gradients"]


class ExecError(ValueError):
    """Bad input to the real backend (degrees, model, checkpoint): the message names the
    problem and the fix."""


class RankTimeoutError(RuntimeError):
    """A wait for a peer exceeded the timeout or the peer went away: it is probably
    dead or stuck (the message is one line naming this rank, the operation and the
    peer)."""


def default_timeout_s() -> float:
    """Timeout for every wait, from MERAK_TIMEOUT_S (default 60 s): short, so a lost
    rank turns into a clear error on the others rather than a hang."""
    try:
        return float(os.environ.get("MERAK_TIMEOUT_S", "60"))
    except ValueError:
        raise ExecError("MERAK_TIMEOUT_S must be a number of seconds") from None


def loopback_env(rank: int, world: int, port: int) -> None:
    """Make this process rank ``rank`` of a ``world``-process group on 127.0.0.1:``port``
    (the environment torchrun would set, gloo on the loopback device) with one torch
    thread, as each of several processes sharing a small CPU machine should run.
    Call :func:`init_distributed` afterwards."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def wait_for(work, what: str, timeout_s: float | None = None, rank: int | None = None) -> None:
    """Wait for torch.distributed ``work`` at most ``timeout_s`` (default
    MERAK_TIMEOUT_S); raise a one-line :class:`RankTimeoutError` saying that ``rank``
    (default this process's) gave up waiting for ``what`` (name the peer in it)."""
    t = default_timeout_s() if timeout_s is None else timeout_s
    r = dist.get_rank() if rank is None else rank
    try:
        ok = work.wait(datetime.timedelta(seconds=t))
    except RuntimeError as e:
        raise RankTimeoutError(
            f"merak_exec: rank {r} failed waiting for {what} (timeout {t:g} s): "
            f"{_first_line(e)}; a peer rank probably died or stalled") from None
    if ok is False:
        raise RankTimeoutError(f"merak_exec: rank {r} timed out after {t:g} s waiting for "
                               f"{what}; a peer rank probably died or stalled")


@contextlib.contextmanager
def bounded(what: str):
    """Turn a torch.distributed failure inside the block (a store or group timeout, a
    closed connection) into one :class:`RankTimeoutError` line naming ``what``."""
    try:
        yield
    except RankTimeoutError:
        raise
    except RuntimeError as e:
        if not isinstance(e, dist.DistError):
            raise
        rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
        raise RankTimeoutError(f"merak_exec: rank {rank} failed in {what}: {_first_line(e)}; "
                               "a peer rank probably died or stalled") from None


def peers_text(group) -> str:
    """"rank 3" or "ranks 1, 3": the other members of ``group`` (global ranks)."""
    me = dist.get_rank()
    others = [r for r in dist.get_process_group_ranks(group) if r != me]
    return ("rank " if len(others) == 1 else "ranks ") + ", ".join(map(str, others))


def timed_collective(fn: Callable, *args, group, what: str,
                     timeout_s: float | None = None, **kwargs) -> None:
    """Run the collective ``fn(*args, group=group, async_op=True, **kwargs)`` (e.g.
    ``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather``,
    ``dist.reduce_scatter``) and wait for it within ``timeout_s``
    (default MERAK_TIMEOUT_S); a failure is one :class:`RankTimeoutError` line naming
    this rank, ``what`` and the group's other ranks."""
    t = default_timeout_s() if timeout_s is None else timeout_s
    try:
        ok = fn(*args, group=group, async_op=True, **kwargs).wait(
            datetime.timedelta(seconds=t))
    except RuntimeError as e:
        raise RankTimeoutError(
            f"merak_exec: rank {dist.get_rank()} failed in {what} with {peers_text(group)} "
            f"(timeout {t:g} s): {_first_line(e)}; a peer rank probably died or stalled"
        ) from None
    if ok is False:
        raise RankTimeoutError(
            f"merak_exec: rank {dist.get_rank()} timed out after {t:g} s in {what} with "
            f"{peers_text(group)}; a peer rank probably died or stalled")


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


def init_distributed(timeout_s: float | None = None, backend: str | None = None) -> None:
    """Initialise the default process group from the launcher's environment.

    Works under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) and Slurm's srun
    (:func:`slurm_env`: ranks from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, the master
    from the job's node list). Backend: NCCL when CUDA is available, else gloo. A process without
    any launcher environment becomes a world of one. No-op if already initialised.
    """
    if dist.is_initialized():
        return
    env = os.environ
    env.update(slurm_env(env))
    if "RANK" not in env:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in env:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                env["MASTER_PORT"] = str(s.getsockname()[1])
    if env.get("MASTER_ADDR") in (None, "localhost", "127.0.0.1"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
    t = datetime.timedelta(seconds=timeout_s if timeout_s is not None else default_timeout_s())
    with bounded(f"the rendezvous at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"):
        dist.init_process_group(backend=backend, timeout=t)


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
    with bounded("creating the process groups (every rank must reach it)"):
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
