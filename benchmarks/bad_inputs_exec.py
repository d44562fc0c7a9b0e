"""Bad or unusual inputs to ``merak-exec``, its Python API and ``merak-sim dispatch``,
as a new user would try them: what each does, and whether it is one line.

A command-line case passes when it succeeds cleanly (no traceback, no NaN loss) or
ends with exit status 2 and exactly one stderr line (``merak-exec: error: ...``); a
case marked as a lost peer may end with status 1, also in one line; ``--help`` and
friends print help. A Python API case passes when it raises ExecError (or a subclass;
TypeError where Python's own contract says so, e.g. an unknown keyword) with a
one-line message, or trains without a non-finite loss. None may hang (60 s).

Run ``python benchmarks/bad_inputs_exec.py [--out docs/bad_inputs_exec.md]`` (two or
three minutes): the merak-exec and API cases are forked from two driver processes
that imported torch and the backend once (each case then runs the console entry
point ``merak_exec.__main__.main`` with its arguments, or its API snippet, in a fresh
child); the merak-sim cases are plain subprocesses. Exits 1 if any case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LIMIT_S = 60
TINY = {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 128}
PLANS = {
    "p.json": (TINY, {"preset": "local-cpu"}, {"pp": 2, "micro_batch_size": 1,
                                               "global_batch_size": 4}),
    "tp2.json": (TINY, {"preset": "local-cpu"}, {"tp": 2, "global_batch_size": 4}),
    "zero1.json": (TINY, {"preset": "local-cpu"}, {"dp": 2, "global_batch_size": 4,
                                                   "zero": 1}),
    "bert.json": ({"preset": "bert-large"}, {"preset": "local-cpu"}, {"pp": 2,
                                                                      "global_batch_size": 4}),
    "gqa-gpt.json": ({**TINY, "kv_heads": 2}, {"preset": "local-cpu"},
                     {"global_batch_size": 4}),
    "llama70b.json": ({"preset": "llama2-70b"}, {"preset": "dgx-a100-80g", "nodes": 8},
                      {"dp": 1, "tp": 8, "pp": 8, "global_batch_size": 64}),
    "16x4.json": (TINY, {"preset": "paper-3090", "nodes": 16},
                  {"dp": 4, "tp": 4, "pp": 4, "global_batch_size": 64}),
    "multi.json": (TINY, {"preset": "paper-3090", "nodes": 2},
                   {"dp": 2, "tp": 4, "global_batch_size": 4}),
    "one.json": (TINY, {"preset": "local-cpu"}, {"global_batch_size": 2}),
    "big.json": ({**TINY, "hidden": 65536, "heads": 64, "vocab": 65536},
                 {"preset": "local-cpu"}, {"global_batch_size": 2}),
    "npos.json": ({**TINY, "max_positions": 8}, {"preset": "local-cpu"},
                  {"global_batch_size": 2}),
}
HELP = [[], ["--version"], ["-h"], ["train", "-h"]]
EXEC = [
    ["nope"], ["train", "--unknown-flag"],
    ["train", "--steps", "0"], ["train", "--steps", "-3"], ["train", "--steps", "abc"],
    ["train", "--mbs", "0"], ["train", "--micro-batch-size", "0"],
    ["train", "--mbs", "2", "--micro-batch-size", "3"], ["train", "--microbatches", "0"],
    ["train", "--dp", "0"], ["train", "--pp", "2"], ["train", "--layers", "0"],
    ["train", "--heads", "3"], ["train", "--dropout", "1.0"], ["train", "--dropout", "-0.1"],
    ["train", "--lr", "0"], ["train", "--lr", "-1"], ["train", "--schedule", "nope"],
    ["train", "--recompute", "nope"], ["train", "--recompute", "selective"],
    ["train", "--tp-overlap", "sideways"], ["train", "--virtual-stages", "2"],
    ["train", "--trace", "/proc/nope/t.json"], ["train", "--chrome-trace", "/tmp"],
    ["train", "--save-dir", "/proc/nope"], ["train", "--resume", "/nonexistent/ckpt"],
    ["train", "--split-points", "a,b"], ["train", "--save-every", "-1"],
    ["train", "--save-every", "2"], ["train", "--microbatches", "2", "--global-batch-size", "8"],
    ["train", "--data", "missing.bin"], ["train", "--config", "missing.toml"],
    ["train", "--ep", "2", "--dp", "2"], ["train", "--dtype", "fp8"],
    ["export", "missing-checkpoint", "--hf", "out-hf"],
    ["train", "--plan", "missing.json"], ["train", "--plan", "notjson.json"],
    ["train", "--plan", "oldformat.json"], ["train", "--plan", "zero1.json"],
    ["train", "--plan", "bert.json"], ["train", "--plan", "gqa-gpt.json"],
    ["train", "--plan", "llama70b.json"], ["train", "--plan", "p.json"],
    ["profile"], ["profile", "--out", "/proc/nope/x.json"],
    ["profile", "--device", "cuda", "--out", "x.json"],
    ["profile", "--device", "tpu", "--out", "x.json"],
    ["profile", "--mbs", "0,2", "--out", "x.json"],
    ["profile", "--seqs", "x", "--out", "x.json"],
    ["profile", "--repeats", "0", "--out", "x.json"],
    ["profile", "--threads", "0", "--out", "x.json"],
    ["profile", "--dtype", "fp8", "--out", "x.json"],
]
T1 = ["--steps", "1"]  # a case that may legitimately train: one step
EXEC_NEW = [
    ["train", "--model", "llama", "--hidden", "30", "--heads", "4"],
    ["train", "--model", "llama", "--hidden", "12", "--heads", "4"],
    ["train", "--model", "llama", "--hidden", "65", "--heads", "5"],
    ["train", "--model", "gpt2", "--hidden", "30", "--heads", "4"],
    ["train", "--hidden", "100000", "--vocab", "100000"], ["train", "--layers", "100000"],
    ["train", "--vocab", "100000000"], ["train", "--seq", "100000"],
    ["train", "--microbatches", "100000"], ["train", "--seq", "1", *T1],
    ["train", "--lr", "1e308"], ["train", "--lr", "inf"], ["train", "--lr", "nan"],
    ["train", "--lr", "1e6", "--dtype", "fp16"], ["train", "--lr", "2"],
    ["train", "--dropout", "nan"], ["train", "--dropout", "inf"],
    ["train", "--chrome-trace", "/dev/full"], ["train", "--chrome-trace", "fifo"],
    ["train", "--chrome-trace", "link-to-dir"], ["train", "--chrome-trace", "file.txt/t.json"],
    ["train", "--save-dir", "/dev/null"], ["train", "--save-dir", "file.txt"],
    ["profile", "--out", "/dev/full"], ["profile", "--out", "fifo"],
    ["train", "--tp", "3"], ["train", "--tp", "2", "--vocab", "255"],
    ["train", "--model", "llama", "--heads", "4", "--tp", "8"],
    ["train", "--virtual-stages", "0"], ["train", "--split-points", "0,100"],
    ["train", "--split-points", "5,3"], ["train", "--order", "dp-tp"],
    ["train", "--zero", "3", "--pp", "2"], ["train", "--zero", "4"],
    ["train", "--sequence-parallel"], ["train", "--tp-overlap", "sub-pipelined"],
    ["train", "--recompute", "stage-aware:abc"], ["train", "--schedule", "zb-h1"],
    ["train", "--resume", "empty-dir"], ["train", "--resume", "file.txt"],
    ["train", "--dtype", "fp8"], ["train", "--heads", "0"], ["train", "--hidden", "-64"],
    ["train", "--plan", "big.json"], ["train", "--plan", "npos.json", *T1],
    ["train", "--plan", "one.json", *T1], ["train", "--vocab", "1", *T1],
    ["train", "--hidden", "4", "--heads", "4", *T1], ["train", "--dtype", "bf16", *T1],
    ["train", "--model", "gpt2", "--dropout", "0.5", *T1],
    ["train", "--model", "llama", "--hidden", "32", "--heads", "4", *T1],
    ["train", "--save-dir", "ckpt", "--save-every", "1", "--steps", "2"],
    ["profile", "--seqs", "100000", "--out", "x.json"],
    ["profile", "--repeats", "100000", "--out", "x.json"],
    ["profile", "--model", "llama", "--hidden", "12", "--heads", "4", "--out", "x.json"],
    ["profile", "--hidden", "30", "--heads", "4", "--out", "x.json"],
    ["profile", "--seqs", "0", "--out", "x.json"], ["profile", "--mbs", "-1", "--out", "x.json"],
]
#: (environment, arguments, a lost peer: exit status 1 allowed)
ENV_CASES = [
    ({"MERAK_TIMEOUT_S": "inf"}, T1, False), ({"MERAK_TIMEOUT_S": "0"}, T1, False),
    ({"MERAK_TIMEOUT_S": "-1"}, T1, False), ({"MERAK_TIMEOUT_S": "abc"}, T1, False),
    ({"MERAK_TIMEOUT_S": "nan"}, T1, False), ({"MERAK_TIMEOUT_S": "1e300"}, T1, False),
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     T1, False),
    ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     T1, False),
    ({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     T1, False),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     T1, False),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid",
      "MASTER_PORT": "29555"}, T1, False),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     T1, False),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"},
     T1, False),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29556",
      "MERAK_TIMEOUT_S": "5"}, T1, True),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29557",
      "MERAK_TIMEOUT_S": "5"}, ["--dp", "2", *T1], True),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
      "SLURM_JOB_NODELIST": "localhost"}, T1, False),
]
#: Python API snippets, run in a fresh child with the names of :func:`_api_namespace`:
#: ``TA`` (TrainingArguments), ``fit(model=..., args=..., data=..., **Trainer kw)``
#: (trains; the defaults are a tiny GPT, 8 samples of 16 ids < 64, 2 steps), ``tiny``,
#: ``gpt2``, ``llama`` (models), ``ds(n, seq)`` (samples), ``merak_exec``, ``torch``.
API = [
    "TA(warmup_ratio=2)", "TA(warmup_ratio=-0.5)", "TA(save_total_limit=-1)",
    "TA(weight_decay=-1)", "TA(max_grad_norm=-1)", "TA(learning_rate=float('inf'))",
    "TA(learning_rate=float('nan'))", "TA(learning_rate=0)", "TA(learning_rate=-1e-3)",
    "TA(learning_rate=1e308)", "TA(seq_len=0)", "TA(seq_len=-1)",
    "TA(per_device_train_batch_size=0)", "TA(gradient_accumulation_steps=0)",
    "TA(max_steps=0)", "TA(num_train_epochs=0)", "TA(num_train_epochs=float('inf'))",
    "TA(adam_beta1=1.5)", "TA(adam_beta2=1.0)", "TA(adam_epsilon=-1)",
    "TA(lr_scheduler_type='wsd')", "TA(warmup_steps=-3)", "TA(logging_steps=-1)",
    "TA(save_steps=-10)", "TA(pad_token_id=-1)", "TA(bf16='yes')", "TA(output_dir='')",
    "TA(split_points=[1, 'x'])", "TA(deepspeed='ds.json')",
    "fit(args=TA(report_to='wandb'))", "fit(args=TA(eval_strategy='epoch'))",
    "fit(args=TA(dataloader_num_workers=2))", "fit(args=TA(bf16=True, fp16=True))",
    "fit(args={'learning_rate': 1e-3})", "a = TA(); a.save_total_limit = -1; fit(args=a)",
    "a = TA(); a.learning_rate = float('inf'); fit(args=a)",
    "fit(model=None)", "fit(model='gpt2')", "fit(data=(x for x in ds()))",
    "fit(data=iter(ds()))", "fit(data=[])", "fit(data=ds(2))",
    "fit(eval_dataset=(x for x in ds()))",
    "fit(data=[{'ids': [1, 2, 3]}] * 8)", "fit(data=['some text'] * 8)",
    "fit(data=[{'input_ids': torch.zeros(1, 16, dtype=torch.long)}] * 8)",
    "fit(data=[{'input_ids': torch.zeros(16)}] * 8)", "fit(data=[{'input_ids': []}] * 8)",
    "fit(data=[{'input_ids': [5, -1, 3]}] * 8)", "fit(data=[{'input_ids': [[1], [2, 3]]}] * 8)",
    "fit(data=[{'input_ids': [100] * 16}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'labels': [70] * 16}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'labels': [-5] * 16}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'labels': [1] * 15}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'labels': [-100] * 16}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'attention_mask': [2] * 16}] * 8)",
    "fit(data=[{'input_ids': [1] * 16, 'attention_mask': [0] * 4 + [1] * 12}] * 8)",
    "fit(data=ds(), args=TA(max_steps=1, seq_len=8))",
    "fit(data=ds(8, 32))", "fit(data=ds(8, 1))",
    "fit(args=TA(max_steps=1, save_steps=1, output_dir='file.txt/run'))",
    "fit(args=TA(max_steps=1, trace_path='/dev/full'))",
    "fit(args=TA(max_steps=1, trace_path='fifo'))",
    "fit(args=TA(max_steps=1, trace_path='empty-dir'))",
    "fit(args=TA(max_steps=1, resume_from_checkpoint=True, output_dir='empty-dir'))",
    "fit(args=TA(max_steps=1, resume_from_checkpoint='/nonexistent'))",
    "fit(args=TA(max_steps=1, resume_from_checkpoint='file.txt'))",
    "merak_exec.init(dp=2)", "merak_exec.init(tp=3)", "merak_exec.init(schedule='nope')",
    "fit(config=merak_exec.ParallelConfig(pp=2, global_batch_size=4))",
    "fit(model=gpt2(n_embd=65536, n_head=64, vocab_size=65536, meta=True))",
    "fit(model=llama(hidden_size=12, num_attention_heads=4))",
    "fit(optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=1e30), "
    "args=TA(max_steps=3, max_grad_norm=None))",
    "fit(optimizer_fn=lambda ps: None)", "fit(args=TA(max_steps=1, split_points=[0, 100]))",
    "fit()", "fit(model=gpt2(), data=ds(8, 16))",
    "fit(data=[{'input_ids': [1] * 12, 'attention_mask': [1] * 10 + [0] * 2}] * 8)",
    "fit(args=TA(max_steps=2, save_steps=1, save_total_limit=0, output_dir='ckpt'))",
]
DISPATCH = [
    ["missing.json"], ["notjson.json"], ["oldformat.json"], ["p.json", "--nodes", "0"],
    ["p.json", "--gpus-per-node", "-1"], ["p.json", "--nodes", "3", "--gpus-per-node", "1"],
    ["tp2.json", "--nodes", "2", "--gpus-per-node", "1"], ["zero1.json"],
    ["zero1.json", "--force"], ["bert.json"], ["16x4.json", "--nodes", "8",
                                               "--gpus-per-node", "8"],
    ["16x4.json", "--nodes", "8", "--gpus-per-node", "8", "--force"], ["16x4.json"],
    ["p.json", "--launcher", "pbs"], ["p.json", "--launcher", "slurm", "--time", "soon"],
    ["p.json", "--time", "10"], ["p.json", "--launcher", "slurm", "--partition", "a b"],
    ["p.json", "--launcher", "slurm", "--output", " "], ["p.json", "--out", "/proc/nope"],
    ["p.json", "--out", "p.json"], ["p.json", "--launcher", "slurm", "--time", "1-00:00:00",
                                    "--partition", "gpu", "--output", "m-%j.out"],
    ["p.json", "--out", "/dev/null"], ["p.json", "--out", "fifo"],
]
SHELL = [
    ("launch.sh (2 nodes), no MASTER_ADDR", {}),
    ("launch.sh (2 nodes), MASTER_ADDR=h, no NODE_RANK", {"MASTER_ADDR": "h"}),
    ("launch.sh (2 nodes), NODE_RANK=9", {"MASTER_ADDR": "h", "NODE_RANK": "9"}),
    ("launch.sh (2 nodes), NODE_RANK=x", {"MASTER_ADDR": "h", "NODE_RANK": "x"}),
]
PLAN = [
    ["--model", "gpt-1.5b", "--cluster", "paper-3090", "--global-batch-size", "64",
     "--space", "deepspeed", "--executable", "--out", "pe.json"],
    ["--model", "bert-large", "--cluster", "paper-3090", "--global-batch-size", "64",
     "--executable", "--out", "pe.json"],
]


def _fixtures(d: Path) -> None:
    """The files the cases name, in the case's own folder: plans, a bad plan, a FIFO, a
    regular file, an empty folder and a link to it."""
    d.mkdir(parents=True)
    for name, (model, cluster, par) in PLANS.items():
        (d / name).write_text(json.dumps({"format": "merak-plan/1", "model": model,
                                          "cluster": cluster, "parallel": par}))
    (d / "notjson.json").write_text("{nope")
    (d / "oldformat.json").write_text(json.dumps({"format": "merak-plan/0"}))
    (d / "file.txt").write_text("not a folder\n")
    os.mkfifo(d / "fifo")
    (d / "empty-dir").mkdir()
    (d / "link-to-dir").symlink_to("empty-dir")


# -- the driver: one process imports torch once, forks a child per case ---------------
def _api_namespace() -> dict:
    """The names the API snippets use (module docstring of :data:`API`)."""
    import torch
    import transformers

    import merak_exec
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.trainer import Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    ns: dict = {"torch": torch, "merak_exec": merak_exec, "TA": TrainingArguments}
    default = object()

    def tiny():
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))

    def gpt2(meta: bool = False, **cfg):
        c = {"vocab_size": 64, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2,
             **cfg}
        with torch.device("meta" if meta else "cpu"):
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(**c))

    def llama(**cfg):
        c = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 16,
             **cfg}
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**c))

    def ds(n: int = 8, seq: int = 16) -> list:
        g = torch.Generator().manual_seed(0)
        return [{"input_ids": torch.randint(0, 64, (seq,), generator=g)} for _ in range(n)]

    def fit(model=default, args=None, data=None, **kw):
        args = TrainingArguments(max_steps=2, logging_steps=0, output_dir="out") \
            if args is None else args
        res = Trainer(model=tiny() if model is default else model, args=args,
                      train_dataset=ds() if data is None else data, **kw).train()
        ns["_losses"] = list(res.losses)
        return res.losses

    ns.update(tiny=tiny, gpt2=gpt2, llama=llama, ds=ds, fit=fit)
    return ns


def _api_child(code: str) -> int:
    """Run one API snippet; the exit status says how it ended (0 trained or returned,
    2 a typed one-line refusal, 3 a non-finite loss, 1 anything else)."""
    import math
    import traceback

    from merak_exec.mesh import ExecError

    ns = _api_namespace()
    try:
        exec(compile(code, "<case>", "exec"), ns)
    except (ExecError, TypeError) as e:
        typed = isinstance(e, ExecError) or "unexpected keyword argument" in str(e)
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        if not typed:
            traceback.print_exc()
        return 2 if typed else 1
    except Exception:  # noqa: BLE001 - a case may fail in any way; report it whole
        traceback.print_exc()
        return 1
    losses = ns.get("_losses")
    if losses and not all(math.isfinite(x) for x in losses):
        print(f"trained to a non-finite loss without a word: losses {losses}", file=sys.stderr)
        return 3
    print(f"trained: losses {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "returned")
    return 0


def _child(case: dict, out: str, err: str) -> None:
    """In the forked child: the case's folder, environment and output files, then the
    case; exits with its status."""
    code = 1
    try:
        os.chdir(case["cwd"])
        os.environ.update(case.get("env", {}))
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        if case["kind"] == "api":
            code = _api_child(case["code"])
        else:
            sys.argv = ["merak-exec", *case["argv"]]
            from merak_exec.__main__ import main

            main(case["argv"])  # ends the process itself (os._exit) on an error
            code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report anything, as an interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, limit_s: float) -> int | str:
    """The child's exit status, or "hang" (then it is killed) after ``limit_s``."""
    import signal

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hang"


def _drive(job_path: str) -> None:
    """The driver process: import once, fork per case, record the exit statuses."""
    import torch  # noqa: F401  (what every case would import, imported once here)
    import transformers  # noqa: F401

    import merak_exec.__main__  # noqa: F401
    import merak_exec.builders  # noqa: F401
    import merak_exec.trainer  # noqa: F401

    job = json.loads(Path(job_path).read_text())
    codes = []
    for case in job["cases"]:
        out, err = (os.path.join(case["cwd"], f".case.{s}") for s in ("out", "err"))
        pid = os.fork()
        if pid == 0:
            _child(case, out, err)
        codes.append(_wait(pid, LIMIT_S))
    Path(job_path).with_suffix(".codes").write_text(json.dumps(codes))


# -- cases, judging, the table ----------------------------------------------------------
def cases() -> list[dict]:
    """Every case: kind "exec" (argv after merak-exec), "api" (a snippet) or "sim"
    (argv after python -m merak_sim, or a shell script), with its label."""
    out = [{"kind": "exec", "argv": a, "help": True} for a in HELP]
    out += [{"kind": "exec", "argv": a} for a in EXEC + EXEC_NEW]
    out += [{"kind": "exec", "argv": ["train", *a], "env": env, "lost": lost}
            for env, a, lost in ENV_CASES]
    for c in out:
        env = " ".join(f"{k}={v}" for k, v in c.get("env", {}).items())
        c["label"] = f"{env} merak-exec {' '.join(c['argv'])}".strip()
    out += [{"kind": "api", "code": code, "label": code} for code in API]
    out += [{"kind": "sim", "argv": ["dispatch", *a, *([] if "--out" in a else ["--out", "o"])],
             "label": "merak-sim dispatch " + " ".join(a)} for a in DISPATCH]
    out += [{"kind": "sim", "argv": ["plan", *a], "label": "merak-sim plan " + " ".join(a)}
            for a in PLAN]
    out += [{"kind": "shell", "env": env, "label": label} for label, env in SHELL]
    return out


NAN = re.compile(r"loss (nan|-?inf)\b")


def judge(case: dict, code, out: str, err: str) -> str:
    """"ok", or "FAIL: why" (module docstring)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == "hang":
        return f"FAIL: hangs ({LIMIT_S} s)"
    if "Traceback" in out + err:
        return "FAIL: traceback"
    if case.get("help"):
        return "ok" if code in (0, 2) else f"FAIL: exit {code}"
    if code == 0:
        return "FAIL: trained to NaN silently" if NAN.search(out + err) else "ok"
    if code == 2 or (code == 1 and case.get("lost")):
        return "ok" if len(lines) == 1 else f"FAIL: {len(lines)} lines"
    return "FAIL: trained to NaN silently" if code == 3 else f"FAIL: exit {code}"


def _run_drivers(jobs: list[list[dict]], scratch: Path, env: dict) -> list:
    """Run each list of exec/api cases in a driver process, side by side; returns
    (case, code, out, err) for every case."""
    def one(i: int, batch: list[dict]):
        job = scratch / f"job{i}.json"
        job.write_text(json.dumps({"cases": batch}))
        subprocess.run([sys.executable, __file__, "--driver", str(job)], env=env,
                       timeout=LIMIT_S * (len(batch) + 1), check=True)
        codes = json.loads(job.with_suffix(".codes").read_text())
        return [(c, code, *(Path(c["cwd"], f".case.{s}").read_text(errors="replace")
                            for s in ("out", "err"))) for c, code in zip(batch, codes)]

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return [r for rs in pool.map(one, range(len(jobs)), jobs) for r in rs]


def _run_sim(case: dict, env: dict, shared: Path) -> tuple:
    """A merak-sim or launch.sh case as a plain subprocess."""
    if case["kind"] == "shell":
        base = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
        cmd, cwd, env = ["bash", "m/launch.sh"], shared, {**base, **case["env"]}
    else:
        cmd, cwd = [sys.executable, "-m", "merak_sim", *case["argv"]], case["cwd"]
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return case, "hang", "", ""
    return case, r.returncode, r.stdout, r.stderr


def run_all(scratch: Path, workers: int = 2) -> list[tuple]:
    """Every case of :func:`cases`, in its own folder of fixtures: (case, exit status,
    stdout, stderr), in the order of :func:`cases`."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONPATH=str(root),
               MERAK_TIMEOUT_S="10", CUDA_VISIBLE_DEVICES="")
    all_cases = cases()
    for i, c in enumerate(all_cases):
        c["cwd"] = str(scratch / f"case{i:03d}")
        _fixtures(Path(c["cwd"]))
    shared = scratch / "shared"
    _fixtures(shared)
    subprocess.run([sys.executable, "-m", "merak_sim", "dispatch", "multi.json", "--out", "m"],
                   cwd=shared, env=env, capture_output=True, timeout=LIMIT_S)
    forked = [c for c in all_cases if c["kind"] in ("exec", "api")]
    done = _run_drivers([forked[i::workers] for i in range(workers)], scratch, env)
    done += [_run_sim(c, env, shared) for c in all_cases if c["kind"] in ("sim", "shell")]
    order = {id(c): i for i, c in enumerate(all_cases)}
    return sorted(done, key=lambda r: order[id(r[0])])


def table(results: list[tuple], seconds: float) -> tuple[str, list]:
    """The markdown report and the failed rows."""
    rows, failed = [], []
    for i, (case, code, out, err) in enumerate(results, 1):
        verdict = judge(case, code, out, err)
        text = err.strip() or out.strip()
        first = text.splitlines()[0] if text else "(nothing)"
        n = len([ln for ln in err.splitlines() if ln.strip()])
        rows.append(f"| {i} | `{case['label']}` | {code} | {n} | "
                    f"{first.replace('|', chr(92) + '|')[:200]} | {verdict} |")
        if verdict != "ok":
            failed.append((i, case["label"], verdict))
    kinds = {k: sum(1 for r in results if r[0]["kind"] == k) for k in ("exec", "api")}
    head = ["# Bad or unusual inputs: merak-exec, its Python API and merak-sim dispatch", "",
            "Written by `python benchmarks/bad_inputs_exec.py --out docs/bad_inputs_exec.md` "
            f"in {seconds:.0f} s (files named here are made by the script in each case's "
            "scratch folder: plans, `fifo`, `file.txt`, `empty-dir`, `link-to-dir`). "
            f"{len(results)} inputs ({kinds['exec']} merak-exec command lines, {kinds['api']} "
            f"Python API snippets, {len(results) - sum(kinds.values())} merak-sim / launch.sh); "
            f"{len(results) - len(failed)} pass, {len(failed)} fail. A command line passes with "
            "exit 2 and one stderr line (1 for a lost peer) or a clean success; an API "
            "snippet passes with ExecError (TypeError for an unknown keyword) in one line or "
            "a finite loss; none may hang.", "",
            "| # | input | exit | stderr lines | first line printed | verdict |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n", failed


def main() -> int:
    """Run every case, print (and with --out write) the table; 1 if any failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="markdown table to write")
    ap.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        _drive(args.driver)
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="merak-bad-inputs-") as tmp:
        text, failed = table(run_all(Path(tmp)), time.monotonic() - t0)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    for i, label, verdict in failed:
        print(f"#{i} {label}: {verdict}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
