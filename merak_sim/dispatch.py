"""Dispatch a plan to a cluster: write a launch script and the config the backend reads.

``write_launch(plan, launcher, nodes, gpus_per_node, out_dir, ...)`` writes into
``out_dir``:

- ``plan.json``: the plan, which ``python -m merak_exec train --plan plan.json`` (or the
  user's ``--script``, given ``--plan plan.json``) reads;
- ``launch.sh`` (torchrun): one script for every node (the per-node command lines are
  listed in its header). On more than one node it requires ``NODE_RANK`` (0 on the
  master) and ``MASTER_ADDR`` and stops with one line when either is unset or out of
  range, so a forgotten ``NODE_RANK`` never starts a second rank 0. On one node they
  default to 0 and 127.0.0.1.
- ``job.sbatch`` (Slurm): an sbatch file whose ``srun`` starts one torchrun per node
  with a c10d rendezvous on the first node; optional ``#SBATCH --time``,
  ``--partition`` and ``--output``.

Both scripts find ``plan.json`` next to themselves: launch.sh through its own path,
the sbatch file (which Slurm runs from a copy in its spool directory) through the
job's recorded command (``scontrol show job``), falling back to the directory it was
written to.

A plan is refused before anything is written when its degrees do not fit the shape
(always), and, unless ``force``, when merak-exec cannot run it
(:func:`merak_sim.executable.unsupported`) or when the shape differs from the one it
was priced on (GPUs per node and nodes of its cluster). :attr:`LaunchFiles.node_commands`
are the command lines exactly as the script lists them (the first two and the last
node beyond :data:`MAX_LISTED_NODES` nodes).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from merak_sim.executable import unsupported
from merak_sim.io import atomic_write_text
from merak_sim.plan import Plan
from merak_sim.resolve import resolve_cluster, resolve_model

__all__ = ["DispatchError", "LaunchFiles", "write_launch", "planned_shape", "LAUNCHERS",
           "MAX_LISTED_NODES"]

LAUNCHERS = ("torchrun", "slurm")
#: per-node command lines listed one by one up to this many nodes, summarised beyond.
MAX_LISTED_NODES = 8
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_SLURM_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")


class DispatchError(ValueError):
    """The plan cannot be dispatched as asked (message names the mismatch)."""


@dataclass(frozen=True)
class LaunchFiles:
    """Paths written by :func:`write_launch`, the command lines it lists, and what
    ``force`` overrode (None when nothing was)."""

    plan: Path
    launcher: Path
    node_commands: tuple[str, ...]
    forced: str | None = None


def planned_shape(plan: Plan) -> tuple[int, int, str]:
    """(nodes, GPUs per node, cluster name) the plan was priced on: its ranks fill
    nodes of its cluster's size (a plan smaller than one node uses part of one)."""
    cluster = resolve_cluster(plan.cluster)
    world, gpn = plan.parallel.world_size, cluster.gpus_per_node
    if world <= gpn:
        return 1, world, cluster.name
    return -(-world // gpn), gpn, cluster.name


def _program(script: str | None, plan_name: str) -> list[str]:
    if script is None:
        return ["-m", "merak_exec", "train", "--plan", plan_name]
    return [script, "--plan", plan_name]


def _listed(lines: list[str]) -> list[str]:
    """Every line up to MAX_LISTED_NODES, else the first two, a summary and the last."""
    n = len(lines)
    if n <= MAX_LISTED_NODES:
        return [f"node {i}: {c}" for i, c in enumerate(lines)]
    return [f"node 0: {lines[0]}", f"node 1: {lines[1]}",
            f"nodes 2-{n - 2}: the same line with --node-rank=2 ... {n - 2}",
            f"node {n - 1}: {lines[-1]}"]


def _check_shape(plan: Plan, launcher: str, nodes: int, gpus_per_node: int) -> None:
    if launcher not in LAUNCHERS:
        raise DispatchError(f"unknown launcher {launcher!r}; choose one of: {', '.join(LAUNCHERS)}")
    for name, v in (("nodes", nodes), ("gpus-per-node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise DispatchError(f"--{name} must be a positive integer, got {v!r}")
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


def _forceable(plan: Plan, nodes: int, gpus_per_node: int) -> str | None:
    """Why the plan should not run as asked, or None: not executable, or another shape."""
    why = unsupported(plan.parallel, resolve_model(plan.model))
    if why:
        return f"merak-exec cannot run this plan: {why}"
    p_nodes, p_gpn, name = planned_shape(plan)
    if (p_nodes, p_gpn) != (nodes, gpus_per_node):
        return (f"the plan was priced on {p_nodes} node(s) x {p_gpn} GPUs of {name}, not "
                f"{nodes} x {gpus_per_node}: its traffic would cross other links than "
                "simulated; re-plan for this shape")
    return None


def _slurm_options(time: str | None, partition: str | None, output: str | None) -> list[str]:
    if time is not None and not _SLURM_TIME.match(time):
        raise DispatchError(f"--time {time!r} is not a Slurm time (minutes, H:M:S, D-H, "
                            "D-H:M:S)")
    if partition is not None and not re.match(r"^[\w.,-]+$", partition):
        raise DispatchError(f"--partition {partition!r}: letters, digits, '_', '-', '.' "
                            "and ',' only")
    if output is not None and (not output.strip() or any(c in output for c in "\n\r")):
        raise DispatchError(f"--output {output!r} must be a one-line, non-empty path")
    return [f"#SBATCH --{k}={v}" for k, v in
            (("time", time), ("partition", partition), ("output", output)) if v is not None]


def write_launch(
    plan: Plan,
    launcher: str,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    out_dir: str | Path = "out/dispatch",
    script: str | None = None,
    master_port: int = 29500,
    *,
    force: bool = False,
    time: str | None = None,
    partition: str | None = None,
    output: str | None = None,
) -> LaunchFiles:
    """Write the launch files for ``plan`` (see module docstring); ``nodes`` and
    ``gpus_per_node`` default to the shape the plan was priced on."""
    p_nodes, p_gpn, _ = planned_shape(plan)
    nodes = p_nodes if nodes is None else nodes
    gpus_per_node = p_gpn if gpus_per_node is None else gpus_per_node
    _check_shape(plan, launcher, nodes, gpus_per_node)
    if launcher != "slurm" and (time, partition, output) != (None, None, None):
        raise DispatchError("--time, --partition and --output are sbatch options: use them "
                            "with --launcher slurm")
    sbatch_opts = _slurm_options(time, partition, output)
    why = _forceable(plan, nodes, gpus_per_node)
    if why and not force:
        raise DispatchError(f"{why} (--force dispatches it anyway)")
    cfg = plan.parallel
    out = Path(out_dir)
    prog = _program(script, "plan.json")
    base = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus_per_node}"]
    summary = (f"# plan: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} schedule={cfg.schedule} "
               f"recompute={cfg.recompute} micro-batch={cfg.micro_batch_size} "
               f"global-batch={cfg.global_batch_size}")
    if launcher == "torchrun":
        # $MASTER_ADDR stays unquoted so the shell expands it when the line is pasted.
        cmds = _listed([f"{shlex.join(base)} --node-rank={i} --master-addr=$MASTER_ADDR "
                        f"--master-port={master_port} {shlex.join(prog)}"
                        for i in range(nodes)])
        lines = [
            "#!/usr/bin/env bash",
            "# Written by `merak-sim dispatch`. Run this on every node"
            + (" with NODE_RANK set (0 on the master) and MASTER_ADDR the master node's "
               "address:" if nodes > 1 else ":"),
            *(f"#   {c}" for c in cmds),
            summary,
            "set -euo pipefail",
            'cd "$(dirname "$0")"',
            *(_require_env(nodes) if nodes > 1 else
              [': "${MASTER_ADDR:=127.0.0.1}"', ': "${NODE_RANK:=0}"']),
            "exec " + shlex.join(base) + ' --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" '
            + f"--master-port={master_port} " + shlex.join(prog),
            "",
        ]
        path = out / "launch.sh"
    else:
        srun = ("srun " + shlex.join(base) + " --rdzv-backend=c10d "
                + f'--rdzv-endpoint="$head_node:{master_port}" --rdzv-id="$SLURM_JOB_ID" '
                + shlex.join(prog))
        cmds = [f"every node: {srun}"]
        written = str(out.resolve())
        lines = [
            "#!/usr/bin/env bash",
            "#SBATCH --job-name=merak",
            f"#SBATCH --nodes={nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={gpus_per_node}",
            *sbatch_opts,
            "# Written by `merak-sim dispatch`. Submit with: sbatch job.sbatch",
            summary,
            "set -euo pipefail",
            "# Slurm runs a copy of this file: plan.json lies next to the submitted one.",
            'here=$(scontrol show job "${SLURM_JOB_ID:-0}" 2>/dev/null '
            "| sed -n 's/^ *Command=//p' | head -n 1 || true)",
            'if [ -n "$here" ] && [ -f "$(dirname "$here")/plan.json" ]; then '
            'cd "$(dirname "$here")"; else cd ' + shlex.quote(written) + "; fi",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            srun,
            "",
        ]
        path = out / "job.sbatch"
    # Write the plan first and the launcher last: a launcher never points at a
    # missing plan.
    try:
        plan.save(out / "plan.json")
        atomic_write_text(path, "\n".join(lines))
        path.chmod(0o755)
    except OSError as e:
        raise DispatchError(f"cannot write into {out}: {e.strerror or e}") from None
    return LaunchFiles(out / "plan.json", path, tuple(cmds), why)


def _require_env(nodes: int) -> list[str]:
    """Shell lines that stop a multi-node launch without NODE_RANK / MASTER_ADDR."""
    return [
        'if [ -z "${MASTER_ADDR:-}" ]; then echo "launch.sh: error: set MASTER_ADDR to '
        'the master node\'s address (the same on every node)" >&2; exit 2; fi',
        'if ! [[ "${NODE_RANK:-}" =~ ^[0-9]+$ ]] || [ "$NODE_RANK" -ge ' + str(nodes)
        + ' ]; then echo "launch.sh: error: set NODE_RANK to this node\'s index, 0 to '
        + str(nodes - 1) + ' (0 on the master), got \'${NODE_RANK:-}\'" >&2; exit 2; fi',
    ]
