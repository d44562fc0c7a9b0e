"""``merak-exec`` / ``python -m merak_exec``: train or profile on real ranks.

Launch under torchrun (``torchrun --nproc-per-node 4 -m merak_exec train --pp 2 --tp 2``)
or srun; a plain ``python -m merak_exec`` is a world of one. Bad input (degrees that
do not match the world, heads not divisible by tp, a missing or corrupt checkpoint, a
lost peer) ends every rank with one line ``merak-exec: error: ...`` and exit status 2
(1 for a lost peer), no traceback.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path

import click

from merak_sim.cli.options import stacked
from merak_sim.cli.vocab import config_from_options, config_options, refuse_plan_clash

__all__ = ["main", "run", "cli"]

_POS = click.IntRange(min=1)
#: merak-exec train's configuration defaults: one process, 1F1B, fp32, no recompute.
_EXEC_DEFAULTS = dict(dp=1, tp=1, pp=1, cp=1, virtual_stages=1, order="tp-cp-dp-pp",
                      schedule="1f1b", recompute="none", zero=0, zero_group=0,
                      tp_overlap="none", tp_overlap_parts=2, dtype="fp32",
                      micro_batch_size=1)


class _Finite(click.FloatRange):
    """A FloatRange that also refuses nan and infinities (nan passes click's bounds)."""

    def convert(self, value, param, ctx):
        """The number, or a usage error naming it when it is not finite."""
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


def _learning_rate(ctx, param, value: float) -> float:
    """--lr within TrainingArguments' range (at most LEARNING_RATE_MAX)."""
    from merak_exec.inputs import LEARNING_RATE_MAX

    if value > LEARNING_RATE_MAX:
        raise click.BadParameter(f"{value:g} is above {LEARNING_RATE_MAX:g}: AdamW moves each "
                                 "weight by about the learning rate per step, so training "
                                 "diverges; use e.g. 1e-3")
    return value


def _check_writable(path: str | None, flag: str, folder: bool = False) -> None:
    """Fail now, not after the work, when ``path`` cannot be written: the one output
    checker both command lines use (:func:`merak_sim.io.check_output_path`: no device,
    FIFO, socket or directory is replaced, nothing is left behind)."""
    from merak_sim.io import OutputPathError, check_output_path

    if path is None:
        return
    try:
        check_output_path(path, folder=folder)
    except OutputPathError as e:
        raise click.UsageError(f"{flag} {e}") from None


def _aliases(**old_names):
    """Merge hidden old spellings into the new options: ``new=(old parameter, new flag,
    old flag)``; an old spelling kept for one release, refused together with the new."""
    def deco(f):
        @functools.wraps(f)
        def wrapper(**kw):
            ctx = click.get_current_context()
            for new, (old, new_flag, old_flag) in old_names.items():
                v = kw.pop(old)
                if v is None:
                    continue
                if ctx.get_parameter_source(new) == click.core.ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"{old_flag} is the old spelling of {new_flag}: "
                                           "give one of them")
                kw[new] = v
            return f(**kw)
        return wrapper
    return deco


_MODEL_OPTS = [
    click.option("--model", "kind", type=click.Choice(["gpt", "gpt2", "llama"]), default="gpt",
                 show_default=True, help="built-in GPT or a HuggingFace model from a config"),
    click.option("--layers", type=_POS, default=4, show_default=True,
                 help="transformer blocks"),
    click.option("--hidden", type=_POS, default=64, show_default=True, help="hidden size"),
    click.option("--heads", type=_POS, default=4, show_default=True, help="attention heads"),
    click.option("--vocab", type=_POS, default=256, show_default=True,
                 help="vocabulary size (every token id of --data must be below it)"),
    click.option("--seq", type=_POS, default=32, show_default=True,
                 help="sequence length (--data is packed into sequences of this length)"),
    click.option("--dropout", type=_Finite(0.0, 1.0, max_open=True), default=0.0,
                 show_default=True),
]


def _load_config(ctx, param, path: str | None):
    """--config FILE: a TOML table of this command's options (names as the flags, with
    '-' or '_'); the values become the defaults, so flags given beside it win."""
    if path is None:
        return None
    import tomllib

    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror}", param=param) from None
    except tomllib.TOMLDecodeError as e:
        raise click.BadParameter(f"{path} is not TOML: {e}", param=param) from None
    names = {p.name: p for p in ctx.command.params if p.name != "config"}
    flags = {o.lstrip("-").replace("-", "_"): p.name for p in ctx.command.params
             for o in p.opts}
    out = {}
    for key, value in table.items():
        name = flags.get(key.replace("-", "_"))
        if name is None or names[name].hidden:
            known = sorted(o.lstrip("-") for p in names.values() if not p.hidden for o in p.opts
                           if o.startswith("--"))
            raise click.BadParameter(f"{path}: unknown key {key!r}; keys are the flags of "
                                     f"this command: {', '.join(known)}", param=param)
        out[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **out}
    return path


_model_opts = stacked(*_MODEL_OPTS)


#: train's run options: batch, steps, learning rate and seed.
_RUN_OPTS = stacked(
    click.option("--microbatches", type=_POS, default=None,
                 help="micro-batches per iteration per pipeline (M)  [default: 4]"),
    click.option("--steps", type=_POS, default=10, show_default=True,
                 help="training iterations (optimizer steps)"),
    click.option("--lr", type=_Finite(min=0.0, min_open=True), default=1e-3, show_default=True,
                 callback=_learning_rate,
                 help="peak AdamW learning rate (at most 1), followed by --lr-schedule"),
    click.option("--lr-schedule", type=click.Choice(["linear", "cosine", "constant",
                                                     "constant_with_warmup"]),
                 default="linear", show_default=True,
                 help="decay from the peak to 0 over --steps after --warmup-steps"),
    click.option("--warmup-steps", type=click.IntRange(min=0), default=0, show_default=True),
    click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                 help="seeds the model's initialisation and the data order"),
)
#: train's data options: what to train on and what to hold out.
_DATA_OPTS = stacked(
    click.option("--data", "data_path", default=None,
                 help="train on this data: a token file (uint16/uint32 ids end to end), a "
                      "HuggingFace datasets folder (save_to_disk) or a .jsonl of {\"text\"} "
                      "with --tokenizer  [default: synthetic tokens]"),
    click.option("--tokenizer", default=None, help="a local HuggingFace tokenizer folder for "
                                                   "text data (nothing is downloaded)"),
    click.option("--data-dtype", type=click.Choice(["auto", "uint16", "uint32", "int32", "int64"]),
                 default="auto", show_default=True,
                 help="token width of a token file (auto: uint16 when --vocab fits)"),
    click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
                 help="evaluate loss and perplexity on the held-out data every N steps and at "
                      "the end (0: never)"),
    click.option("--eval-fraction", type=_Finite(0.0, 0.5, min_open=True), default=0.01,
                 show_default=True, help="share of --data's sequences held out for evaluation"),
)
#: train's outputs, inputs from earlier runs and build options.
_OUTPUT_OPTS = stacked(
    click.option("--save-dir", default=None,
                 help="write checkpoints here (checkpoint-<step>), at least one at the end"),
    click.option("--save-every", type=click.IntRange(min=0), default=0, show_default=True,
                 help="checkpoint every N steps too (needs --save-dir)"),
    click.option("--resume", default=None, help="checkpoint to resume from (any degrees)"),
    click.option("--export-hf", "export_dir", default=None,
                 help="at the end, write the model in HuggingFace's layout to this new folder"),
    click.option("--config", "config_file", default=None, is_eager=True, expose_value=False,
                 callback=_load_config,
                 help="a TOML file of these options (keys as the flags); flags given win"),
    click.option("--chrome-trace", "trace_path", default=None,
                 help="write the last step's Chrome trace here (rank 0)"),
    click.option("--trace", "trace_alias", default=None, hidden=True),
    click.option("--split-points", default=None,
                 help="comma-separated layer indices where stages begin (chain layers: "
                      "0 = embedding, 1..L = blocks, L+1 = head)"),
    click.option("--meta/--no-meta", default=True, show_default=True,
                 help="build the model on the meta device; materialise only local layers"),
    click.option("--plan", "plan_path", default=None,
                 help="a merak-plan/1 file (from `merak-sim plan`/`dispatch`): its model and "
                      "parallel configuration replace the model, degree and batch options"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="merak", prog_name="merak-exec")
def cli() -> None:
    """Run Merak's 3D-parallel training for real (torch.distributed)."""


@cli.command()
@_model_opts
@config_options("degrees", "schedule", "memory", "overlap", "precision", "batch",
                defaults=_EXEC_DEFAULTS, skip=("attention", "overlap_param_gather"))
@_RUN_OPTS
@_DATA_OPTS
@_OUTPUT_OPTS
@_aliases(trace_path=("trace_alias", "--chrome-trace", "--trace"))
def train(kind, layers, hidden, heads, vocab, seq, dropout, microbatches, steps, lr,
          lr_schedule, warmup_steps, seed, data_path, tokenizer, data_dtype, eval_every,
          eval_fraction, save_dir, save_every, resume, export_dir, trace_path, split_points,
          meta, plan_path, **degrees) -> None:
    """Train a model with dp x tp x pp on --data (synthetic tokens without it); prints
    ``parameters: N`` first. With --plan, every field the simulator priced (model
    shape, dtype, degrees, schedule, recompute, TP overlap) is what runs."""
    from merak_exec.builders import build_model, model_from_spec, parameter_count
    from merak_exec.mesh import ExecError, check_launch_env

    check_launch_env()  # MERAK_TIMEOUT_S, RANK < WORLD_SIZE, MASTER_ADDR: before any work
    _check_outputs(trace_path, save_dir, save_every, export_dir, resume)
    points = _split_points(split_points)
    flags = dict(kind=kind, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq,
                 dropout=dropout)
    if plan_path is not None:
        refuse_plan_clash(click.get_current_context())
    degrees["global_batch_size"] = degrees["micro_batch_size"] * degrees["dp"] * _microbatches(
        microbatches, degrees["global_batch_size"], degrees["dp"], degrees["micro_batch_size"])
    spec, config, schedule = _checked_run(plan_path, flags, degrees)
    if spec is not None:
        seq, vocab = spec.seq_len, spec.vocab
    train_ds, eval_ds = _datasets(data_path, tokenizer, data_dtype, seq, vocab,
                                  eval_fraction if eval_every else 0.0, seed,
                                  config.global_batch_size)
    import torch

    import merak_exec

    torch.manual_seed(seed)
    model = (model_from_spec(spec, dropout, meta) if spec is not None else
             build_model(kind, layers, hidden, heads, vocab, seq, dropout, meta))
    n_params = parameter_count(model)
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        click.echo(f"parameters: {n_params}")
    if spec is not None and n_params != spec.total_params():
        raise ExecError(f"the built model has {n_params} parameters but the plan's model "
                        f"has {spec.total_params()}; merak-exec cannot build it as planned")
    args = merak_exec.TrainingArguments(
        output_dir=save_dir or "merak_out", per_device_train_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=config.num_microbatches, max_steps=steps,
        learning_rate=lr, lr_scheduler_type=lr_schedule, warmup_steps=warmup_steps,
        seed=seed, save_steps=(save_every or steps) if save_dir else 0,
        eval_strategy="steps" if eval_every else "no", eval_steps=eval_every or None,
        resume_from_checkpoint=resume, trace_path=trace_path, split_points=points)
    trainer = merak_exec.Trainer(model=model, args=args, train_dataset=train_ds,
                                 eval_dataset=eval_ds, config=config, schedule=schedule)
    res = trainer.train()
    if export_dir is not None:
        trainer.save_model(export_dir)
    if torch.distributed.get_rank() == 0 and res.step_times_s:
        click.echo(f"median step {res.iteration_time_s * 1e3:.2f} ms, first loss "
                   f"{res.losses[0]:.5f}, final loss {res.losses[-1]:.5f}")


def _check_outputs(trace_path, save_dir, save_every, export_dir, resume) -> None:
    """Every output and the resume path checked before any work."""
    _check_writable(trace_path, "--chrome-trace")
    _check_writable(save_dir, "--save-dir", folder=True)
    if save_every and save_dir is None:
        raise click.UsageError("--save-every needs --save-dir (where the checkpoints go)")
    if export_dir is not None:
        if Path(export_dir).exists():
            raise click.BadParameter(f"{export_dir} exists; give a new folder",
                                     param_hint="--export-hf")
        _check_writable(export_dir, "--export-hf", folder=True)
    if resume is not None and not Path(resume).exists():
        raise click.BadParameter(f"{resume} does not exist", param_hint="--resume")


def _split_points(text: str | None) -> list[int] | None:
    try:
        return [int(x) for x in text.split(",")] if text else None
    except ValueError:
        raise click.BadParameter("comma-separated integers, got " + repr(text),
                                 param_hint="--split-points") from None


def _microbatches(microbatches: int | None, global_batch: int | None, dp: int,
                  mbs: int) -> int:
    """M from --microbatches or --global-batch-size (one batch vocabulary with
    merak-sim); both must agree when given together."""
    if global_batch is None:
        return microbatches or 4
    if global_batch % (dp * mbs):
        raise click.BadParameter(f"{global_batch} is not divisible by dp x micro-batch size "
                                 f"= {dp} x {mbs}", param_hint="--global-batch-size")
    M = global_batch // (dp * mbs)
    if microbatches is not None and microbatches != M:
        raise click.UsageError(f"--microbatches {microbatches} and --global-batch-size "
                               f"{global_batch} disagree (dp x micro-batch size x M = "
                               f"{dp * mbs * microbatches}); give one of them")
    return M


def _datasets(data_path, tokenizer, data_dtype, seq: int, vocab: int, eval_fraction: float,
              seed: int, global_batch: int):
    """(train, eval) datasets: ``data_path`` packed into ``seq`` windows with a held-out
    tail when evaluating, else synthetic tokens (and a synthetic held-out set)."""
    import torch

    if data_path is None:
        g = torch.Generator().manual_seed(seed)
        n = max(64, global_batch * 4)
        toks = torch.randint(0, vocab, (n + (global_batch if eval_fraction else 0), seq),
                             generator=g)
        ds = [{"input_ids": t} for t in toks]  # labels = input_ids (the loss shifts them)
        return ds[:n], (ds[n:] or None)
    from merak_exec.data import load_data

    splits = load_data(data_path, seq, vocab, tokenizer=tokenizer, dtype=data_dtype,
                       eval_fraction=eval_fraction)
    if splits.eval is not None and len(splits.eval) < global_batch:
        need = math.ceil(global_batch / eval_fraction)
        raise click.UsageError(f"--eval-fraction {eval_fraction} of {data_path} holds out "
                               f"{len(splits.eval)} sequences, fewer than one global batch "
                               f"({global_batch}); raise it, or give at least {need} "
                               "sequences")
    return splits.train, splits.eval


@cli.command()
@click.argument("checkpoint")
@click.option("--hf", "out", required=True,
              help="the new folder to write (AutoModelForCausalLM.from_pretrained loads it)")
def export(checkpoint, out) -> None:
    """Write the model of CHECKPOINT (saved at any degrees) in HuggingFace's layout; the
    built-in GPT becomes a GPT2LMHeadModel."""
    from merak_exec.export import export_hf

    _check_writable(out, "--hf", folder=True)
    click.echo(f"wrote {export_hf(checkpoint, out)}")


def _checked_run(plan_path: str | None, flags: dict, degrees: dict):
    """(the plan's model spec or None, the ParallelConfig, its schedule) of a train
    command, after every check that needs no rank: the configuration and its schedule,
    the model's shape against tp, and its memory and CPU time against this machine
    (:func:`merak_exec.builders.check_resources`)."""
    from merak_exec.builders import check_resources, check_shape, spec_from_flags
    from merak_exec.parallel import check_run

    spec = None
    if plan_path is not None:
        from merak_sim.plan import Plan
        from merak_sim.resolve import resolve_model

        plan = Plan.load(plan_path)
        spec, config = resolve_model(plan.model), plan.parallel
    else:
        config = config_from_options(degrees)
    # the one check of what runs, before starting ranks; the runtime takes its schedule
    schedule = check_run(config, spec, "plan" if spec else "configuration")
    shape = spec or spec_from_flags(**flags)
    check_shape(shape.family, shape.hidden, shape.heads, shape.kv_heads, shape.ffn_hidden,
                shape.vocab, config.tp)
    check_resources(config, _rank_device(), spec=shape)
    return spec, config, schedule


def _rank_device() -> str:
    """The device this rank will train on (as merak_exec.mesh picks it), before
    torch.distributed starts."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{os.environ.get('LOCAL_RANK', os.environ.get('SLURM_LOCALID', '0'))}"


@cli.command()
@_model_opts
@click.option("--micro-batch-size", "mbs", default="1", show_default=True,
              help="micro-batch size(s), comma-separated: one profile each, merged")
@click.option("--mbs", "mbs_alias", default=None, hidden=True)
@click.option("--seqs", default=None, help="sequence length(s), comma-separated "
              "(default: --seq)")
@click.option("--repeats", type=_POS, default=5, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True)
@click.option("--device", default=None, help="cpu or cuda (default: cuda if available)")
@click.option("--name", default=None, help="model name recorded in the trace")
@click.option("--threads", type=_POS, default=1, show_default=True,
              help="torch CPU threads (1 = what each rank of a 2-rank CPU run gets)")
@click.option("--collectives", is_flag=True,
              help="also time gloo all-reduce / all-gather / send-recv between 2 local "
                   "processes (64 KiB - 4 MiB)")
@click.option("--out", "out_path", required=True, help="merak-trace/1 JSON to write")
@_aliases(mbs=("mbs_alias", "--micro-batch-size", "--mbs"))
def profile(kind, layers, hidden, heads, vocab, seq, dropout, mbs, seqs, repeats, dtype,
            device, name, threads, collectives, out_path) -> None:
    """Measure per-layer forward/backward/recompute times and activation bytes and write
    a merak-trace/1 file (the cost model's format)."""
    import dataclasses

    import torch

    from merak_exec.builders import build_model
    from merak_exec.profiling.layer_trace import profile_chain
    from merak_sim.trace import Trace, from_exec_profile, merge_traces, write_trace

    _check_writable(out_path, "--out")
    mbs_list = _positive_ints(mbs, "--micro-batch-size")
    seq_list = _positive_ints(seqs or str(seq), "--seqs")
    device = _device(device)
    _check_profile_size(kind, layers, hidden, heads, vocab, max(seq_list), max(mbs_list),
                        dtype, device, repeats * len(seq_list) * len(mbs_list))
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(kind, layers, hidden, heads, vocab, max(seq_list), dropout, meta=False)
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


def _check_profile_size(kind: str, layers: int, hidden: int, heads: int, vocab: int,
                        seq: int, mbs: int, dtype: str, device: str, repeats: int) -> None:
    """The profiled model's shape, memory and CPU time checked as train checks them
    (a micro-batch of the largest size on one device, ``repeats`` times), before
    anything is built."""
    from merak_exec.builders import check_resources, spec_from_flags
    from merak_sim.config import ParallelConfig

    spec = spec_from_flags(kind, layers, hidden, heads, vocab, seq, 0.0)
    check_resources(ParallelConfig(micro_batch_size=mbs, global_batch_size=mbs, dtype=dtype),
                    device, spec=spec, repeats=repeats)


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in str(text).split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise click.BadParameter(f"comma-separated positive integers, got {text!r}",
                                 param_hint=flag)
    return out


def _device(device: str | None) -> str:
    """``device`` checked against this torch build (default: cuda if available)."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        d = torch.device(device)
    except RuntimeError:
        d = None
    if d is None or d.type not in ("cpu", "cuda"):
        raise click.BadParameter(f"{device!r}: choose cpu, cuda or cuda:N", param_hint="--device")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise click.BadParameter(f"{device}: this torch ({torch.__version__}) sees no CUDA "
                                     "device; use --device cpu", param_hint="--device")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise click.BadParameter(f"{device}: only {torch.cuda.device_count()} CUDA "
                                     "device(s)", param_hint="--device")
    return device


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
    code = run(argv)
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


def run(argv: list[str] | None = None) -> int:
    """Run one merak-exec command line in this process; returns its exit status with
    every error printed as one line (what :func:`main` calls before it exits)."""
    from merak_exec.mesh import ExecError, RankTimeoutError

    code = 0
    try:
        rv = cli.main(args=argv, prog_name="merak-exec", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0  # --help / --version
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        code = 2
    except click.exceptions.Abort:
        code = 1
    except click.ClickException as e:
        click.echo(f"merak-exec: error: {e.format_message()}", err=True)
        code = e.exit_code if e.exit_code else 2
    except (ExecError, ValueError, OSError) as e:
        click.echo(f"merak-exec: error: {e}", err=True)
        code = 2
    except RankTimeoutError as e:
        click.echo(f"merak-exec: error: {e}", err=True)
        code = 1
    except RuntimeError as e:  # a collective torch raised outside merak's own waits
        from merak_exec.mesh import is_comm_failure

        if not is_comm_failure(e):
            raise
        click.echo(f"merak-exec: error: merak_exec: a peer was lost: "
                   f"{str(e).splitlines()[0][:200]}", err=True)
        code = 1
    return code


if __name__ == "__main__":
    main()
