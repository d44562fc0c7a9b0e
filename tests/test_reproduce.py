"""Paper reproduction recipe and ``merak-sim reproduce merak`` on a subset (fast)."""

from __future__ import annotations

import json

import pytest

from merak_sim.cli import main
from merak_sim.reproduce.merak import (
    FREE_ORDER,
    PAPER_SPEEDUPS,
    explain,
    hand_configs,
    reproduce_merak,
)
from merak_sim.reproduce.regimes import explain_regimes, regime_map, t3_margin, with_memory
from merak_sim.sim import simulate


@pytest.fixture(scope="module")
def rep():
    return reproduce_merak(("gpt-1.5b",), global_batch_size=64, top_k=1)


def test_systems_run_in_their_own_spaces(rep):
    m = rep.models[0]
    assert m.paper == PAPER_SPEEDUPS["gpt-1.5b"]
    meg, ds, mer = (m.runs[s].config for s in ("megatron", "deepspeed", "merak"))
    assert meg.schedule == ds.schedule == "1f1b"
    assert meg.recompute == ds.recompute == "full"
    assert meg.zero == 0 and meg.tp_overlap == "none"
    assert ds.zero == (1 if ds.dp > 1 else 0)
    assert mer.schedule == "shifted-critical-path" and mer.recompute == "stage-aware"
    # The ablation baseline is the better of the two baselines, and each step searches a
    # superset-like space of techniques: times are those of real SimPy runs.
    assert m.runs["baseline"].time_s == min(m.runs["megatron"].time_s,
                                            m.runs["deepspeed"].time_s)
    for s, run in m.runs.items():
        again = simulate("gpt-1.5b", "paper-3090", run.config, keep_trace=False)
        assert again.iteration_time_s == pytest.approx(run.time_s), s
        assert again.fits_in_memory


def test_tables_speedups_and_explanation(rep):
    t = rep.table()
    row = t.iloc[0]
    assert row.speedup_vs_megatron == pytest.approx(row.megatron_time_s / row.merak_time_s)
    assert row.speedup_up_to == max(row.speedup_vs_megatron, row.speedup_vs_deepspeed)
    assert row.paper_speedup == 1.42
    ab = rep.ablation_table()
    assert list(ab.step) == ["baseline", "+T1", "+T2", "merak"]
    assert ab.speedup.iloc[0] == 1.0
    text = explain(rep.models[0])
    assert "T1 shifted critical path" in text and "stage" in text
    assert any("ASSUMPTION" in a for a in rep.assumptions)
    assert any("global batch 64" in a for a in rep.assumptions)


def test_planner_beats_hand_written_configs(rep):
    m = rep.models[0]
    for system, cfgs in hand_configs("gpt-1.5b", 64).items():
        assert cfgs
        for cfg in cfgs:
            res = simulate("gpt-1.5b", "paper-3090", cfg, keep_trace=False)
            if res.fits_in_memory:
                assert m.runs[system].time_s <= res.iteration_time_s * (1 + 1e-9), (
                    system, cfg)


def test_cli_reproduce(tmp_path, capsys):
    rc = main(["reproduce", "merak", "--models", "gpt-1.5b", "--global-batch-size", "64",
               "--top", "1", "--out", str(tmp_path), "--json", "--memory-levels", "24,1"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    row = obj["speedups"][0]
    assert row["model"] == "gpt-1.5b"
    assert row["speedup_vs_free_baselines"] == pytest.approx(
        min(row["megatron_free_time_s"], row["deepspeed_free_time_s"]) / row["merak_time_s"])
    regs = {r["memory_gb"]: r for r in obj["regimes"]}
    assert set(regs) == {24, 1}
    assert regs[24]["t1"] >= 1 - 1e-9 and regs[24]["t3"] is not None
    # A level below any feasible plan is a row marked "no plan fits" with the shortfall.
    assert regs[1]["t1"] is None and regs[1]["no_fit"].startswith("no plan fits: short ")
    assert obj["regime_notes"] and obj["t3_cpu"]["ratio_sub_over_plain"] > 0
    assert (tmp_path / "regimes.png").read_bytes()[:4] == b"\x89PNG"
    png = tmp_path / "merak_speedups.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "speedups.csv").exists()
    rc = main(["reproduce", "merak", "--models", "gpt-1.5b", "--global-batch-size", "64",
               "--top", "1", "--out", str(tmp_path), "--no-regimes"])
    out = capsys.readouterr().out
    assert rc == 0 and "paper" in out and "Ablation" in out and "ASSUMPTION" in out
    assert "free to choose" in out and "Regime map" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    rc = main(["reproduce", "merak", "--models", "gpt-99b", "--out", str(tmp_path)])
    assert rc == 2
    assert capsys.readouterr().err.startswith("merak-sim: error: unknown paper model")


@pytest.mark.parametrize("args, msg", [
    (["--global-batch-size", "0"], "--global-batch-size must be a positive integer"),
    (["--global-batch-size", "-8"], "--global-batch-size must be a positive integer"),
    (["--models", "gpt-1.5b,nope"], "unknown paper model 'nope'"),
    (["--memory-levels", "24,x"], "--memory-levels must be numbers"),
])
def test_cli_bad_input_one_line_before_any_search(tmp_path, capsys, args, msg):
    import time

    t0 = time.perf_counter()
    rc = main(["reproduce", "merak", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "o").exists()


def test_free_baselines_choose_their_own_recompute(rep):
    m = rep.models[0]
    for s in FREE_ORDER:
        cfg = m.runs[s].config
        assert cfg.schedule == "1f1b" and cfg.recompute in ("none", "selective", "full")
    # The free spaces contain the paper-like ones: never slower beyond SimPy's re-ranking.
    assert m.runs["megatron-free"].time_s <= m.runs["megatron"].time_s * 1.01
    assert m.speedup_vs_free_baselines == pytest.approx(
        min(m.runs[s].time_s for s in FREE_ORDER) / m.runs["merak"].time_s)
    assert "speedup_vs_free_baselines" in rep.table().columns


def test_regime_ladder_steps_never_lose_and_t3_margin():
    regs = regime_map(("gpt-1.5b",), global_batch_size=64, levels=(24, 8))
    for r in regs:
        for step in ("+T1", "+T2", "+T3"):
            assert r.factor(step) >= 1 - 1e-9, (r.memory_gb, step)
    roomy, tight = regs
    assert roomy.free_recompute == "none" and roomy.total == pytest.approx(1.0)
    assert tight.free_recompute != "none" and tight.total > 1.0
    assert roomy.t3 is None  # 25 heads: tp 2 or 4 cannot split GPT-1.5B
    assert explain_regimes(regs)
    best = regime_map(("gpt-2.5b",), global_batch_size=64, levels=(24,))[0].times["+T3"]
    m = t3_margin("gpt-2.5b", with_memory("paper-3090", 24), 64, best)
    assert m is not None and "sub-TP" in m.config and m.loss >= -1e-9
    assert m.hidden_s > 0 and m.split_s > 0 and m.decides
