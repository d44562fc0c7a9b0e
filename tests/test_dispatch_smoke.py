"""A dispatched plan trains for real: plan -> launch.sh -> torchrun, 2 CPU processes."""

import os
import re
import sys
from pathlib import Path

from merak_sim.config import ParallelConfig
from merak_sim.dispatch import write_launch
from merak_sim.plan import Plan
from support.launches import run_with_fresh_port


def test_dispatched_plan_trains_on_two_cpu_processes(tmp_path):
    plan = Plan(
        model={"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32,
               "vocab": 128},
        cluster={"preset": "local-cpu"},
        parallel=ParallelConfig(pp=2, micro_batch_size=2, global_batch_size=8,
                                schedule="shifted-critical-path", recompute="stage-aware",
                                dtype="fp32"),
    )
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo",
               MERAK_TIMEOUT_S="60",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])

    def launch_sh(port: int) -> list[str]:  # torchrun binds --master-port itself
        return ["bash", str(write_launch(plan, "torchrun", nodes=1, gpus_per_node=2,
                                         out_dir=tmp_path, master_port=port).launcher)]
    proc = run_with_fresh_port(launch_sh, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"first loss ([\d.]+), final loss ([\d.]+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    first, final = float(m.group(1)), float(m.group(2))
    assert final < first  # ten steps of AdamW on a fixed synthetic set: it learns
