"""Bad or unusual inputs to ``merak-exec`` and ``merak-sim dispatch``, as a new user
would try them: exit code and first line printed, none may hang or print a traceback.

Run ``python benchmarks/bad_inputs_exec.py [--out docs/bad_inputs_exec.md]`` (a few
minutes: every merak-exec case starts torch). Exits 1 if any case hangs (60 s) or
prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
}

EXEC = [
    [], ["--version"], ["-h"], ["nope"], ["train", "--unknown-flag"],
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


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[int | str, str, bool]:
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "hang", "", False
    text = (r.stderr.strip() or r.stdout.strip())
    out = r.stdout + r.stderr
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else (
        r.stdout.strip().splitlines()[0] if r.stdout.strip() else "")
    return r.returncode, first if text else "(nothing)", "Traceback" in out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="markdown table to write")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=str(root), MERAK_TIMEOUT_S="30")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for name, (model, cluster, par) in PLANS.items():
            (cwd / name).write_text(json.dumps({"format": "merak-plan/1", "model": model,
                                                "cluster": cluster, "parallel": par}))
        (cwd / "notjson.json").write_text("{nope")
        (cwd / "oldformat.json").write_text(json.dumps({"format": "merak-plan/0"}))
        py = sys.executable
        for a in EXEC:
            rows.append(("merak-exec " + " ".join(a), *_run([py, "-m", "merak_exec", *a],
                                                             cwd, env)))
        for a in DISPATCH:
            rows.append(("merak-sim dispatch " + " ".join(a),
                         *_run([py, "-m", "merak_sim", "dispatch", *a, *(
                             [] if "--out" in a else ["--out", "o"])], cwd, env)))
        for a in PLAN:
            rows.append(("merak-sim plan " + " ".join(a),
                         *_run([py, "-m", "merak_sim", "plan", *a], cwd, env)))
        subprocess.run([py, "-m", "merak_sim", "dispatch", "multi.json", "--out", "m"],
                       cwd=cwd, env=env, capture_output=True, timeout=60)
        base = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
        for label, extra in SHELL:
            rows.append((label, *_run(["bash", "m/launch.sh"], cwd, {**base, **extra})))
    bad = [r for r in rows if r[1] == "hang" or r[3]]
    lines = ["# Bad or unusual inputs: merak-exec and merak-sim dispatch", "",
             "Written by `python benchmarks/bad_inputs_exec.py --out docs/bad_inputs_exec.md`"
             " (files named here are written by the script into a scratch folder). "
             f"{len(rows)} inputs; {len(bad)} hang or print a traceback.", "",
             "| # | input | exit | first line printed |", "|---|---|---|---|"]
    for i, (cmd, code, first, tb) in enumerate(rows, 1):
        cell = first.replace("|", "\\|")[:160] + (" (traceback)" if tb else "")
        lines.append(f"| {i} | `{cmd}` | {code} | {cell} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
