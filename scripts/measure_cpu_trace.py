"""Measure a ``merak-trace/1`` CPU trace of a small built-in GPT on this machine.

Stop-gap profiler until merak_exec's profiler lands (the real-backend issue); it writes
the same format. For each layer kind of the built-in GPT (merak_exec/models/gpt.py:
"embedding", one "block", "head" = final LayerNorm + tied LM head + cross entropy) and
each (micro-batch size, sequence length) it records, as the median of ``--repeats``
runs after ``--warmup`` runs, timed with ``time.perf_counter``:

- forward_s: forward with grad; recompute_s: a second, separately timed forward with
  grad (what a re-forward from a checkpoint costs);
- backward_s: ``torch.autograd.backward`` of that forward (input and weight grads);
- backward_input_s: ``torch.autograd.grad`` w.r.t. the layer input only;
  backward_weight_s: backward_s - backward_input_s (clamped at 0);
- activation_bytes: storages saved for backward (``saved_tensors_hooks``; parameters
  excluded, views of one storage counted once);
- param_bytes: parameter bytes of the layer.

With ``--collectives``, two gloo processes on loopback also time all-reduce,
all-gather and send/recv (gloo has no reduce-scatter) for a few sizes, each the median
of 15 runs started after a barrier, recorded as group size 2, placement "intra"
(bytes = the full buffer: the all-reduced tensor, the gathered output, the message).

Usage (the shipped trace, about a minute on 2 cores):

    .venv/bin/python scripts/measure_cpu_trace.py --out traces/cpu-gpt-tiny.json \\
        --collectives
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from merak_exec.profiler import saved_tensor_bytes  # noqa: E402
from merak_sim.model import ModelSpec  # noqa: E402
from merak_sim.trace import (  # noqa: E402
    CollectiveRecord,
    LayerRecord,
    Provenance,
    Trace,
    write_trace,
)


def _time(fn, *args) -> tuple[float, object]:
    """(seconds, result) of ``fn(*args)``."""
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def _fwd(layer, loss, x):
    return loss(layer(x))


def measure_layer(kind, layer, make_input, loss, mbs, seq, warmup, repeats) -> LayerRecord:
    """Time one layer kind at one shape (module docstring)."""
    params = list(layer.parameters())
    samples: dict[str, list[float]] = {k: [] for k in ("f", "r", "b", "bi")}
    for i in range(warmup + repeats):
        x = make_input()
        tf, y = _time(_fwd, layer, loss, x)
        tb, _ = _time(torch.autograd.backward, y, torch.ones_like(y))
        x = make_input()
        tr, y = _time(_fwd, layer, loss, x)
        if x.requires_grad:
            tbi, _ = _time(torch.autograd.grad, y, [x], torch.ones_like(y))
        else:
            tbi = 0.0
        for p in params:
            p.grad = None
        if i >= warmup:
            for k, v in (("f", tf), ("r", tr), ("b", tb), ("bi", tbi)):
                samples[k].append(v)
    med = {k: statistics.median(v) for k, v in samples.items()}
    x = make_input()
    _, act = saved_tensor_bytes(lambda: _fwd(layer, loss, x), params)
    return LayerRecord(
        kind=kind, micro_batch_size=mbs, seq_len=seq, forward_s=med["f"], backward_s=med["b"],
        recompute_s=med["r"], activation_bytes=float(act),
        param_bytes=float(sum(p.numel() * p.element_size() for p in params)), tp=1,
        backward_input_s=min(med["bi"], med["b"]),
        backward_weight_s=max(0.0, med["b"] - med["bi"]), repeats=repeats,
        forward_std_s=statistics.pstdev(samples["f"]),
        backward_std_s=statistics.pstdev(samples["b"]))


def measure_model(spec: ModelSpec, mbs_list, seq_list, warmup, repeats) -> list[LayerRecord]:
    """All layer kinds of the built-in GPT shaped like ``spec``."""
    from merak_exec.models.gpt import Block, Embedding, GPTConfig, Head

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=spec.vocab, n_positions=max(seq_list), n_embd=spec.hidden,
                    n_layer=1, n_head=spec.heads, ffn_mult=spec.ffn_hidden // spec.hidden,
                    dropout=spec.dropout)
    emb, blk = Embedding(cfg).train(), Block(cfg).train()
    head = Head(cfg, None).train()  # untied here so its weight is its own parameter
    out = []
    for seq in seq_list:
        for mbs in mbs_list:
            ids = torch.randint(0, spec.vocab, (mbs, seq))
            tgt = torch.randint(0, spec.vocab, (mbs * seq,))
            hidden = functools.partial(torch.randn, mbs, seq, spec.hidden, requires_grad=True)
            out.append(measure_layer("embedding", emb, functools.partial(_const, ids),
                                     _identity, mbs, seq, warmup, repeats))
            out.append(measure_layer("block", blk, hidden, _identity, mbs, seq, warmup,
                                     repeats))
            out.append(measure_layer("head", head, hidden,
                                     functools.partial(_ce, spec.vocab, tgt), mbs, seq,
                                     warmup, repeats))
    return out


def _const(v):
    return v


def _identity(y):
    return y


def _ce(vocab, tgt, y):
    return F.cross_entropy(y.view(-1, vocab), tgt)


def _coll_worker(rank: int, port: int, sizes, repeats, q) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=_dt.timedelta(seconds=60))
    torch.set_num_threads(1)
    res = []
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.ones(n)
        outs = [torch.empty(n // 2), torch.empty(n // 2)]
        ops = {
            "all-reduce": functools.partial(dist.all_reduce, x),
            "all-gather": functools.partial(dist.all_gather, outs, x[: n // 2]),
            "p2p": (functools.partial(dist.send, x, 1) if rank == 0
                    else functools.partial(dist.recv, x, 0)),
        }
        for name, op in ops.items():
            ts = []
            for _ in range(repeats + 1):
                dist.barrier()
                ts.append(_time(op)[0])
            res.append((name, nbytes, statistics.median(ts[1:])))
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()


def measure_collectives(sizes, repeats) -> list[CollectiveRecord]:
    """Two gloo ranks on loopback (module docstring)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_coll_worker, args=(r, port, sizes, repeats, q))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        res = q.get(timeout=300)
    except Exception as e:  # queue.Empty
        raise RuntimeError("collective measurement: no result from rank 0 within 300 s; "
                           "check that loopback TCP works") from e
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return [CollectiveRecord(name, 2, "intra", float(nb), t) for name, nb, t in res]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "traces" / "cpu-gpt-tiny.json")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--mbs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--seq", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: as each process of a 2-rank gloo run gets)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--collectives", action="store_true",
                    help="also time gloo collectives between 2 local processes")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = ModelSpec(name="cpu-gpt-tiny", family="gpt", layers=4, hidden=args.hidden,
                     heads=args.heads, seq_len=max(args.seq), vocab=args.vocab,
                     dtype="fp32", dropout=args.dropout,
                     source="built-in GPT (merak_exec/models/gpt.py), measured by "
                            "scripts/measure_cpu_trace.py")
    layers = measure_model(spec, args.mbs, args.seq, args.warmup, args.repeats)
    colls = measure_collectives([2**16, 2**18, 2**20, 2**22], 15) if args.collectives else []
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    prov = Provenance(
        device=f"cpu ({cpu}, {os.cpu_count()} cores, {args.threads} torch thread(s))",
        dtype="fp32", torch=torch.__version__, git_commit=commit or "unknown",
        command="python scripts/measure_cpu_trace.py " + " ".join(argv or sys.argv[1:]),
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        notes=f"median of {args.repeats} after {args.warmup} warm-up runs; shared 2-core "
              "machine, expect 10-30 % noise")
    trace = Trace(prov, spec, tuple(layers), tuple(colls))
    write_trace(trace, args.out)
    for r in layers:
        print(f"{r.kind:9s} mbs={r.micro_batch_size} s={r.seq_len:4d} "
              f"fwd={r.forward_s * 1e3:7.2f} ms bwd={r.backward_s * 1e3:7.2f} ms "
              f"act={r.activation_bytes / 2**20:7.2f} MiB")
    for c in colls:
        print(f"{c.collective:15s} {c.bytes / 2**20:6.2f} MiB {c.seconds * 1e3:7.3f} ms")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
