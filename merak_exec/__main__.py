"""``merak-exec`` / ``python -m merak_exec``: train or profile on real ranks.

Launch under torchrun (``torchrun --nproc-per-node 4 -m merak_exec train --pp 2 --tp 2``)
or srun; a plain ``python -m merak_exec`` is a world of one. Bad input (degrees that
do not match the world, heads not divisible by tp, a missing or corrupt checkpoint, a
lost peer) ends every rank with one line ``merak-exec: error: ...`` and exit status 2
(1 for a lost peer), no traceback.
"""

from __future__ import annotations

import sys

import click

__all__ = ["main", "cli"]


def _model(kind: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
           dropout: float, meta: bool):
    import torch

    from merak_exec.mesh import ExecError

    ctx = torch.device("meta") if meta else torch.device("cpu")
    with ctx:
        if kind == "gpt":
            from merak_exec.models import GPT, GPTConfig

            return GPT(GPTConfig(vocab_size=vocab, n_positions=seq, n_embd=hidden,
                                 n_layer=layers, n_head=heads, dropout=dropout))
        import transformers

        transformers.logging.set_verbosity_error()
        if kind == "gpt2":
            from transformers import GPT2Config, GPT2LMHeadModel

            return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=hidden,
                                              n_layer=layers, n_head=heads, resid_pdrop=dropout,
                                              embd_pdrop=dropout, attn_pdrop=dropout,
                                              bos_token_id=0, eos_token_id=0))
        if kind == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                                                intermediate_size=4 * hidden,
                                                num_hidden_layers=layers,
                                                num_attention_heads=heads,
                                                max_position_embeddings=seq, bos_token_id=0,
                                                eos_token_id=0, pad_token_id=0))
    raise ExecError(f"unknown model {kind!r}; choose gpt, gpt2 or llama")


_MODEL_OPTS = [
    click.option("--model", "kind", type=click.Choice(["gpt", "gpt2", "llama"]), default="gpt",
                 show_default=True, help="built-in GPT or a HuggingFace model from a config"),
    click.option("--layers", default=4, show_default=True),
    click.option("--hidden", default=64, show_default=True),
    click.option("--heads", default=4, show_default=True),
    click.option("--vocab", default=256, show_default=True),
    click.option("--seq", default=32, show_default=True),
    click.option("--dropout", default=0.0, show_default=True),
]


def _model_opts(f):
    for opt in reversed(_MODEL_OPTS):
        f = opt(f)
    return f


@click.group()
def cli() -> None:
    """Run Merak's 3D-parallel training for real (torch.distributed)."""


@cli.command()
@_model_opts
@click.option("--dp", default=1, show_default=True)
@click.option("--tp", default=1, show_default=True)
@click.option("--pp", default=1, show_default=True)
@click.option("--virtual-stages", default=1, show_default=True)
@click.option("--schedule", default="1f1b", show_default=True)
@click.option("--recompute", default="none", show_default=True,
              help="none, full, selective (attention core) or stage-aware")
@click.option("--tp-overlap", default="none", show_default=True)
@click.option("--zero", default=0, show_default=True,
              help="ZeRO stage: 1 shards the optimizer state over dp")
@click.option("--sequence-parallel", is_flag=True,
              help="split norms and dropout along the sequence over tp (needs --tp > 1)")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True, help="bf16/fp16: autocast on fp32 master weights (fp16 "
                                      "with a dynamic loss scaler)")
@click.option("--mbs", default=1, show_default=True, help="micro-batch size")
@click.option("--microbatches", default=4, show_default=True, help="per pipeline (M)")
@click.option("--steps", default=10, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--save-dir", default=None, help="checkpoint directory root")
@click.option("--save-every", default=0, show_default=True)
@click.option("--resume", default=None, help="checkpoint to resume from")
@click.option("--trace", "trace_path", default=None, help="write a Chrome trace (rank 0)")
@click.option("--split-points", default=None,
              help="comma-separated layer indices where stages begin (chain layers: "
                   "0 = embedding, 1..L = blocks, L+1 = head)")
@click.option("--meta/--no-meta", default=True, show_default=True,
              help="build the model on the meta device; materialise only local layers")
@click.option("--plan", "plan_path", default=None,
              help="a merak-plan/1 file (from `merak-sim plan`/`dispatch`): its model and "
                   "parallel configuration replace the model, degree and batch options")
def train(kind, layers, hidden, heads, vocab, seq, dropout, dp, tp, pp, virtual_stages,
          schedule, recompute, tp_overlap, zero, sequence_parallel, dtype, mbs, microbatches,
          steps, lr, save_dir, save_every, resume, trace_path, split_points, meta,
          plan_path) -> None:
    """Train a model on synthetic tokens with dp x tp x pp."""
    import torch

    import merak_exec

    extra: dict = {"zero": zero, "sequence_parallel": sequence_parallel}
    if plan_path is not None:
        (kind, layers, hidden, heads, vocab, seq), extra = _from_plan(plan_path)
        dp, tp, pp = extra.pop("dp"), extra.pop("tp"), extra.pop("pp")
        mbs, microbatches = extra.pop("micro_batch_size"), extra.pop("microbatches")
        virtual_stages, schedule = extra.pop("virtual_stages"), extra.pop("schedule")
        recompute, tp_overlap = extra.pop("recompute"), extra.pop("tp_overlap")
    merak_exec.init(dp=dp, tp=tp, pp=pp, virtual_stages=virtual_stages, schedule=schedule,
                    recompute=recompute, tp_overlap=tp_overlap, dtype=dtype, **extra)
    g = torch.Generator().manual_seed(0)
    n = max(64, dp * mbs * microbatches * 4)
    toks = torch.randint(0, vocab, (n, seq), generator=g)
    ds = [{"input_ids": t} for t in toks]  # labels = input_ids (the loss shifts them)
    torch.manual_seed(0)
    model = _model(kind, layers, hidden, heads, vocab, seq, dropout, meta)
    args = merak_exec.TrainingArguments(
        output_dir=save_dir or "merak_out", per_device_train_batch_size=mbs,
        gradient_accumulation_steps=microbatches, max_steps=steps, learning_rate=lr,
        save_steps=save_every if save_dir else 0, resume_from_checkpoint=resume,
        trace_path=trace_path,
        split_points=[int(x) for x in split_points.split(",")] if split_points else None)
    res = merak_exec.Trainer(model=model, args=args, train_dataset=ds).train()
    if torch.distributed.get_rank() == 0 and res.step_times_s:
        click.echo(f"median step {res.iteration_time_s * 1e3:.2f} ms, first loss "
                   f"{res.losses[0]:.5f}, final loss {res.losses[-1]:.5f}")


def _from_plan(path: str) -> tuple[tuple, dict]:
    """Model options and ParallelConfig fields from a plan file.

    The backend trains decoder models: family "gpt" runs the built-in GPT, "llama"
    HuggingFace LLaMA, both built from the plan's shape. The plan's dtype is the
    simulated one; this CPU/GPU runtime trains in fp32.
    """
    from merak_exec.mesh import ExecError
    from merak_exec.parallel import check_executable
    from merak_sim.model import get_model
    from merak_sim.plan import Plan

    plan = Plan.load(path)
    check_executable(plan.parallel)
    m = plan.model
    spec = get_model(m["preset"]) if "preset" in m else get_model(m)
    kinds = {"gpt": "gpt", "llama": "llama"}
    if spec.family not in kinds:
        raise ExecError(f"plan model family {spec.family!r} is simulate-only; merak-exec "
                        "trains gpt and llama plans")
    c = plan.parallel
    fields = {"dp": c.dp, "tp": c.tp, "pp": c.pp, "micro_batch_size": c.micro_batch_size,
              "microbatches": c.num_microbatches, "virtual_stages": c.virtual_stages,
              "schedule": c.schedule, "recompute": c.recompute, "tp_overlap": c.tp_overlap,
              "tp_overlap_parts": c.tp_overlap_parts, "recompute_c0": c.recompute_c0,
              "recompute_fractions": c.recompute_fractions,
              "sequence_parallel": c.sequence_parallel, "zero": c.zero}
    shape = (kinds[spec.family], spec.layers, spec.hidden, spec.heads, spec.vocab, spec.seq_len)
    return shape, fields


@cli.command()
@_model_opts
@click.option("--mbs", default="1", show_default=True,
              help="micro-batch size(s), comma-separated: one profile each, merged")
@click.option("--seqs", default=None, help="sequence length(s), comma-separated "
              "(default: --seq)")
@click.option("--repeats", default=5, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True)
@click.option("--device", default=None, help="cpu or cuda (default: cuda if available)")
@click.option("--name", default=None, help="model name recorded in the trace")
@click.option("--threads", default=1, show_default=True,
              help="torch CPU threads (1 = what each rank of a 2-rank CPU run gets)")
@click.option("--collectives", is_flag=True,
              help="also time gloo all-reduce / all-gather / send-recv between 2 local "
                   "processes (64 KiB - 4 MiB)")
@click.option("--out", "out_path", required=True, help="merak-trace/1 JSON to write")
def profile(kind, layers, hidden, heads, vocab, seq, dropout, mbs, seqs, repeats, dtype,
            device, name, threads, collectives, out_path) -> None:
    """Measure per-layer forward/backward/recompute times and activation bytes and write
    a merak-trace/1 file (the cost model's format)."""
    import dataclasses

    import torch

    from merak_exec.profiling.layer_trace import profile_chain
    from merak_sim.trace import Trace, from_exec_profile, merge_traces, write_trace

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    torch.set_num_threads(threads)
    try:
        mbs_list = [int(x) for x in str(mbs).split(",")]
        seq_list = [int(x) for x in (seqs or str(seq)).split(",")]
    except ValueError:
        raise click.BadParameter("--mbs and --seqs take comma-separated integers") from None
    torch.manual_seed(0)
    model = _model(kind, layers, hidden, heads, vocab, max(seq_list), dropout, meta=False)
    traces = []
    meta = {"command": " ".join(["merak-exec", *sys.argv[1:]]), "git_commit": _git_commit()}
    for b in mbs_list:
        for s in seq_list:
            prof = profile_chain(model, b, s, device=device, dtype=dt, repeats=repeats,
                                 meta=meta)
            d = from_exec_profile(prof.to_dict())
            d["model"]["name"] = name or f"{kind}-h{hidden}-l{layers}"
            d["model"]["seq_len"] = max(seq_list)
            traces.append(Trace.from_dict(d, "profile"))
            for lp in prof.layers:
                click.echo(f"mbs {b} seq {s} {lp.name:9s} fwd {lp.forward_s * 1e3:8.3f} ms  "
                           f"bwd {lp.backward_s * 1e3:8.3f} ms  act "
                           f"{lp.activation_bytes / 2**20:8.2f} MiB")
    trace = merge_traces(traces)
    if collectives:
        from merak_exec.profiling.collectives import measure_collectives

        colls = measure_collectives([2**16, 2**18, 2**20, 2**22], 15)
        trace = dataclasses.replace(trace, collectives=tuple(colls))
        for c in colls:
            click.echo(f"{c.collective:15s} {c.bytes / 2**20:6.2f} MiB "
                       f"{c.seconds * 1e3:7.3f} ms")
    write_trace(trace, out_path)
    click.echo(f"wrote {out_path}")


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit 2 for bad input, 1 for a lost peer."""
    import os

    try:
        import torch  # noqa: F401  (the backend's one hard dependency, checked first)
    except ImportError:
        click.echo("merak-exec: error: torch is not installed; install the backend with "
                   "pip install 'merak[exec]'", err=True)
        sys.exit(2)
    from merak_exec.mesh import ExecError
    from merak_exec.mesh import RankTimeoutError

    code = 0
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        code = 1
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except (ExecError, ValueError) as e:
        click.echo(f"merak-exec: error: {e}", err=True)
        code = 2
    except RankTimeoutError as e:
        click.echo(f"merak-exec: error: {e}", err=True)
        code = 1
    if not code:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        dist.destroy_process_group()
    # Skip the interpreter's teardown: a failed job's groups may be wedged (a peer is
    # gone), and in a finished one gloo's background threads now and then abort
    # ("terminate called without an active exception", SIGABRT), which torchrun
    # reports as a failure after all work was done and reported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
