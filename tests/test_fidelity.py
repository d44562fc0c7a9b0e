"""Fidelity table plumbing (merak_sim.experiments.fidelity)."""

import csv

import pytest

from merak_sim.experiments.fidelity import (
    Outcome,
    public_run_outcomes,
    public_run_setup,
    skip_reason,
    summarise,
)

BASE = {"task": "pretrain", "model": "Llama-toy", "n_layers": "8", "hidden_size": "1024",
        "n_heads": "16", "n_kv_heads": "4", "ffn_hidden": "2816", "vocab_size": "32000",
        "seq_len": "2048", "num_experts": "", "ep": "", "cp": "1", "dp_shard": "",
        "gpu_type": "H100 SXM 80GB (DGX-H100)", "num_gpus": "16", "dp": "1", "tp": "8",
        "pp": "2", "vp": "", "micro_batch_size": "1", "global_batch_size": "8",
        "precision": "BF16", "activation_recompute": "full", "other_flags": "",
        "tokens_per_sec_per_gpu": "1000", "step_time_s": "", "peak_mem_gib": "20",
        "peak_mem_bytes": "", "source_section": "toy"}


@pytest.mark.parametrize("change,needle", [
    ({"precision": "FP8"}, "FP8"),
    ({"num_experts": "8"}, "MoE"),
    ({"cp": "2"}, "context parallelism"),
    ({"dp_shard": "8"}, "FSDP"),
    ({"gpu_type": "GB200 NVL72"}, "no multi-GPU cluster preset"),
    ({"task": "sft"}, "fine-tuning"),
    ({"precision": ""}, "not stated"),
    ({"vocab_size": ""}, "vocab_size not stated"),
    ({"dp": "2"}, "GPU count"),
])
def test_skip_reasons_name_the_missing_feature(change, needle):
    assert needle in skip_reason({**BASE, **change})


def test_expressible_row_is_set_up_and_predicted(tmp_path):
    assert skip_reason(BASE) is None
    model, cluster, cfg = public_run_setup(BASE)
    assert (model.kv_heads, model.ffn_hidden, model.dtype) == (4, 2816, "bf16")
    assert cluster.name == "dgx-h100" and cluster.world_size == 16
    assert (cfg.tp, cfg.pp, cfg.dp, cfg.recompute) == (8, 2, 1, "full")
    p = tmp_path / "toy.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(BASE))
        w.writeheader()
        w.writerow(BASE)
        w.writerow({**BASE, "precision": "FP8"})
    done, skipped = public_run_outcomes(p)
    assert len(done) == 1 and len(skipped) == 1
    assert "FP8" in skipped[0].reason and skipped[0].dataset == "public-runs/toy"
    o = done[0]
    assert o.measured_s == pytest.approx(8 * 2048 / (1000 * 16))
    assert o.predicted_s > 0 and o.mem_err is not None


def test_summarise_reports_mape_bias_and_worst():
    outs = [Outcome("d", "held out", f"r{i}", {"tp": str(tp)}, 1.0, p)
            for i, (tp, p) in enumerate([(1, 1.1), (1, 0.8), (2, 1.05)])]
    st = {s.group: s for s in summarise(outs, ("tp",))}
    assert st["all"].rows == 3
    assert st["all"].mape_pct == pytest.approx(100 * (0.1 + 0.2 + 0.05) / 3)
    assert st["all"].signed_pct == pytest.approx(100 * (0.1 - 0.2 + 0.05) / 3)
    assert st["all"].worst_pct == pytest.approx(-20) and st["all"].worst_label == "r1"
    assert st["tp=1"].rows == 2 and st["tp=2"].mem_mape_pct is None
