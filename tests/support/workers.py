"""Multi-process test workers (gloo on loopback, CPU): equivalence runs and scenarios.

:func:`launch` spawns ``world`` processes; each runs :func:`run_cases`, which trains a
tiny model under every given configuration and compares losses, final gradients and
parameters with a single-process run of the same model and data.
:func:`launch_scenario` runs one ``scenario_*`` function on every rank (resume, bad
input, events, hooks, ...), :func:`launch_scenarios` several in turn in one launch. Each rank writes its result to a JSON file in
``out_dir`` *before* tearing down, so the caller judges reported results, not exit
signals. :func:`cli_fault` runs ``merak-exec train`` as one process per rank and
stops (SIGSTOP) or kills (SIGKILL) one of them mid-training.
"""

from __future__ import annotations

import copy
import json
import os

import torch

from merak_exec.launch import run_ranks
from merak_exec.mesh import init_distributed, loopback_env
from merak_sim.io import atomic_write_text
from support.launches import STORE_PORT, failure_text, hosted_store
from support.models import RecordingSGD, build_model, data, reference_run, tiny_gpt_config

__all__ = ["launch", "run_cases", "run_case", "launch_scenario", "launch_scenarios", "cli_fault"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    # Relative to the tensor's largest entry, floored at 1e-3: the attention key bias
    # has an exactly-zero true gradient (softmax ignores a per-query constant), so its
    # computed gradient is rounding noise whose plain relative error means nothing.
    a = a.full_tensor() if hasattr(a, "full_tensor") else a  # an FSDP shard: all of it
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-3))


def run_case(case: dict, steps: int = 3) -> dict:
    """Train under one configuration; return max relative errors vs the reference."""
    from merak_exec.parallel import parallelize
    from merak_exec.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig(**case["config"])
    kind, n_layer = case.get("model", "gpt"), case.get("n_layer", 4)
    mcfg = tiny_gpt_config(n_layer)
    seq = mcfg.n_positions
    batches = data(mcfg, pc.global_batch_size, seq, steps)
    meta = case.get("meta", False)
    model = build_model(kind, n_layer, meta)
    pm = parallelize(model, pc, seq_len=seq, optimizer_fn=lambda ps: RecordingSGD(ps, lr=0.1),
                     partition=case.get("partition", "uniform"),
                     split_points=case.get("split_points"))
    losses = [pm.train_step(x, y).loss for x, y in batches]
    ref_losses, ref_chain, ref_grads = reference_run(kind, n_layer, batches, pc, meta=meta)
    local = {li: layer for c in pm.chunks for li, layer in zip(pm.ranges[c.index], c.layers,
                                                              strict=True)}
    untied = [f"{ni}/{nj}" for (i, ni), (j, nj) in ref_chain.tied if i in local and
              j in local and local[i].get_parameter(ni) is not local[j].get_parameter(nj)]
    # ZeRO-1's optimizer steps shard pieces: its runs are judged by losses and parameters
    grads = {} if pc.zero else dict(zip([id(p) for p in pm.parameters()],
                                        pm.runtime.optimizer.last_grads, strict=True))
    err_g = err_p = 0.0
    tp, tr = pc.tp, pm.mesh.tp_rank
    for c in pm.chunks:
        for li, layer in zip(pm.ranges[c.index], c.layers, strict=True):
            for n, p in layer.named_parameters():
                mod_path, _, pname = n.rpartition(".")
                owner = layer.get_submodule(mod_path) if mod_path else layer
                ref_owner = ref_chain.layers[li].get_submodule(mod_path) if mod_path else \
                    ref_chain.layers[li]
                rp_full = ref_owner.get_parameter(pname)
                rg_full = ref_grads[id(rp_full)]
                if isinstance(owner, VocabParallelEmbedding):
                    rp = type(owner)(ref_owner, None, tp, tr).weight
                    g_owner = copy.deepcopy(ref_owner)
                    g_owner.weight.data.copy_(rg_full)
                    rg = type(owner)(g_owner, None, tp, tr).weight
                elif isinstance(owner, (ColumnParallelLinear, RowParallelLinear)):
                    # Shard the reference the same way (same class, same slicing code).
                    kw = ({"fused": owner.fused}
                          if isinstance(owner, ColumnParallelLinear) else {})
                    shard_p = type(owner)(ref_owner, None, tp, tr, **kw)
                    g_owner = copy.deepcopy(ref_owner)
                    getattr(g_owner, pname).data.copy_(rg_full)
                    shard_g = type(owner)(g_owner, None, tp, tr, **kw)
                    rp, rg = getattr(shard_p, pname), getattr(shard_g, pname)
                else:
                    rp, rg = rp_full, rg_full
                if os.environ.get("MERAK_DEBUG"):
                    print(pm.mesh.rank, li, n, _rel(p.detach(), rp.detach()))
                err_p = max(err_p, _rel(p.detach(), rp.detach()))
                if grads:
                    err_g = max(err_g, _rel(grads[id(p)], rg.detach()))
    err_l = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    return {"name": case["name"], "loss": err_l, "grad": err_g, "param": err_p,
            "losses": losses, "ref_losses": ref_losses, "untied": untied,
            "events": len(pm.history[-1].events)}


def run_cases(rank: int, world: int, port: int, cases: list[dict], out_dir: str) -> None:
    """Process entry point: initialise gloo, run every case, write results."""
    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", "60")

    results = []
    try:
        init_distributed(backend="gloo")
        for case in cases:
            results.append(run_case(case))
    except Exception:
        results.append({"error": failure_text(rank)})
    atomic_write_text(os.path.join(out_dir, f"rank{rank}.json"), json.dumps(results))
    os._exit(0)  # skip teardown (known gloo/DTensor exit-time aborts); results are written


def launch(world: int, cases: list[dict], out_dir: str, timeout_s: float = 600) -> list:
    """Spawn ``world`` ranks running ``cases``; return every rank's result list."""
    codes = run_ranks(run_cases, world, (world, STORE_PORT, cases, out_dir),
                      timeout_s=timeout_s)
    if None in codes:
        raise TimeoutError(f"multi-process test did not finish within {timeout_s} s")
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def assert_equivalent(results: list, cases: list[dict], tol: float = 1e-5) -> None:
    """Every rank ran every case without error and matched the single process: losses,
    last gradients and final parameters within relative ``tol``, losses changing."""
    for rank, rs in enumerate(results):
        errors = [r["error"] for r in rs if "error" in r]
        assert not errors, f"rank {rank}: {errors[0]}"
        assert [r["name"] for r in rs] == [c["name"] for c in cases]
        for r in rs:
            assert r["events"] > 0
            assert not r.get("untied"), f"rank {rank} case {r['name']}: {r['untied']} untied"
            for what in ("loss", "grad", "param"):
                assert r[what] <= tol, f"rank {rank} case {r['name']}: {what} rel err {r[what]}"
            assert len(r["losses"]) == 3 and r["losses"][-1] != r["losses"][0]


# -- scenario workers (resume, fault, bad input) ------------------------------------
def _setup(rank: int, world: int, port: int) -> None:
    loopback_env(rank, world, port)
    init_distributed(backend="gloo")


def scenario_resume(rank: int, arg: dict) -> dict:
    """Uninterrupted 4 steps vs 2 steps + checkpoint + resume for 2 more (Trainer API,
    AdamW, dropout 0.1); also loading a missing and a corrupt checkpoint."""
    import glob

    from merak_exec.checkpoint import CheckpointError
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.trainer import Trainer, TrainingArguments, init

    init(**arg.get("layout", {"pp": 2}), schedule="1f1b", recompute="full")
    mcfg = GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=4, n_head=4,
                     dropout=0.1)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (32, 9), generator=g)
    ds = [{"input_ids": r[:-1]} for r in ids]  # labels default to input_ids
    out = arg["dir"]

    def run(seed, steps, save=0, resume=None):
        torch.manual_seed(seed + 1000 * torch.distributed.get_rank())  # ranks differ
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=4, max_steps=steps,
                                 learning_rate=1e-2, save_steps=save,
                                 lr_scheduler_type="constant",  # same LR for 2 or 4 steps
                                 resume_from_checkpoint=resume, logging_steps=0)
        return Trainer(model=GPT(mcfg), args=args, train_dataset=ds).train().losses

    full = run(0, 4)
    first = run(0, 2, save=2)
    resumed = run(123, 4, resume=f"{out}/checkpoint-2")
    errors = {}
    try:
        run(0, 4, resume=f"{out}/no-such-checkpoint")
    except CheckpointError as e:
        errors["missing"] = str(e)
    torch.distributed.barrier()
    if rank == 0:
        for f in glob.glob(f"{out}/checkpoint-2/*.safetensors"):
            with open(f, "r+b") as fh:
                fh.truncate(16)
    torch.distributed.barrier()
    try:
        run(0, 4, resume=f"{out}/checkpoint-2")
    except CheckpointError as e:
        errors["corrupt"] = str(e)
    return {"full": full, "first": first, "resumed": resumed, "errors": errors}


class _DataDependent(torch.nn.Module):
    """Control flow on tensor values: torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 64)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        if x.sum() > 0:  # data-dependent branch
            x = 2 * x
        return self.layers[1](self.layers[0](x))


def scenario_bad_input(rank: int, arg: dict) -> dict:
    """Degrees that do not match the world, heads not divisible by tp, an uncapturable
    model: each must raise a one-line ExecError on every rank."""
    from merak_exec.mesh import ExecError
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    msgs = {}
    tries = {
        "degrees": lambda: parallelize(GPT(tiny_gpt_config()), ParallelConfig(
            dp=3, global_batch_size=3, dtype="fp32"), seq_len=8),
        "heads": lambda: parallelize(GPT(GPTConfig(vocab_size=64, n_positions=8, n_embd=18,
                                                   n_layer=2, n_head=3)),
                                     ParallelConfig(tp=2, dtype="fp32"), seq_len=8),
        "capture": lambda: parallelize(_DataDependent(), ParallelConfig(
            pp=2, global_batch_size=2, dtype="fp32"), seq_len=8),
    }
    for name, fn in tries.items():
        try:
            fn()
            msgs[name] = None
        except ExecError as e:
            msgs[name] = str(e)
    return msgs


def _scenarios_main(rank: int, world: int, port: int, jobs: list, out_dir: str) -> None:
    """Process entry point: join the gloo world once, then run every ``(name, arg)``
    scenario of ``jobs`` in turn, each writing its result before the next starts."""
    os.environ.update(MERAK_TIMEOUT_S="60")
    try:
        _setup(rank, world, port)
        failed = None
    except Exception:
        failed = {"exception": failure_text(rank)}
    for name, arg in jobs:
        try:
            result = failed or globals()[name](rank, arg)
        except Exception:
            result = {"exception": failure_text(rank)}
        atomic_write_text(os.path.join(out_dir, f"{name}-rank{rank}.json"), json.dumps(result))
    os._exit(0)


def launch_scenarios(world: int, jobs: list, out_dir: str,
                     timeout_s: float = 600) -> tuple[list, dict]:
    """Run every ``(name, arg)`` scenario of ``jobs`` in one launch of ``world`` ranks
    (one process start for all of them); return (exit codes, {name: per-rank results,
    None for a rank that wrote none})."""
    codes = run_ranks(_scenarios_main, world, (world, STORE_PORT, jobs, out_dir),
                      timeout_s=timeout_s, fail_fast=False)
    res = {}
    for name, _ in jobs:
        files = [os.path.join(out_dir, f"{name}-rank{r}.json") for r in range(world)]
        res[name] = [json.load(open(f)) if os.path.exists(f) else None for f in files]
    return codes, res


def launch_scenario(world: int, name: str, arg: dict, out_dir: str,
                    timeout_s: float = 300) -> tuple[list, list]:
    """Run scenario ``name`` on ``world`` ranks; return (exit codes, results or None)."""
    codes, res = launch_scenarios(world, [(name, arg)], out_dir, timeout_s)
    return codes, res[name]


def scenario_events(rank: int, arg: dict) -> dict:
    """Two pp ranks, 2 steps: the gathered events of the last step, as a RunResult."""
    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from merak_exec.result import RunResult
    from merak_exec.trainer import gather_events
    from merak_sim.config import ParallelConfig
    from merak_sim.schedule.ir import iter_actions

    pc = ParallelConfig(pp=2, global_batch_size=4, micro_batch_size=1, dtype="fp32",
                        schedule=arg.get("schedule", "1f1b"), recompute="full")
    mcfg = tiny_gpt_config()
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=8)
    for x, y in data(mcfg, 4, 8, 2):
        pm.train_step(x, y)
    res = RunResult(events=gather_events(pm))
    df = res.to_dataframe()
    trace = res.to_chrome_trace()
    if rank == 0 and arg.get("trace"):
        res.save_chrome_trace(arg["trace"])
    expected = sorted((r, str(a)) for r, prog in enumerate(pm.runtime.schedule.programs)
                      for a in iter_actions(prog))
    return {"columns": list(df.columns), "rows": len(df),
            "actions": sorted(zip(df["rank"].tolist(), df["action"].tolist(), strict=True)),
            "expected": [list(e) for e in expected],
            "ordered": bool((df["end_s"] >= df["start_s"]).all()),
            "streams": sorted(set(df["stream"])),
            "p2p_bytes": sorted(set(df.loc[df["stream"] == "p2p", "bytes"].tolist())),
            "trace_events": sum(1 for e in trace["traceEvents"] if e["ph"] == "X")}


def scenario_tp_dropout(rank: int, arg: dict) -> dict:
    """tp=2 with dropout 0.1 and different seeds per rank: after 3 steps the
    replicated parameters (LayerNorms, row-parallel biases, position table) must still
    be identical on both tp ranks."""
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.parallel import parallelize
    from merak_exec.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding
    from merak_sim.config import ParallelConfig

    torch.manual_seed(0)
    mcfg = GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=2, n_head=4,
                     dropout=0.1)
    model = GPT(mcfg)
    torch.manual_seed(100 + rank)  # ranks' RNG streams differ before parallelize
    from merak_exec.mesh import ExecError

    try:
        parallelize(GPT(mcfg), ParallelConfig(tp=2, micro_batch_size=2, global_batch_size=4,
                                              dtype="fp32", tp_overlap="sub-pipelined"),
                    seq_len=8)
        sub_err = None
    except ExecError as e:
        sub_err = str(e)
    pc = ParallelConfig(tp=2, micro_batch_size=2, global_batch_size=4, dtype="fp32")
    pm = parallelize(model, pc, seq_len=8)
    for x, y in data(mcfg, 4, 8, 3):
        pm.train_step(x, y)
    rep = {}
    for c in pm.chunks:
        for mod_name, mod in c.named_modules():
            if isinstance(mod, (ColumnParallelLinear, VocabParallelEmbedding)):
                continue
            for n, p in mod.named_parameters(recurse=False):
                if isinstance(mod, torch.nn.Module) and n == "weight" and \
                        type(mod).__name__ == "RowParallelLinear":
                    continue
                rep[f"{mod_name}.{n}"] = p.detach().double().sum().item()
    return {"replicated": rep, "subpipelined_error": sub_err}


def scenario_hooks(rank: int, arg: dict) -> dict:
    """Two pp ranks, 2 steps with counting runtime hooks, then one more after removing
    them; also a saved-tensor tracker over one step. Returns what the hooks counted and
    what the rank's program says they should have."""
    import contextlib
    from collections import Counter

    from merak_exec.hooks import RuntimeHooks
    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from merak_exec.profiling.saved_tensors import SavedTensorTracker
    from merak_sim.config import ParallelConfig
    from merak_sim.schedule.ir import Fused

    class Count(RuntimeHooks):
        def __init__(self) -> None:
            self.n: Counter = Counter()

        def on_action_start(self, action) -> None:
            self.n[f"start {action.kind.name}"] += 1

        def on_action_end(self, action) -> None:
            self.n[f"end {action.kind.name}"] += 1

        def on_post_start(self, parts) -> None:
            self.n["post_start"] += 1

        def on_post_end(self, parts) -> None:
            self.n["post_end"] += 1
            self.n["post_parts"] += len(parts)

        def saved_tensors_scope(self):
            self.n["scope"] += 1
            return contextlib.nullcontext()

        def on_checkpoint_inputs(self, tensors) -> None:
            self.n["checkpoint"] += 1

        def on_nograd_input(self, action, tensors) -> None:
            self.n["nograd"] += 1

    pc = ParallelConfig(pp=2, global_batch_size=4, micro_batch_size=1, dtype="fp32",
                        schedule="shifted-critical-path", recompute="stage-aware")
    mcfg = tiny_gpt_config()
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=8)
    count = Count()
    handle = pm.runtime.add_hooks(count)
    batches = data(mcfg, 4, 8, 3)
    for x, y in batches[:2]:
        pm.train_step(x, y)
    handle.remove()
    pm.train_step(*batches[2])
    with SavedTensorTracker(pm.parameters(), pm.runtime) as tr:
        pm.train_step(*batches[0])
        peak = tr.peak_bytes
    want: Counter = Counter()
    forwards = 0
    for step in pm.runtime.program:
        if isinstance(step, Fused) or step.kind.is_comm:
            want["post_start"] += 2
            want["post_end"] += 2
            want["post_parts"] += 2 * len(step.parts)
            continue
        want[f"start {step.kind.name}"] += 2
        want[f"end {step.kind.name}"] += 2
        if step.kind.name in ("FORWARD", "FORWARD_NOGRAD", "RECOMPUTE"):
            want["scope"] += 2
        if step.kind.name == "FORWARD":
            forwards += 1
        if step.kind.name == "FORWARD_NOGRAD":
            want["nograd"] += 2
    want["checkpoint"] = 2 * forwards * pm.chunks[0].recompute_layers
    return {"got": {k: v for k, v in count.n.items() if v},
            "want": {k: v for k, v in want.items() if v}, "peak": peak,
            "hooks_left": len(pm.runtime.hooks) + sum(len(c.hooks) for c in pm.chunks)}


# -- fault injection on the real CLI ----------------------------------------------
def cli_fault(world: int, train_args: list[str], victim: int, mode: str, timeout_s: float,
              cwd: str, wait_s: float = 300) -> dict:
    """Launch ``python -m merak_exec train *train_args`` as ``world`` processes (the
    environment torchrun would give them; no torchrun, whose agent would end the
    others itself), wait for rank 0 to log step 3, then ``mode`` ("stall": SIGSTOP,
    "kill": SIGKILL) rank ``victim``. Returns, for every other rank, its exit code,
    its stderr lines and the seconds from the fault to its exit."""
    import signal
    import subprocess
    import sys
    import time

    import contextlib

    store = contextlib.ExitStack()  # the rendezvous store, served until the ranks end
    rendezvous = store.enter_context(hosted_store(world))
    procs = []
    for r in range(world):
        env = dict(os.environ, **rendezvous, RANK=str(r),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1", MERAK_TIMEOUT_S=str(timeout_s))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "merak_exec", "train", *train_args], cwd=cwd, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + wait_s
        for line in procs[0].stdout:  # rank 0 logs every step
            if line.startswith("step 3 ") or time.monotonic() > deadline:
                break
        else:
            raise RuntimeError("rank 0 ended before step 3: "
                               + procs[0].stderr.read()[-2000:])
        t0 = time.monotonic()
        procs[victim].send_signal(signal.SIGSTOP if mode == "stall" else signal.SIGKILL)
        out = {}
        for r, p in enumerate(procs):
            if r == victim:
                continue
            try:
                _, err = p.communicate(timeout=max(1.0, t0 + timeout_s + 60 - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            out[r] = {"code": p.returncode, "after_s": time.monotonic() - t0,
                      "stderr": [ln for ln in err.splitlines() if ln.strip()]}
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        store.close()


def scenario_tp_replicas(rank: int, arg: dict) -> dict:
    """tp=2, each rank builds the model from its own seed: right after parallelize the
    replicated parameters must agree across tp ranks; returns their checksums."""
    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from merak_exec.replicas import sharded_parameters
    from merak_sim.config import ParallelConfig

    torch.manual_seed(10 + rank)
    pm = parallelize(GPT(tiny_gpt_config(2)), ParallelConfig(
        tp=2, micro_batch_size=2, global_batch_size=4, dtype="fp32"), seq_len=8)
    sharded = sharded_parameters(pm.chunks)
    return {n: p.detach().double().sum().item() for n, p in pm.named_parameters()
            if id(p) not in sharded}
