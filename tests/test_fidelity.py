"""Fidelity table plumbing (merak_sim.validation.fidelity, merak-sim fidelity) and the
Hopper fits' split."""

import csv
import glob
from pathlib import Path

import pytest

from merak_sim.calibrate.fit import BOUNDS
from merak_sim.calibrate.search import coordinate_search
from merak_sim.cli import main
from merak_sim.validation.fidelity import (
    FIT_MODELS,
    Outcome,
    fit_profile_of,
    fit_rows,
    is_moe_row,
    profile_of,
    public_run_outcomes,
    role_of,
    summarise,
)
from merak_sim.validation.public_runs import load_rows

ROOT = Path(__file__).resolve().parents[1]
BASE = {"task": "pretrain", "model": "Llama-toy", "n_layers": "8", "hidden_size": "1024",
        "n_heads": "16", "n_kv_heads": "4", "ffn_hidden": "2816", "vocab_size": "32000",
        "seq_len": "2048", "num_experts": "", "ep": "", "cp": "1", "dp_shard": "",
        "gpu_type": "H100 SXM 80GB (DGX-H100)", "num_gpus": "16", "dp": "1", "tp": "8",
        "pp": "2", "vp": "", "micro_batch_size": "1", "global_batch_size": "8",
        "precision": "BF16", "activation_recompute": "full", "other_flags": "",
        "framework": "torchtitan", "tokens_per_sec_per_gpu": "1000", "step_time_s": "",
        "peak_mem_gib": "20", "peak_mem_bytes": "", "source_section": "toy"}


def write_toy_rows(path, *changes: dict):
    """``path`` as a public-runs CSV of BASE and one row per dict of changes to it."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(BASE))
        w.writeheader()
        w.writerow(BASE)
        for c in changes:
            w.writerow({**BASE, **c})
    return path


def test_public_run_outcomes_predict_and_skip(tmp_path):
    p = write_toy_rows(tmp_path / "toy.csv", {"precision": "NVFP4"})
    done, skipped = public_run_outcomes(p)
    assert len(done) == 1 and len(skipped) == 1
    assert "FP4" in skipped[0].reason and skipped[0].dataset == "public-runs/toy"
    o = done[0]
    assert o.measured_s == pytest.approx(8 * 2048 / (1000 * 16))
    assert o.predicted_s > 0 and o.mem_err is not None
    assert o.groups["zero"] == "0" and o.groups["cp"] == "1" and o.role == "held out"


def test_summarise_reports_mape_bias_and_worst():
    outs = [Outcome("d", "held out", f"r{i}", {"tp": str(tp)}, 1.0, p)
            for i, (tp, p) in enumerate([(1, 1.1), (1, 0.8), (2, 1.05)])]
    st = {s.group: s for s in summarise(outs, ("tp",))}
    assert st["all"].rows == 3
    assert st["all"].mape_pct == pytest.approx(100 * (0.1 + 0.2 + 0.05) / 3)
    assert st["all"].signed_pct == pytest.approx(100 * (0.1 - 0.2 + 0.05) / 3)
    assert st["all"].worst_pct == pytest.approx(-20) and st["all"].worst_label == "r1"
    assert st["tp=1"].rows == 2 and st["tp=2"].mem_mape_pct is None


def test_fit_and_held_out_rows_are_disjoint_and_split_by_model():
    fit, held = [], []
    for path in sorted(glob.glob(str(ROOT / "data" / "public-runs" / "*.csv"))):
        ds = f"public-runs/{Path(path).stem}"
        # MoE rows have their own declared split (tests/test_moe_public_runs.py).
        for r in (r for r in load_rows(path) if not is_moe_row(r)):
            (fit if role_of(ds, r) == "fit" else held).append(
                (ds, r["model"], r["gpu_type"], r["seq_len"], r["num_gpus"], r["precision"],
                 r["source_section"]))
    assert fit and held and not set(fit) & set(held)
    assert all(g.startswith(("H100", "A100")) for _, _, g, *_ in fit)
    for profile, (ds, gpu, prefixes) in FIT_MODELS.items():
        fitted = {m for d, m, g, *_ in fit if d == ds and g.startswith(gpu)}
        assert fitted and all(m.startswith(prefixes) for m in fitted), profile
        # No held-out row of that source and GPU shares a model with the fit.
        assert not {m for d, m, g, *_ in held if d == ds and g.startswith(gpu)} & fitted
    assert {ds for ds, *_ in fit} == {ds for ds, *_ in FIT_MODELS.values()}
    rows = {f"public-runs/{Path(p).stem}": load_rows(p)
            for p in glob.glob(str(ROOT / "data" / "public-runs" / "*.csv"))}
    assert len(fit_rows(rows, "pytorch")) == 32 and len(fit_rows(rows, "megatron-te")) == 10
    assert all(profile_of(r) == "megatron-te" for r in fit_rows(rows, "megatron-te"))
    a100 = fit_rows(rows, "a100-pytorch")
    assert len(a100) == 36 and {r["model"] for r in a100} == {"MPT-1b", "MPT-7b"}
    assert all(r["gpu_type"].startswith("A100") for r in a100)
    # torchtitan's A100 rows are priced by the A100 PyTorch profile and held out.
    tt = load_rows(ROOT / "data" / "public-runs" / "torchtitan.csv")
    a100_tt = [r for r in tt if r["gpu_type"].startswith("A100")]
    assert a100_tt and all(fit_profile_of(r) == "a100-pytorch" for r in a100_tt)
    assert all(role_of("public-runs/torchtitan", r) == "held out" for r in a100_tt)
    assert fit_profile_of({"gpu_type": "A100 80GB", "framework": "NeMo 24.07"}) is None


def test_coordinate_search_stays_in_bounds_and_improves():
    bounds = {"a": (0.1, 2.0), "b": BOUNDS["gemm_max"]}
    x, best = coordinate_search(lambda p: (p["a"] - 1.3) ** 2 + (p["b"] - 0.9) ** 2,
                                {"a": 0.5, "b": 0.5}, bounds, rounds=30)
    assert x["a"] == pytest.approx(1.3, rel=0.05) and x["b"] == BOUNDS["gemm_max"][1]
    assert best < (0.5 - 1.3) ** 2


def test_fidelity_command_runs_on_a_small_subset(capsys, tmp_path):
    out = tmp_path / "f.md"
    # A subset is a sample: it is printed, never written as the table.
    assert main(["fidelity", "--data", str(ROOT / "data"), "--limit", "2", "--out",
                 str(out)]) == 2 and not out.exists()
    assert "--limit or --out" in capsys.readouterr().err
    assert main(["fidelity", "--data", str(tmp_path), "--limit", "2"]) == 2
    assert "pass --data" in capsys.readouterr().err
    assert main(["fidelity", "--data", str(ROOT / "data"), "--limit", "2"]) == 0
    text = capsys.readouterr().out
    assert "public-runs/llmfoundry (held out)" in text and "vtrain-multi" in text
    assert "not expressible" in text and "Command: `merak-sim fidelity`" in text
    # The target's own section: per held-out source, its H100 / A100 bf16 rows.
    assert "## Target: held-out H100/A100 bf16 rows, MAPE <= 10 % per source" in text
    assert "| target=H100/A100 bf16 |" in text
    assert "| public-runs/sailor (held out) | 0 | - |" in text


def test_calibrated_model_serves_the_hopper_fit_as_the_fit_prices_it():
    from merak_sim.costs.calibrated import CalibratedCostModel
    from merak_sim.costs.calibrated_hopper import (
        DEFAULT_PROFILE,
        HOPPER_PROFILES,
        hopper_calibration,
        hopper_cost_model,
    )
    from merak_sim.costs.kernels import default_kernels
    from merak_sim.sim.api import simulate
    from merak_sim.validation.public_runs import row_setup

    for gpu in ("H100-80GB", "H200-141GB", "GH200-96GB"):
        for profile, values in HOPPER_PROFILES.items():
            eff, kern = hopper_calibration(gpu, None, profile)
            assert eff.gemm_max == values["gemm_max"]
            # A parameter a profile does not fit keeps its published H100 default.
            assert kern.flash_max_bwd == values.get(
                "flash_max_bwd", default_kernels("H100-80GB").flash_max_bwd)
    assert hopper_calibration("A100-80GB", None) == (None, None)
    with pytest.raises(ValueError, match="unknown Hopper profile"):
        hopper_calibration("H100-80GB", None, "jax")
    row = load_rows(ROOT / "data" / "public-runs" / "llmfoundry.csv")[0]
    model, cluster, cfg = row_setup(row)

    def run(cm):
        return simulate(model, cluster, cfg, cost_model=cm, engine="evaluator",
                        sub_cluster=True, keep_trace=False).iteration_time_s

    served = run(CalibratedCostModel())
    assert served == pytest.approx(run(hopper_cost_model(DEFAULT_PROFILE)), rel=1e-12)
    other = next(p for p in HOPPER_PROFILES if p != DEFAULT_PROFILE)
    assert run(hopper_cost_model(other)) != pytest.approx(served, rel=1e-3)


def test_a100_pytorch_profile_prices_pytorch_a100_rows_slower_than_vtrain_fit():
    from merak_sim.costs.calibrated import CalibratedCostModel
    from merak_sim.costs.calibrated_hopper import A100_PROFILES, a100_cost_model
    from merak_sim.sim.api import simulate
    from merak_sim.validation.public_runs import row_setup

    with pytest.raises(ValueError, match="unknown A100 profile"):
        a100_cost_model("jax")
    row = next(r for r in load_rows(ROOT / "data" / "public-runs" / "llmfoundry.csv")
               if r["gpu_type"].startswith("A100") and r["model"] == "MPT-13b")
    model, cluster, cfg = row_setup(row)

    def run(cm):
        return simulate(model, cluster, cfg, cost_model=cm, engine="evaluator",
                        sub_cluster=True, keep_trace=False).iteration_time_s

    fitted = run(a100_cost_model("a100-pytorch", A100_PROFILES["a100-pytorch"]))
    assert fitted == pytest.approx(run(a100_cost_model()), rel=1e-12)
    assert fitted > run(CalibratedCostModel())  # eager PyTorch is slower than Megatron
    done, _ = public_run_outcomes(ROOT / "data" / "public-runs" / "llmfoundry.csv")
    o = next(o for o in done if o.label.startswith("MPT-13b A100"))
    assert o.role == "held out" and o.groups["stack"] == "pytorch"
