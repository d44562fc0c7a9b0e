"""Analytic cost model (local-cpu defaults) against the shipped CPU trace.

Prints, per layer kind and shape of traces/cpu-gpt-tiny.json, the measured forward and
backward times next to the analytic model's, and their ratio; and the activation bytes
the memory model (cpu-eager profile) predicts against the measured ones:

    .venv/bin/python benchmarks/compare_cpu_trace.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.hardware import get_cluster
from merak_sim.trace import read_trace


def main() -> int:
    trace = read_trace(ROOT / "traces" / "cpu-gpt-tiny.json")
    cluster = get_cluster("local-cpu")
    cm = AnalyticCostModel()
    print(f"trace: {trace.provenance.device}, {trace.provenance.date}")
    print(f"{'kind':9s} {'mbs':>3s} {'seq':>4s} {'fwd meas':>9s} {'fwd ana':>8s} {'ratio':>6s}"
          f" {'bwd meas':>9s} {'bwd ana':>8s} {'ratio':>6s} {'act meas':>10s} {'act pred':>10s}")
    key = {"block": "layer", "embedding": "embedding", "head": "head"}
    ratios = []
    for r in sorted(trace.layers, key=lambda r: (r.kind, r.seq_len, r.micro_batch_size)):
        m = trace.model.with_(seq_len=r.seq_len)
        cfg = ParallelConfig(micro_batch_size=r.micro_batch_size,
                             global_batch_size=r.micro_batch_size, dtype="fp32")
        row = cm.layer_breakdown(m, cluster, cfg)[key[r.kind]]
        bwd = row["backward_input_s"] + row["backward_weight_s"]
        rf, rb = row["forward_s"] / r.forward_s, bwd / r.backward_s
        if r.kind != "embedding":
            ratios += [rf, rb]
        print(f"{r.kind:9s} {r.micro_batch_size:3d} {r.seq_len:4d} {r.forward_s * 1e3:9.3f} "
              f"{row['forward_s'] * 1e3:8.3f} {rf:6.2f} {r.backward_s * 1e3:9.3f} "
              f"{bwd * 1e3:8.3f} {rb:6.2f} {r.activation_bytes:10.0f} "
              f"{row['activation_bytes']:10.0f}")
    ratios.sort()
    print(f"block/head analytic/measured time ratio: median {ratios[len(ratios) // 2]:.2f}, "
          f"range {ratios[0]:.2f}-{ratios[-1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
