"""One prepared GPU run: profile the built-in GPT at realistic shapes and measure pp=1
training throughput against a plain PyTorch loop (for the lent H200).

What it does (about 3-5 minutes on an H200):
1. ``merak-exec profile`` logic at hidden 2048 (16 heads) and 4096 (32 heads), seq
   2048, vocab 50304, bf16, micro-batch sizes 1, 2, 4 (h2048) and 1, 2 (h4096):
   writes ``traces/h200/gpt-h2048-bf16.json`` and ``traces/h200/gpt-h4096-bf16.json``
   (merak-trace/1, CUDA-event timing, median of repeats).
2. Trains a 16-layer h2048 GPT (about 0.9 B parameters) for ``--steps`` iterations of
   M=4 micro-batches of 4 x 2048 tokens with merak_exec (pp=tp=dp=1, the schedule
   interpreter, per-action CUDA-event recording on) and with a plain loop of the same
   model and data; reports median step time, model TFLOP/s and MFU against the H200's
   989 TFLOP/s bf16 dense peak (NVIDIA H200 datasheet). Model FLOPs per
   iteration: 3 * tokens * (L * (24 h^2 + 4 s h) + 2 h V) (forward + backward, no
   recompute; Narayanan et al. 2021's count).
Results go to ``benchmarks/results/h200_exec.json`` and, when ``$OUT`` is set, are
copied there too. ``--cpu-dry-run`` runs the same code at toy sizes on the CPU (used to
check the script where no GPU is lent).

    python benchmarks/bench_exec_h200.py [--steps 10] [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import torch

PEAK_BF16_FLOPS = 989e12  # H200 SXM dense bf16 (NVIDIA H200 datasheet)


def model_flops(tokens: int, L: int, h: int, s: int, V: int) -> float:
    """Forward + backward model FLOPs of one iteration (no recompute)."""
    return 3.0 * tokens * (L * (24 * h * h + 4 * s * h) + 2 * h * V)


def profile_shapes(dry: bool, out_dir: str) -> list[str]:
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.profiling.layer_trace import profile_chain
    from merak_sim.trace import Trace, from_exec_profile, merge_traces, write_trace

    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    shapes = ([(64, 4, 64, 256, (1, 2))] if dry else
              [(2048, 16, 2048, 50304, (1, 2, 4)), (4096, 32, 2048, 50304, (1, 2))])
    written = []
    for h, heads, seq, V, mbs_list in shapes:
        torch.manual_seed(0)
        with torch.device("meta"):
            cfg = GPTConfig(vocab_size=V, n_positions=seq, n_embd=h, n_layer=1, n_head=heads)
        model = GPT(cfg)
        traces = []
        for mbs in mbs_list:
            prof = profile_chain(model, mbs, seq, device=device, dtype=dtype, warmup=3,
                                 repeats=10, meta={"command": "benchmarks/bench_exec_h200.py"})
            d = from_exec_profile(prof.to_dict())
            d["model"]["name"] = f"gpt-h{h}"
            traces.append(Trace.from_dict(d, "h200 profile"))
            for lp in prof.layers:
                print(f"h{h} mbs{mbs} {lp.name:9s} fwd {lp.forward_s * 1e3:8.3f} ms bwd "
                      f"{lp.backward_s * 1e3:8.3f} ms act {lp.activation_bytes / 2**20:9.1f} MiB",
                      flush=True)
        path = os.path.join(out_dir, f"gpt-h{h}-{'fp32' if dry else 'bf16'}.json")
        write_trace(merge_traces(traces), path)
        written.append(path)
        del model
        if not dry:
            torch.cuda.empty_cache()
    return written


def throughput(dry: bool, steps: int) -> dict:
    from merak_exec.models import GPT, GPTConfig, lm_loss
    from merak_exec.parallel import parallelize
    from merak_sim.config import ParallelConfig

    dev = torch.device("cpu" if dry else "cuda")
    L, h, heads, s, V, mbs, M = (2, 64, 4, 64, 256, 2, 2) if dry else \
        (16, 2048, 16, 2048, 50304, 4, 4)
    cfg = GPTConfig(vocab_size=V, n_positions=s, n_embd=h, n_layer=L, n_head=heads)
    dt = torch.float32 if dry else torch.bfloat16
    pc = ParallelConfig(micro_batch_size=mbs, global_batch_size=mbs * M,
                        dtype="fp32" if dry else "bf16")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (mbs * M, s), generator=g)
    labels = torch.randint(0, V, (mbs * M, s), generator=g)

    def sync():
        if not dry:
            torch.cuda.synchronize()

    def timed(step, n):
        ts = []
        for i in range(3 + n):
            sync()
            t = time.perf_counter()
            step()
            sync()
            if i >= 3:
                ts.append(time.perf_counter() - t)
        return ts

    def run_plain() -> tuple[list[float], int]:
        torch.manual_seed(0)
        plain = GPT(cfg).to(dev, dt)
        opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
        x_dev, y_dev = ids.to(dev), labels.to(dev)

        def plain_step():
            for x, y in zip(x_dev.split(mbs), y_dev.split(mbs), strict=True):
                (lm_loss(plain(x), y) / M).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return timed(plain_step, steps), sum(p.numel() for p in plain.parameters())

    # plain loop first (its model freed on return), then ours
    t_plain, n_params = run_plain()
    if not dry:
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    ours = parallelize(GPT(cfg), pc, seq_len=s,
                       optimizer_fn=lambda ps: torch.optim.AdamW(ps, lr=1e-4))
    t_ours = timed(lambda: ours.train_step(ids, labels), steps)
    events = ours.history[-1].events
    flops = model_flops(mbs * M * s, L, h, s, V)
    res = {}
    for name, ts in (("merak_exec", t_ours), ("plain", t_plain)):
        med = statistics.median(ts)
        res[name] = {"median_step_s": med, "steps_s": ts, "model_tflops": flops / med / 1e12,
                     "mfu": flops / med / PEAK_BF16_FLOPS}
    res["overhead_pct"] = (res["merak_exec"]["median_step_s"] /
                           res["plain"]["median_step_s"] - 1) * 100
    res["shape"] = dict(layers=L, hidden=h, heads=heads, seq=s, vocab=V, mbs=mbs,
                        microbatches=M, params=n_params, dtype=str(dt))
    res["events_last_step"] = len(events)
    if not dry:
        res["gpu"] = torch.cuda.get_device_name()
        res["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cpu-dry-run", action="store_true")
    a = p.parse_args()
    dry = a.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("bench_exec_h200: no CUDA device; use --cpu-dry-run")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from merak_exec.mesh import init_distributed

    init_distributed()
    if not dry:
        torch.backends.cuda.matmul.allow_tf32 = True
    tdir = "/tmp/merak_h200_dry" if dry else "traces/h200"
    os.makedirs(tdir, exist_ok=True)
    out = {"traces": profile_shapes(dry, tdir)}
    out["throughput"] = throughput(dry, a.steps)
    tp = out["throughput"]
    print(json.dumps({k: v for k, v in tp.items() if k not in ("merak_exec", "plain")}))
    for k in ("merak_exec", "plain"):
        print(f"{k:11s} median step {tp[k]['median_step_s'] * 1e3:9.2f} ms  "
              f"{tp[k]['model_tflops']:7.1f} TFLOP/s  MFU {tp[k]['mfu'] * 100:5.1f} %")
    print(f"overhead {tp['overhead_pct']:+.2f} %")
    from merak_sim.io import atomic_write_text

    res_path = ("/tmp/merak_h200_dry/h200_exec.json" if dry else
                "benchmarks/results/h200_exec.json")
    atomic_write_text(res_path, json.dumps(out, indent=1))
    if os.environ.get("OUT"):
        for f in [res_path, *out["traces"]]:
            shutil.copy(f, os.environ["OUT"])


if __name__ == "__main__":
    main()
