"""Helpers for multi-process equivalence tests (gloo on loopback, CPU).

:func:`launch` spawns ``world`` processes with torch.multiprocessing; each runs
:func:`run_cases`, which trains the built-in GPT under every given configuration and
compares losses, final gradients and parameters with a single-process run of the same
model and data. Each rank writes its comparison to ``out_dir/rank<r>.json`` *before*
tearing down, so the caller judges reported results, not exit signals.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import traceback

import torch

__all__ = ["free_port", "launch", "run_cases", "tiny_gpt_config", "reference_run"]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_gpt_config(n_layer: int = 4):
    """A GPT small enough for 2-4 CPU processes."""
    from merak_exec.models import GPTConfig

    return GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=n_layer, n_head=4,
                     dropout=0.0)


def data(cfg_model, global_batch: int, seq: int, steps: int, seed: int = 1):
    """Deterministic token batches ``[(ids, labels)] * steps``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, cfg_model.vocab_size, (global_batch, seq + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it last applied (for comparisons)."""

    def step(self, closure=None):  # noqa: D102 - documented by the class
        self.last_grads = [None if p.grad is None else p.grad.detach().clone()
                           for g in self.param_groups for p in g["params"]]
        return super().step(closure)


class CustomLM(torch.nn.Module):
    """A model no adapter knows (captured by torch.export): embedding, blocks that take
    the residual stream *and* a broadcast mask computed once up front, tied head."""

    def __init__(self, vocab: int = 64, h: int = 16, n_layer: int = 4) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.layers = torch.nn.ModuleList(_CustomBlock(h) for _ in range(n_layer))
        self.norm = torch.nn.LayerNorm(h)
        self.head = torch.nn.Linear(h, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits."""
        x = self.emb(ids)
        pos = torch.arange(ids.shape[1], device=ids.device, dtype=x.dtype)
        gate = torch.sigmoid(pos / ids.shape[1])[None, :, None]
        for blk in self.layers:
            x = blk(x, gate)
        return self.head(self.norm(x))


class _CustomBlock(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 2 * h)
        self.fc2 = torch.nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return x + gate * self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def build_model(kind: str, n_layer: int = 4):
    """A tiny model of the given family ("gpt", "gpt2", "llama", "custom"), seeded
    identically."""
    torch.manual_seed(0)
    if kind == "custom":
        return CustomLM(n_layer=n_layer)
    if kind == "gpt":
        from merak_exec.models import GPT

        return GPT(tiny_gpt_config(n_layer))
    import transformers

    transformers.logging.set_verbosity_error()
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16,
                                          n_layer=n_layer, n_head=4, resid_pdrop=0.0,
                                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                          eos_token_id=0))
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16,
                                            intermediate_size=32, num_hidden_layers=n_layer,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=8, bos_token_id=0,
                                            eos_token_id=0, pad_token_id=0))
    raise ValueError(f"unknown test model {kind!r}")


def reference_run(kind: str, n_layer: int, batches, pc, lr: float = 0.1):
    """Single-process training with the same model, data and loss scaling: returns
    (losses, chain, grads of the last step keyed by parameter id)."""
    from merak_exec.capture import to_chain

    model = build_model(kind, n_layer)
    seq = batches[0][0].shape[1]
    chain, _ = to_chain(model, seq)
    opt = RecordingSGD(model.parameters(), lr=lr)
    n_mb = pc.global_batch_size // pc.micro_batch_size
    losses = []
    for ids, labels in batches:
        total = 0.0
        mbs = pc.micro_batch_size
        for x, y in zip(ids.split(mbs), labels.split(mbs), strict=True):
            xs = (x,)
            for layer in chain.layers:
                out = layer(*xs)
                xs = out if isinstance(out, tuple) else (out,)
            loss = chain.loss_fn(xs[0], y)
            (loss / n_mb).backward()
            total += loss.item() / n_mb
        losses.append(total)
        opt.step()
        opt.zero_grad()
    grads = {id(p): g for p, g in zip(model.parameters(), opt.last_grads, strict=True)}
    return losses, chain, grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    # Relative to the tensor's largest entry, floored at 1e-3: the attention key bias
    # has an exactly-zero true gradient (softmax ignores a per-query constant), so its
    # computed gradient is rounding noise whose plain relative error means nothing.
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
    model = build_model(kind, n_layer)
    pm = parallelize(model, pc, seq_len=seq, optimizer_fn=lambda ps: RecordingSGD(ps, lr=0.1),
                     partition=case.get("partition", "uniform"),
                     split_points=case.get("split_points"))
    losses = [pm.train_step(x, y).loss for x, y in batches]
    ref_losses, ref_chain, ref_grads = reference_run(kind, n_layer, batches, pc)
    grads = dict(zip([id(p) for p in pm.parameters()], pm.runtime.optimizer.last_grads,
                     strict=True))
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
                    print(pm.mesh.rank, li, n, _rel(p.detach(), rp.detach()),
                          _rel(grads[id(p)], rg.detach()))
                err_p = max(err_p, _rel(p.detach(), rp.detach()))
                err_g = max(err_g, _rel(grads[id(p)], rg.detach()))
    err_l = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    return {"name": case["name"], "loss": err_l, "grad": err_g, "param": err_p,
            "losses": losses, "ref_losses": ref_losses,
            "events": len(pm.history[-1].events)}


def run_cases(rank: int, world: int, port: int, cases: list[dict], out_dir: str) -> None:
    """Process entry point: initialise gloo, run every case, write results."""
    from merak_exec.mesh import init_distributed, loopback_env

    loopback_env(rank, world, port)
    os.environ.setdefault("MERAK_TIMEOUT_S", "60")

    results = []
    try:
        init_distributed(backend="gloo")
        for case in cases:
            results.append(run_case(case))
    except Exception:
        results.append({"error": traceback.format_exc()})
    from merak_sim.io import atomic_write_text

    atomic_write_text(os.path.join(out_dir, f"rank{rank}.json"), json.dumps(results))
    os._exit(0)  # skip teardown (known gloo/DTensor exit-time aborts); results are written


def launch(world: int, cases: list[dict], out_dir: str, timeout_s: float = 600) -> list:
    """Spawn ``world`` ranks running ``cases``; return every rank's result list."""
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.spawn(run_cases, args=(world, port, cases, out_dir), nprocs=world, join=False)
    import time

    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"multi-process test did not finish within {timeout_s} s")
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


# -- scenario workers (resume, fault, bad input) ------------------------------------
def _setup(rank: int, world: int, port: int) -> None:
    from merak_exec.mesh import init_distributed, loopback_env

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
    ds = [{"input_ids": r[:-1], "labels": r[1:]} for r in ids]
    out = arg["dir"]

    def run(seed, steps, save=0, resume=None):
        torch.manual_seed(seed + 1000 * torch.distributed.get_rank())  # ranks differ
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=1,
                                 gradient_accumulation_steps=4, max_steps=steps,
                                 learning_rate=1e-2, save_steps=save,
                                 resume_from_checkpoint=resume, logging_steps=0)
        return Trainer(model=GPT(mcfg), args=args, train_dataset=ds).train().losses

    full = run(0, 4)
    first = run(0, 2, save=2)
    resumed = run(123, 4, resume=f"{out}/checkpoint")
    errors = {}
    try:
        run(0, 4, resume=f"{out}/no-such-checkpoint")
    except CheckpointError as e:
        errors["missing"] = str(e)
    torch.distributed.barrier()
    if rank == 0:
        for f in glob.glob(f"{out}/checkpoint/*.distcp"):
            with open(f, "r+b") as fh:
                fh.truncate(16)
    torch.distributed.barrier()
    try:
        run(0, 4, resume=f"{out}/checkpoint")
    except CheckpointError as e:
        errors["corrupt"] = str(e)
    return {"full": full, "first": first, "resumed": resumed, "errors": errors}


def scenario_kill(rank: int, arg: dict) -> dict:
    """Rank 1 dies (``arg["mode"] == "die"``) or stalls for 2 timeouts ("stall") in the
    middle of step 2; the others must fail with a clear error within the timeout."""
    import time

    from merak_exec.models import GPT
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    pc = ParallelConfig(pp=2, global_batch_size=4, micro_batch_size=1, dtype="fp32")
    mcfg = tiny_gpt_config()
    torch.manual_seed(0)
    pm = parallelize(GPT(mcfg), pc, seq_len=8)
    (x, y), = data(mcfg, 4, 8, 1)
    pm.train_step(x, y)
    if rank == 1:
        chunk = pm.chunks[0]
        orig = chunk.forward
        calls = {"n": 0}

        def dying(*a, **k):
            calls["n"] += 1
            if calls["n"] == 2:
                if arg.get("mode", "die") == "die":
                    os._exit(3)
                time.sleep(2 * arg["timeout_s"])
            return orig(*a, **k)

        chunk.forward = dying
    t = time.monotonic()
    try:
        pm.train_step(x, y)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "after_s": time.monotonic() - t,
                "exit": 1}
    return {"error": None, "after_s": time.monotonic() - t}


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


def _scenario_main(rank: int, world: int, port: int, name: str, arg: dict, out_dir: str):
    os.environ.update(MERAK_TIMEOUT_S=str(arg.get("timeout_s", 60)))
    result: dict
    try:
        _setup(rank, world, port)
        result = globals()[name](rank, arg)
    except Exception:
        result = {"exception": traceback.format_exc()}
    from merak_sim.io import atomic_write_text

    atomic_write_text(os.path.join(out_dir, f"{name}-rank{rank}.json"), json.dumps(result))
    os._exit(int(result.get("exit", 0)) if isinstance(result, dict) else 0)


def launch_scenario(world: int, name: str, arg: dict, out_dir: str,
                    timeout_s: float = 300) -> tuple[list, list]:
    """Run scenario ``name`` on ``world`` ranks; return (exit codes, results or None)."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_scenario_main, args=(r, world, port, name, arg, out_dir))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    res = []
    for r in range(world):
        f = os.path.join(out_dir, f"{name}-rank{r}.json")
        res.append(json.load(open(f)) if os.path.exists(f) else None)
    return [p.exitcode for p in procs], res


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
