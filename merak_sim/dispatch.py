"""Dispatch a plan to a cluster: write a launch script and the config the backend reads.

``write_launch(plan, launcher, nodes, gpus_per_node, out_dir, script=None)`` writes
into ``out_dir``:

- ``plan.json``: the plan, which ``python -m merak_exec train --plan plan.json`` (or the
  user's ``--script``, given ``--plan plan.json``) reads;
- ``launch.sh`` (torchrun): one script for every node, run with ``NODE_RANK`` set
  (the per-node command lines are listed in its header), or ``job.sbatch``
  (Slurm): an sbatch file whose ``srun`` starts one torchrun per node with a c10d
  rendezvous on the first node.

Every file is written atomically; a plan that does not match the cluster shape is
rejected before anything is written.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from merak_sim.io import atomic_write_text
from merak_sim.plan import Plan

__all__ = ["DispatchError", "LaunchFiles", "write_launch", "LAUNCHERS"]

LAUNCHERS = ("torchrun", "slurm")


class DispatchError(ValueError):
    """The plan cannot be dispatched as asked (message names the mismatch)."""


@dataclass(frozen=True)
class LaunchFiles:
    """Paths written by :func:`write_launch` and the command lines per node."""

    plan: Path
    launcher: Path
    node_commands: tuple[str, ...]


def _program(script: str | None, plan_name: str) -> list[str]:
    if script is None:
        return ["-m", "merak_exec", "train", "--plan", plan_name]
    return [script, "--plan", plan_name]


def write_launch(
    plan: Plan,
    launcher: str,
    nodes: int,
    gpus_per_node: int,
    out_dir: str | Path,
    script: str | None = None,
    master_port: int = 29500,
) -> LaunchFiles:
    """Write the launch files for ``plan`` (see module docstring)."""
    if launcher not in LAUNCHERS:
        raise DispatchError(f"unknown launcher {launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
    if nodes < 1 or gpus_per_node < 1:
        raise DispatchError(
            f"nodes and gpus-per-node must be >= 1, got {nodes} and {gpus_per_node}"
        )
    cfg = plan.parallel
    world = nodes * gpus_per_node
    if world != cfg.world_size:
        raise DispatchError(
            f"plan needs dp*tp*pp = {cfg.dp}*{cfg.tp}*{cfg.pp} = {cfg.world_size} GPUs but "
            f"--nodes {nodes} x --gpus-per-node {gpus_per_node} = {world}"
        )
    if gpus_per_node % cfg.tp:
        raise DispatchError(
            f"tp={cfg.tp} must divide --gpus-per-node {gpus_per_node} so tensor-parallel "
            "groups stay inside a node"
        )
    out = Path(out_dir)
    plan_path = out / "plan.json"
    prog = _program(script, "plan.json")
    base = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus_per_node}"]
    # $MASTER_ADDR stays unquoted so the shell expands it when the line is pasted.
    node_cmds = tuple(
        f"{shlex.join(base)} --node-rank={i} --master-addr=$MASTER_ADDR "
        f"--master-port={master_port} {shlex.join(prog)}"
        for i in range(nodes)
    )
    summary = (f"# plan: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} schedule={cfg.schedule} "
               f"recompute={cfg.recompute} micro-batch={cfg.micro_batch_size} "
               f"global-batch={cfg.global_batch_size}")
    if launcher == "torchrun":
        lines = [
            "#!/usr/bin/env bash",
            "# Written by `merak-sim dispatch`. Run this on every node with NODE_RANK set",
            "# (0 on the master) and MASTER_ADDR the master node's address:",
            *(f"#   node {i}: {c}" for i, c in enumerate(node_cmds)),
            summary,
            "set -euo pipefail",
            'cd "$(dirname "$0")"',
            ': "${MASTER_ADDR:=127.0.0.1}"',
            ': "${NODE_RANK:=0}"',
            "exec " + shlex.join(base) + ' --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" '
            + f"--master-port={master_port} " + shlex.join(prog),
            "",
        ]
        path = out / "launch.sh"
    else:
        lines = [
            "#!/usr/bin/env bash",
            "# Written by `merak-sim dispatch`. Submit with: sbatch job.sbatch",
            summary,
            "#SBATCH --job-name=merak",
            f"#SBATCH --nodes={nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={gpus_per_node}",
            "set -euo pipefail",
            'cd "$SLURM_SUBMIT_DIR"',
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "srun " + shlex.join(base) + " --rdzv-backend=c10d "
            + f'--rdzv-endpoint="$head_node:{master_port}" --rdzv-id="$SLURM_JOB_ID" '
            + shlex.join(prog),
            "",
        ]
        path = out / "job.sbatch"
    # Write the plan first and the launcher last: a launcher never points at a
    # missing plan.
    plan.save(plan_path)
    atomic_write_text(path, "\n".join(lines))
    path.chmod(0o755)
    return LaunchFiles(plan_path, path, node_cmds)
