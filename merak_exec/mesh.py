"""Launch and topology: torch.distributed start-up and the dp/tp/pp process groups.

Ranks sit where :class:`merak_sim.layout.RankLayout` puts them (Megatron's order: tp
fastest, then dp, then pp), the placement the simulator prices.

Every process must create every group in the same order (``new_group`` is a
collective over the world), so :func:`build_mesh` creates all of the layout's groups,
in the layout's order, on every rank and keeps the ones it belongs to.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout

__all__ = ["ExecError", "Mesh", "init_distributed", "build_mesh", "default_timeout_s",
           "first_slurm_host", "slurm_env"]


class ExecError(ValueError):
    """Bad input to the real backend (degrees, model, checkpoint): the message names the
    problem and the fix."""


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
    # Same creation order on every rank (new_group is collective over the world).
    for kind in ("tp", "dp", "pp", "tied"):
        for ranks in layout.groups(kind):
            if len(ranks) == 1:
                continue
            grp = dist.new_group(list(ranks), timeout=t)
            if rank in ranks:
                mine[kind] = grp
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return Mesh(
        config=config, layout=layout, rank=rank, world_size=world, dp_rank=here.dp,
        tp_rank=here.tp, pp_rank=here.pp, dp_group=mine.get("dp"), tp_group=mine.get("tp"),
        pp_group=mine.get("pp"), tied_group=mine.get("tied"), device=device,
        timeout_s=t.total_seconds(),
    )
