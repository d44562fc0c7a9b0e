"""Dispatch a plan to a cluster: write a launch script and the config the backend reads.

``write_launch(plan, launcher, nodes, gpus_per_node, out_dir, ...)`` writes into
``out_dir``:

- ``plan.json``: the plan, which ``python -m merak_exec train --plan plan.json`` (or the
  user's ``--script``, given ``--plan plan.json``) reads;
- ``launch.sh`` (torchrun): one script for every node (the per-node command lines are
  listed in its header). On one node torchrun runs ``--standalone``: it binds a free
  port itself, so two jobs on one machine never collide. On more than one node it
  requires ``NODE_RANK`` (0 on the master) and ``MASTER_ADDR`` and stops with one line
  when either is unset or out of range, so a forgotten ``NODE_RANK`` never starts a
  second rank 0; ``MASTER_PORT`` defaults to ``master_port``.
- ``job.sbatch`` (Slurm): an sbatch file whose ``srun`` starts one torchrun per node
  (``--ntasks-per-node=1``, ``--cpus-per-task`` CPUs for that node's workers, passed to
  srun again because srun does not inherit it since Slurm 22.05) with a c10d
  rendezvous on the first node, on a port derived from the job id (29500 + id mod
  1000, as :func:`merak_exec.mesh.slurm_env`), so jobs sharing a head node do not
  collide; optional ``#SBATCH --time``, ``--partition``, ``--output`` and
  ``--exclusive``.

Both scripts find ``plan.json`` next to themselves (launch.sh through its own path,
the sbatch file, which Slurm runs from a copy in its spool directory, through the
job's recorded command, falling back to the directory it was written to) and pass it
by absolute path: they stay in the folder they were started from (sbatch: the submit
folder), so relative paths in the arguments after ``--`` mean what they meant where
the job was started. A relative ``--script`` and ``--venv`` are resolved when the
plan is dispatched. The environment step (``venv``: its ``bin/activate``; ``setup``:
shell lines such as ``module load ...``, run as written) comes first in each script
and is named in its header; with neither, the job runs in the environment it is
started from (sbatch exports the submitting shell's), and a missing ``torchrun``
stops it with one line naming both options. Both set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless it is set already: the
memory model the plan was priced with assumes it
(:mod:`merak_sim.runtime_memory`). Every path is shell-quoted, ``#SBATCH``
values in sbatch's own quoting (double quotes, backslash escapes).

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

__all__ = ["DispatchError", "LaunchFiles", "JobEnvironment", "write_launch", "planned_shape",
           "resolve_script", "LAUNCHERS", "MAX_LISTED_NODES", "CPUS_PER_GPU"]

LAUNCHERS = ("torchrun", "slurm")
#: per-node command lines listed one by one up to this many nodes, summarised beyond.
MAX_LISTED_NODES = 8
#: ``--cpus-per-task`` default per GPU of a node (one task per node runs all of its
#: workers): 4 leaves each rank its main thread, data loading and NCCL's proxy
#: thread, and fits every GPU node (8 GPUs: 32 of a DGX's 112 cores).
CPUS_PER_GPU = 4
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_SLURM_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")
# The rendezvous port of a Slurm job: as merak_exec.mesh.slurm_env derives it.
_JOB_PORT = 'port=$((29500 + ${SLURM_JOB_ID:-0} % 1000))'
# How both scripts name the plan: beside themselves, found when they run.
_HERE_PLAN = '"$here/plan.json"'


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


@dataclass(frozen=True)
class JobEnvironment:
    """What a launch script runs before torchrun and what it runs: the environment
    step (an absolute ``venv`` folder, ``setup`` shell lines) and the program
    (``script``: an absolute path or None for ``python -m merak_exec train``; ``args``:
    passed after ``--plan``)."""

    script: str | None = None
    args: tuple[str, ...] = ()
    venv: str | None = None
    setup: tuple[str, ...] = ()

    def program(self, plan_ref: str) -> str:
        """The shell words after torchrun's own options; ``plan_ref`` is already
        shell text (quoted or an expansion)."""
        head = ["-m", "merak_exec", "train"] if self.script is None else [self.script]
        return " ".join([shlex.join(head), "--plan", plan_ref, *map(shlex.quote, self.args)])

    def lines(self, name: str) -> list[str]:
        """The environment step of script ``name``, its comment first, and a check
        that torchrun is on PATH afterwards."""
        if self.venv is None and not self.setup:
            say = ["# Environment: none given (--venv DIR or --setup LINE): the job runs "
                   "in the one it is started from"
                   + (" (sbatch exports the submitting shell's)." if name == "job.sbatch"
                      else ".")]
        else:
            say = ["# Environment: " + "; ".join(
                ([f"the virtual environment {self.venv}"] if self.venv else [])
                + ([f"{len(self.setup)} setup line(s) from --setup"] if self.setup else []))
                + "."]
        act = [f"source {shlex.quote(self.venv + '/bin/activate')}"] if self.venv else []
        # The simulator's memory model assumes PyTorch's allocator grows its segments
        # in pages (merak_sim.runtime_memory): no blocks stranded between segments.
        alloc = ['export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-'
                 'expandable_segments:True}"']
        check = (f'command -v torchrun >/dev/null || {{ echo "{name}: error: torchrun is '
                 "not on PATH; dispatch again with --venv DIR or --setup 'module load ...'"
                 '" >&2; exit 2; }')
        return [*say, *act, *self.setup, check, *alloc]


def planned_shape(plan: Plan) -> tuple[int, int, str]:
    """(nodes, GPUs per node, cluster name) the plan was priced on: its ranks fill
    nodes of its cluster's size (a plan smaller than one node uses part of one)."""
    cluster = resolve_cluster(plan.cluster)
    world, gpn = plan.parallel.world_size, cluster.gpus_per_node
    if world <= gpn:
        return 1, world, cluster.name
    return -(-world // gpn), gpn, cluster.name


def resolve_script(script: str) -> str:
    """The absolute path of ``--script`` (a relative one from the current folder, as
    the user typed it); one line naming the fix when it is not a file, or when it is
    a command line (its arguments go after ``--``)."""
    p = Path(script).expanduser()
    if p.is_file():
        return str(p.resolve())
    words = script.split()
    if len(words) > 1 and Path(words[0]).expanduser().is_file():
        raise DispatchError(f"--script {script!r} holds arguments: give the file alone and "
                            f"its arguments after --, e.g. --script {shlex.quote(words[0])} "
                            f"-- {shlex.join(words[1:])}")
    raise DispatchError(f"--script {script!r}: no such file (a relative path is taken "
                        "from the current folder)")


def _environment(script: str | None, args, venv: str | None, setup) -> JobEnvironment:
    """The checked :class:`JobEnvironment` of the dispatch options."""
    args, setup = tuple(args), tuple(setup)
    for what, items in (("the arguments after --", args), ("--setup", setup)):
        if any("\n" in x or "\r" in x for x in items):
            raise DispatchError(f"{what} must not contain a line break; give one line per "
                                "--setup")
    if any(a == "--plan" or a.startswith("--plan=") for a in args):
        raise DispatchError("--plan is what dispatch passes (plan.json beside the script); "
                            "remove it from the arguments after --")
    if venv is not None:
        v = Path(venv).expanduser()
        if not (v / "bin" / "activate").is_file():
            raise DispatchError(f"--venv {venv}: no bin/activate there; give the folder of "
                                "a virtual environment (python -m venv DIR)")
        venv = str(v.resolve())
    return JobEnvironment(None if script is None else resolve_script(script), args, venv,
                          setup)


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


def _sbatch_value(value: str) -> str:
    """``value`` as sbatch reads an ``#SBATCH`` option's value: as is when plain, else
    in double quotes with ``"`` and ``\\`` escaped (sbatch's script parser)."""
    if re.fullmatch(r"[\w.,:%/=+@-]+", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _slurm_options(time: str | None, partition: str | None, output: str | None,
                   cpus_per_task: int, exclusive: bool) -> list[str]:
    if time is not None and not _SLURM_TIME.match(time):
        raise DispatchError(f"--time {time!r} is not a Slurm time (minutes, H:M:S, D-H, "
                            "D-H:M:S)")
    if partition is not None and not re.match(r"^[\w.,-]+$", partition):
        raise DispatchError(f"--partition {partition!r}: letters, digits, '_', '-', '.' "
                            "and ',' only")
    if output is not None and (not output.strip() or any(c in output for c in "\n\r")):
        raise DispatchError(f"--output {output!r} must be a one-line, non-empty path")
    if not isinstance(cpus_per_task, int) or isinstance(cpus_per_task, bool) \
            or cpus_per_task < 1:
        raise DispatchError(f"--cpus-per-task must be a positive integer, got "
                            f"{cpus_per_task!r}")
    return ([f"#SBATCH --cpus-per-task={cpus_per_task}"]
            + (["#SBATCH --exclusive"] if exclusive else [])
            + [f"#SBATCH --{k}={_sbatch_value(v)}" for k, v in
               (("time", time), ("partition", partition), ("output", output))
               if v is not None])


def _summary(plan: Plan) -> str:
    cfg = plan.parallel
    return (f"# plan: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} schedule={cfg.schedule} "
            f"recompute={cfg.recompute} micro-batch={cfg.micro_batch_size} "
            f"global-batch={cfg.global_batch_size}")


def _start(env: JobEnvironment, name: str) -> list[str]:
    """Strict mode around the environment step (``set -u`` after it: activate scripts
    and ``module`` read unset variables)."""
    return ["set -eo pipefail", *env.lines(name), "set -u"]


def _torchrun_script(env: JobEnvironment, nodes: int, gpn: int, master_port: int,
                     plan_path: Path, summary: str) -> tuple[list[str], list[str]]:
    """(launch.sh's lines, the per-node command lines its header lists)."""
    shown = shlex.quote(str(plan_path))
    if nodes == 1:
        base = shlex.join(["torchrun", "--standalone", "--nnodes=1",
                           f"--nproc-per-node={gpn}"])
        cmds = _listed([f"{base} {env.program(shown)}"])
        run = [f"exec {base} {env.program(_HERE_PLAN)}"]
        where = ":"
    else:
        base = shlex.join(["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpn}"])
        # $MASTER_ADDR stays unquoted so the shell expands it when the line is pasted.
        cmds = _listed([f"{base} --node-rank={i} --master-addr=$MASTER_ADDR "
                        f"--master-port={master_port} {env.program(shown)}"
                        for i in range(nodes)])
        run = [f': "${{MASTER_PORT:={master_port}}}"',
               f'exec {base} --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" '
               f'--master-port="$MASTER_PORT" {env.program(_HERE_PLAN)}']
        where = (" with NODE_RANK set (0 on the master), MASTER_ADDR the master node's "
                 f"address and optionally MASTER_PORT (default {master_port}):")
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `merak-sim dispatch`. Run this on every node" + where,
        *(f"#   {c}" for c in cmds),
        summary,
        "# Relative paths in the arguments start from the folder this is run from.",
        # How it was started is checked first: the environment step may be slow.
        *(_require_env(nodes) if nodes > 1 else []),
        *_start(env, "launch.sh"),
        'here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)',
        *run,
        "",
    ]
    return lines, cmds


def _sbatch_script(env: JobEnvironment, nodes: int, gpn: int, options: list[str],
                   cpus: int, written: Path, summary: str) -> tuple[list[str], list[str]]:
    """(job.sbatch's lines, its one command line)."""
    torchrun = shlex.join(["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpn}",
                           "--rdzv-backend=c10d"])
    srun = (f"srun --ntasks-per-node=1 --cpus-per-task={cpus} --kill-on-bad-exit=1 "
            f'{torchrun} --rdzv-endpoint="$head_node:$port" --rdzv-id="$SLURM_JOB_ID" '
            + env.program(_HERE_PLAN))
    lines = [
        "#!/usr/bin/env bash",
        "#SBATCH --job-name=merak",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpn}",
        *options,
        "# Written by `merak-sim dispatch`. Submit with: sbatch job.sbatch (relative paths",
        "# in the arguments start from the folder it is submitted from).",
        f"# One torchrun per node starts its {gpn} workers on the task's {cpus} CPUs "
        f"(OMP_NUM_THREADS={max(1, cpus // gpn)} each);",
        "# c10d rendezvous on the first node, port 29500 + job id mod 1000.",
        summary,
        *_start(env, "job.sbatch"),
        "# Slurm runs a copy of this file: plan.json lies next to the submitted one.",
        'submitted=$(scontrol show job "${SLURM_JOB_ID:-0}" 2>/dev/null '
        "| sed -n 's/^ *Command=//p' | head -n 1 || true)",
        'if [ -n "$submitted" ] && [ -f "$(dirname "$submitted")/plan.json" ]; then '
        'here=$(dirname "$submitted"); else here=' + shlex.quote(str(written)) + "; fi",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        _JOB_PORT,
        f"export OMP_NUM_THREADS={max(1, cpus // gpn)}",
        srun,
        "",
    ]
    return lines, [f"every node: {srun}"]


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
    cpus_per_task: int | None = None,
    exclusive: bool = False,
    venv: str | None = None,
    setup: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
) -> LaunchFiles:
    """Write the launch files for ``plan`` (see module docstring); ``nodes`` and
    ``gpus_per_node`` default to the shape the plan was priced on, ``cpus_per_task``
    to :data:`CPUS_PER_GPU` per GPU of a node; ``args`` go to the program after
    ``--plan``. Everything is checked before anything is written."""
    p_nodes, p_gpn, _ = planned_shape(plan)
    nodes = p_nodes if nodes is None else nodes
    gpus_per_node = p_gpn if gpus_per_node is None else gpus_per_node
    _check_shape(plan, launcher, nodes, gpus_per_node)
    if launcher != "slurm" and (exclusive or (time, partition, output, cpus_per_task)
                                != (None,) * 4):
        raise DispatchError("--time, --partition, --output, --cpus-per-task and --exclusive "
                            "are sbatch options: use them with --launcher slurm")
    cpus = CPUS_PER_GPU * gpus_per_node if cpus_per_task is None else cpus_per_task
    sbatch_opts = _slurm_options(time, partition, output, cpus, exclusive)
    env = _environment(script, args, venv, setup)
    why = _forceable(plan, nodes, gpus_per_node)
    if why and not force:
        raise DispatchError(f"{why} (--force dispatches it anyway)")
    out = Path(out_dir)
    if launcher == "torchrun":
        lines, cmds = _torchrun_script(env, nodes, gpus_per_node, master_port,
                                       out.resolve() / "plan.json", _summary(plan))
        path = out / "launch.sh"
    else:
        lines, cmds = _sbatch_script(env, nodes, gpus_per_node, sbatch_opts, cpus,
                                     out.resolve(), _summary(plan))
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
