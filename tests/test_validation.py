"""Validation loop: run directories, pricing from a stage profile, the
measured-timeline conventions, memory and parameter predictions, the CLI.

A synthetic "measurement" made from a simulation, with the runtime's habit of starting
an action before waiting for its receive, must validate with zero error: that checks
every convention of the measured side against the simulator's own. The end-to-end
test (2 gloo processes) lives in tests/test_validation_e2e.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from merak_sim.cli import main as cli_main
from merak_sim.config import ParallelConfig
from merak_sim.sim.from_config import recompute_fractions, schedule_for
from merak_sim.validation.compare import compare_run
from merak_sim.validation.measured import cpu_shares, measured_breakdown
from merak_sim.validation.memory import gpt_param_bytes
from merak_sim.validation.pricing import cost_table_from_profile, effective_config, simulate_run
from merak_sim.validation.rundir import MeasuredRun, RunDirError, read_run, write_run
from merak_sim.validation.suite import summarize

MODEL = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 4, "n_head": 4,
         "dropout": 0.0}


def _stage(s: int, pp: int, c: float = 0.0, heavy: int = 2) -> dict:
    last = s == pp - 1
    return {"forward_s": 0.010 + 0.002 * s, "forward_plain_s": 0.011,
            "backward_ckpt_s": 0.030 + 0.01 * c, "backward_s": 0.020 + 0.003 * s,
            "forward_nograd_s": 0.007, "reforward_s": 0.012, "backward_input_s": 0.009,
            "backward_weight_s": 0.011, "bare_forward_nograd_s": 0.006,
            "all_reduce_s": 0.002, "optimizer_s": 0.003,
            "recompute_layers": int(round(c * heavy)), "heavy_layers": heavy,
            "recompute_fraction": round(c * heavy) / heavy, "activation_bytes": 1000.0,
            "checkpoint_bytes": 200.0, "kept_bytes": 1000.0, "input_bytes": 50.0,
            "p2p_bytes": 0 if last else 4096, "param_bytes": 4000.0,
            "optimizer_bytes": 8000.0}


def _profile(pp: int, c: float = 0.0) -> dict:
    return {"format": "merak-stage-profile/1",
            "stages": [_stage(s, pp, c if s < pp - 1 else 0.0) for s in range(pp)],
            "machine": {"p2p_alpha_s": 1e-4, "p2p_s_per_byte": 1e-9}}


def _cfg(**kw) -> dict:
    d = dict(pp=2, micro_batch_size=1, global_batch_size=4, schedule="1f1b", dtype="fp32")
    d.update(kw)
    return ParallelConfig(**d).to_dict()


def _as_measured(sim) -> list[dict]:
    """The simulated timeline written the way the runtime records it: a compute action
    that consumes a receive starts when the previous action on its rank ends and
    includes the wait."""
    ev = sim.events()
    rows = ev.to_dict(orient="records")
    for rank in ev["rank"].unique():
        comp = sorted((r for r in rows if r["rank"] == rank and r["stream"] != "p2p"),
                      key=lambda r: r["start_s"])
        prev = 0.0
        for r in comp:
            consumes = r["kind"] in ("FORWARD", "FORWARD_NOGRAD") and r["stage"] > 0 or \
                r["kind"] in ("BACKWARD", "BACKWARD_INPUT") and r["stage"] < sim.config.pp - 1
            if consumes:
                r["start_s"] = prev
            prev = r["end_s"]
    return rows


def _synthetic_dir(tmp_path, config: dict, profile: dict, name="run"):
    stub = MeasuredRun(path=tmp_path / name, config=config, model=MODEL, seq_len=16,
                       events=[], wall_s=[0.1], losses=[], memory=[], profile=profile)
    sim = simulate_run(stub)
    rows = []
    for step in (0, 1):
        rows += [dict(r, step=step) for r in _as_measured(sim)]
    cfg = sim.config
    params = gpt_param_bytes(MODEL, cfg.pp, cfg.tp)
    state = sim.trace.prog.state_bytes
    memory = [{"rank": s, "pp_rank": s,
               "activation_peak_bytes": sim.peak_memory_bytes[s] - state[s],
               "param_bytes": params[s], "grad_bytes": params[s], "optimizer_bytes": 0}
              for s in range(cfg.pp)]
    write_run(tmp_path / name, {"config": config, "model": MODEL, "seq_len": 16,
                                "wall_s": [sim.iteration_time_s] * 2, "losses": [1.0, 0.9],
                                "memory": memory}, rows, profile)
    return tmp_path / name, sim


@pytest.mark.parametrize("schedule,recompute", [("1f1b", "none"), ("gpipe", "full"),
                                                ("zb-h1", "none"),
                                                ("shifted-critical-path", "stage-aware")])
def test_simulated_measurement_validates_with_zero_error(tmp_path, schedule, recompute):
    d, sim = _synthetic_dir(tmp_path, _cfg(schedule=schedule, recompute=recompute),
                            _profile(2, 1.0 if recompute != "none" else 0.0))
    rep = compare_run(d)
    assert rep.measured_iteration_s == pytest.approx(sim.iteration_time_s, rel=1e-9)
    assert abs(rep.iteration_error) < 1e-9
    kinds = set(rep.actions["kind"])
    assert {"FORWARD", "BACKWARD", "OPTIMIZER"} <= kinds or {"FORWARD", "BACKWARD_WEIGHT"} <= kinds
    assert rep.actions["error"].abs().max() < 1e-9
    for r in rep.ranks.itertuples():
        assert r.measured_compute_s == pytest.approx(r.predicted_compute_s, rel=1e-9)
        assert r.measured_comm_s == pytest.approx(r.predicted_comm_s, abs=1e-9)
        assert r.measured_bubble_s == pytest.approx(r.predicted_bubble_s, abs=1e-9)
    assert rep.memory["activation_error"].abs().max() < 1e-9
    assert rep.memory["param_error"].abs().max() == 0
    s = summarize([rep])
    assert s["iteration_worst_abs_error"] < 1e-9 and s["iteration_worst_run"] == rep.name


def test_exposed_comm_is_nonzero_when_transfers_are_slow(tmp_path):
    prof = _profile(2)
    prof["machine"] = {"p2p_alpha_s": 5e-3, "p2p_s_per_byte": 0.0}
    d, sim = _synthetic_dir(tmp_path, _cfg(), prof)
    T, rows = measured_breakdown(read_run(d), 0)
    assert T == pytest.approx(sim.iteration_time_s)
    assert sum(r["exposed_comm_s"] for r in rows) > 5e-3
    assert sum(r["exposed_comm_s"] for r in rows) == pytest.approx(
        sum(r.exposed_comm_s for r in sim.ranks), rel=1e-9)


def test_mispredicted_action_shows_in_the_table(tmp_path):
    d, _ = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    slow = replace(run, profile={**run.profile, "stages": [
        dict(run.profile["stages"][0], forward_s=0.02), run.profile["stages"][1]]})
    rep = compare_run(slow)
    f0 = rep.actions[(rep.actions["stage"] == 0) & (rep.actions["kind"] == "FORWARD")]
    assert (f0["error"] > 0.5).all()  # predicted 20 ms where 10 ms were "measured"
    b1 = rep.actions[(rep.actions["stage"] == 1) & (rep.actions["kind"] == "BACKWARD")]
    assert b1["error"].abs().max() < 1e-9
    assert rep.iteration_error > 0


def test_cost_table_is_the_profile():
    prof = _profile(2, 1.0)
    cfg = ParallelConfig(**_cfg(recompute="full"))
    t = cost_table_from_profile(prof, cfg)
    s0, s1 = t.stages
    p0 = prof["stages"][0]
    assert s0.forward_s == p0["forward_s"] and s0.backward_s == p0["backward_s"]
    assert s0.recompute_s == pytest.approx(p0["backward_ckpt_s"] - p0["backward_s"])
    assert s0.send_activation_s == pytest.approx(1e-4 + 4096e-9)
    assert s1.send_activation_s == 0.0
    assert s0.kept_bytes(1.0) == p0["checkpoint_bytes"]
    with pytest.raises(ValueError, match="virtual"):
        cost_table_from_profile(prof, ParallelConfig(**_cfg(virtual_stages=2, pp=2,
                                                            schedule="interleaved-1f1b")))


def test_effective_fractions_follow_whole_layers():
    prof = _profile(2, 0.75)  # 0.75 of 2 layers: the runtime checkpoints 2, i.e. 1.0
    run = MeasuredRun(path=None, config=_cfg(recompute="stage-aware"), model=MODEL,
                      seq_len=16, events=[], wall_s=[], losses=[], memory=[], profile=prof)
    cfg = effective_config(run)
    assert recompute_fractions(cfg, schedule_for(cfg)) == (1.0, 0.0)
    bad = replace(run, profile={**prof, "stages": prof["stages"][:1]})
    with pytest.raises(ValueError, match="stages"):
        effective_config(bad)


def test_gpt_param_bytes_matches_the_real_model():
    import torch

    from merak_exec.capture import to_chain
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.stages import uniform_split

    torch.manual_seed(0)
    model = GPT(GPTConfig(**MODEL))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert gpt_param_bytes(MODEL, 1, 1) == [total]
    chain, _ = to_chain(model, seq_len=16)
    ranges = uniform_split(chain, 2)
    per = [sum(p.numel() * 4 for i in r for p in chain.layers[i].parameters()) for r in ranges]
    # the head's weight is the tied embedding: on another rank it is a private copy
    assert gpt_param_bytes(MODEL, 2, 1) == per


def test_gpt_param_bytes_follow_the_runtime_split_when_layers_do_not_divide():
    import torch

    from merak_exec.capture import to_chain
    from merak_exec.models import GPT, GPTConfig
    from merak_exec.stages import uniform_split

    model = dict(MODEL, n_embd=16, n_layer=6)
    # 6 blocks on 4 stages: the remainder goes to the middle stages (1, 2, 2, 1 blocks)
    assert gpt_param_bytes(model, 4, 1) == [18240, 26240, 26240, 17344]
    torch.manual_seed(0)
    chain, _ = to_chain(GPT(GPTConfig(**model)), seq_len=16)
    ranges = uniform_split(chain, 4)
    per = [sum(p.numel() * 4 for i in r for p in chain.layers[i].parameters()) for r in ranges]
    assert gpt_param_bytes(model, 4, 1) == per


def test_run_result_saves_and_loads_a_run_directory(tmp_path):
    from merak_exec.result import RunResult

    ev = [{"rank": r, "stage": r, "chunk": 0, "stream": "compute", "kind": "FORWARD",
           "action": f"F{r}.0", "microbatch": 0, "start_s": 0.25 * r, "end_s": 0.25 * r + 0.1,
           "bytes": 0.0} for r in range(2)]
    meta = {"config": _cfg(), "model": MODEL, "seq_len": 16, "device": "cpu"}
    res = RunResult(events=ev, step_times_s=[0.5, 0.4, 0.3], losses=[2.0, 1.5, 1.2], meta=meta)
    d = res.save(tmp_path / "r")
    run = json.loads((d / "run.json").read_text())
    assert run["format"] == "merak-run/1" and run["config"] == meta["config"]
    assert run["wall_s"] == [0.5, 0.4, 0.3] and run["meta"] == {"device": "cpu"}
    assert not (d / "profile.json").exists()
    back = RunResult.load(d)
    assert back.step_times_s == res.step_times_s and back.losses == res.losses
    assert back.meta == meta
    # the events are one iteration's: saved as the last one's
    assert back.events == [dict(e, step=2) for e in ev]
    assert back.to_dataframe().equals(res.to_dataframe())
    # with a profile and the memory it is a run directory the validation reads
    res2 = RunResult(events=back.events, step_times_s=[0.3], losses=[1.2],
                     meta=dict(meta, memory=[]))
    got = read_run(res2.save(tmp_path / "v", profile=_profile(2)))
    assert got.steps == [2] and got.profile["stages"] == _profile(2)["stages"]
    with pytest.raises(RunDirError, match="no run.json"):
        RunResult.load(tmp_path)


def test_run_dir_errors(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        read_run(tmp_path / "missing")
    d, _ = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps(dict(run, format="merak-run/9")))
    with pytest.raises(RunDirError, match="merak-run/1"):
        read_run(d)
    (d / "run.json").write_text(json.dumps(run))
    text = (d / "events.csv").read_text().splitlines()
    (d / "events.csv").write_text("\n".join([text[0], text[1].replace(",0,", ",x,", 1)]))
    with pytest.raises(RunDirError, match="line 2"):
        read_run(d)
    (d / "profile.json").write_text("{}")
    with pytest.raises(RunDirError, match="format"):
        read_run(d)


def test_cli(tmp_path, capsys):
    d, sim = _synthetic_dir(tmp_path, _cfg(schedule="gpipe"), _profile(2))
    png = tmp_path / "g.png"
    assert cli_main(["validate", "--run", str(d), "--json", "--gantt", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["predicted_ms"] == pytest.approx(sim.iteration_time_s * 1e3)
    assert {"actions", "ranks", "memory", "config"} <= set(out)
    assert png.stat().st_size > 1000
    assert cli_main(["validate", "--run", str(d), "--report", str(tmp_path / "r.md")]) == 0
    assert "| stage | action kind |" in (tmp_path / "r.md").read_text()
    assert cli_main(["validate", "--run", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("merak-sim: error: run directory")


def test_post_overhead_lengthens_the_iteration_but_not_the_actions(tmp_path):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    slow = replace(run, profile={**run.profile, "machine": {**run.profile["machine"],
                                                            "p2p_post_s": 1e-3}})
    rep = compare_run(slow)
    assert rep.predicted_iteration_s > sim0.iteration_time_s + 2e-3
    assert max(rep.action_abs_errors) < 1e-9  # the posts are not the actions' time
    extra = rep.sim.meta["post_extra_s"]
    assert extra[(0, "B0")] == pytest.approx(2e-3)  # sA1/rG0 posted right before B0
    # in the per-rank breakdown the posts are not compute (a measured action starts
    # after its posts): the same compute as without them, the posts in the bubble
    base = compare_run(run).ranks
    assert list(rep.ranks["predicted_compute_s"]) == pytest.approx(
        list(base["predicted_compute_s"]), rel=1e-9)
    assert all(rep.ranks["predicted_bubble_s"] > base["predicted_bubble_s"] + 2e-3)


def test_contention_model_uses_alone_times_where_a_stage_runs_alone(tmp_path):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(schedule="gpipe"), _profile(2))
    run = read_run(d)
    stages = [dict(s, **{k[:-2] + "_solo_s": 0.5 * s[k] for k in (
        "forward_s", "backward_s", "backward_ckpt_s", "forward_nograd_s", "reforward_s",
        "backward_input_s", "backward_weight_s")}) for s in run.profile["stages"]]
    fast = compare_run(replace(run, profile={**run.profile, "stages": stages}))
    assert fast.predicted_iteration_s < sim0.iteration_time_s
    ev = fast.sim.events()
    f0 = ev[(ev["stage"] == 0) & (ev["action"] == "F0")].iloc[0]
    # GPipe: stage 0's first forward runs while stage 1 idles -> the alone time
    assert f0["end_s"] - f0["start_s"] == pytest.approx(0.5 * stages[0]["forward_s"], rel=1e-6)
    # the time of an action that overlaps the other stage's compute lies in between
    f1 = ev[(ev["stage"] == 0) & (ev["action"] == "F1")].iloc[0]
    assert 0.5 * stages[0]["forward_s"] < f1["end_s"] - f1["start_s"] <= stages[0]["forward_s"]


@pytest.mark.parametrize("schedule,recompute,kind", [("1f1b", "none", "BACKWARD"),
                                                     ("1f1b", "full", "BACKWARD"),
                                                     ("zb-h1", "none", "BACKWARD_WEIGHT")])
def test_backwards_after_a_ranks_first_are_priced_accumulating(tmp_path, schedule, recompute,
                                                                kind):
    c = 1.0 if recompute == "full" else 0.0
    d, sim0 = _synthetic_dir(tmp_path, _cfg(schedule=schedule, recompute=recompute),
                             _profile(2, c))
    run = read_run(d)
    delta = {"backward_accum_delta_s": 0.004, "backward_ckpt_accum_delta_s": 0.005,
             "backward_weight_accum_delta_s": 0.006}
    stages = [dict(st, **delta) for st in run.profile["stages"]]
    acc = compare_run(replace(run, profile={**run.profile, "stages": stages}))
    ev0, ev = sim0.events(), acc.sim.events()
    for stage in (0, 1):
        key = ("backward_weight_accum_delta_s" if kind == "BACKWARD_WEIGHT" else
               "backward_ckpt_accum_delta_s" if stage == 0 and c else "backward_accum_delta_s")

        def durs(e, stage=stage):
            b = e[(e["stage"] == stage) & (e["kind"] == kind)].sort_values("start_s")
            return list(b["end_s"] - b["start_s"])
        before, after = durs(ev0), durs(ev)
        assert len(before) == 4
        # the rank's first backward finds no gradients; the other three add into them
        assert after[0] == pytest.approx(before[0], abs=1e-9)
        assert after[1:] == pytest.approx([x + delta[key] for x in before[1:]], rel=1e-6)
    assert acc.predicted_iteration_s > sim0.iteration_time_s
    assert acc.summary()["backward_pricing"] == "paired-delta"
    # profiles without the accumulation figures (older run directories) price as before
    old = compare_run(run)
    assert old.predicted_iteration_s == pytest.approx(sim0.iteration_time_s)
    assert old.summary()["backward_pricing"] == "fresh"


def test_tied_all_reduce_ends_together_on_first_and_last_stage(tmp_path):
    _, sim = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    ev = sim.events()
    ar = ev[ev["kind"] == "ALL_REDUCE"].set_index("stage")
    assert ar.loc[0, "end_s"] == pytest.approx(ar.loc[1, "end_s"])
    assert ar.loc[1, "start_s"] < ar.loc[0, "start_s"]  # 1F1B: the last stage is done first


def test_min_statistic_uses_the_fastest_samples(tmp_path, capsys):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    stages = [dict(s, forward_min_s=0.5 * s["forward_s"]) for s in run.profile["stages"]]
    fast = replace(run, profile={**run.profile, "stages": stages})
    low = compare_run(fast, statistic="min")
    assert low.summary()["statistic"] == "min"
    assert low.predicted_iteration_s < sim0.iteration_time_s
    f = low.actions[low.actions["kind"] == "FORWARD"]
    assert (f["predicted_s"] < f["measured_s"]).all()
    assert compare_run(fast).predicted_iteration_s == pytest.approx(sim0.iteration_time_s)
    with pytest.raises(ValueError, match="statistic"):
        compare_run(fast, statistic="mode")
    assert cli_main(["validate", "--run", str(d), "--statistic", "min", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["statistic"] == "min"


def test_receive_posted_against_a_pending_send_of_a_computing_peer_costs_the_blocked_post(
        tmp_path):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    machine = {**run.profile["machine"], "p2p_post_s": 1e-4, "p2p_post_blocked_s": 5e-3}
    rep = compare_run(replace(run, profile={**run.profile, "machine": machine}))
    extra = rep.sim.meta["post_extra_s"]
    # 1F1B, stage 1 after B0 posts sG0 / rA1: stage 0 posted sA1 after F1 and starts
    # B0 as soon as sG0 lands, so the receive meets a pending send of a computing peer
    assert extra[(1, "F1")] == pytest.approx(1e-4 + 5e-3)
    # stage 0 after F1 posts sA1 / rG0: nothing was sent to it yet, plain posts
    assert extra[(0, "B0")] == pytest.approx(2e-4)
    assert rep.predicted_iteration_s > sim0.iteration_time_s + 5e-3
    assert max(rep.action_abs_errors) < 1e-9  # post costs are not the actions' time
    # without the blocked figure every post costs the plain figure
    plain = compare_run(replace(run, profile={**run.profile, "machine": {
        **run.profile["machine"], "p2p_post_s": 1e-4}}))
    assert plain.sim.meta["post_extra_s"][(1, "F1")] == pytest.approx(2e-4)


def test_mean_statistic_prices_from_the_profile_means(tmp_path):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    # without mean figures the stored medians stand
    assert compare_run(run).predicted_iteration_s == pytest.approx(sim0.iteration_time_s)
    stages = [dict(s, forward_mean_s=1.5 * s["forward_s"]) for s in run.profile["stages"]]
    skewed = replace(run, profile={**run.profile, "stages": stages})
    rep = compare_run(skewed)
    assert rep.statistic == "mean"
    assert rep.predicted_iteration_s > sim0.iteration_time_s
    f = rep.actions[rep.actions["kind"] == "FORWARD"]
    assert (f["predicted_s"] / f["measured_s"]).round(6).eq(1.5).all()
    assert compare_run(skewed, statistic="median").predicted_iteration_s == pytest.approx(
        sim0.iteration_time_s)


def test_classify_posts_splits_receives_met_by_a_pending_send_of_a_computing_peer():
    from merak_exec.profiling.post_probe import classify_posts

    rec = [
        # stage 0 posts sA1 / rG0 at t=1: nothing sent to it yet -> plain
        {"rank": 0, "iter": 0, "t0": 1.0, "t1": 1.0002,
         "parts": [("SEND_ACT", 0, 1), ("RECV_GRAD", 0, 0)]},
        # stage 1 posts sG0 / rA1 at t=2: sA1 pending since t=1, stage 0 computes from
        # 2.0001 (woken by sG0) -> blocked
        {"rank": 1, "iter": 0, "t0": 2.0, "t1": 2.003,
         "parts": [("SEND_GRAD", 1, 0), ("RECV_ACT", 1, 1)]},
        # stage 1 posts rA2 at t=3 before stage 0 sends it (t=3.5) -> plain
        {"rank": 1, "iter": 0, "t0": 3.0, "t1": 3.0001, "parts": [("RECV_ACT", 1, 2)]},
        {"rank": 0, "iter": 0, "t0": 3.5, "t1": 3.5001, "parts": [("SEND_ACT", 0, 2)]},
    ]
    spans = {(0, 0): [(2.0001, 2.02), (3.0, 3.4)], (1, 0): []}
    got = classify_posts(rec, spans, window_s=1e-3)
    assert got["blocked"] == [(pytest.approx(0.003), 2)]
    assert sorted(t for t, _ in got["plain"]) == pytest.approx([0.0001, 0.0001, 0.0002])
    assert sorted(n for _, n in got["plain"]) == [1, 1, 2]
    # the peer idle within the window: the same post is plain
    got = classify_posts(rec, {(0, 0): [(2.01, 2.02)]}, window_s=1e-3)
    assert got["blocked"] == []


def test_each_block_is_priced_from_the_profiler_steps_bracketing_it(tmp_path):
    d, sim0 = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    assert run.step_block == () and compare_run(run).blocks.empty  # older run directories
    base = run.profile["stages"]
    slow = [{k: 2 * v for k, v in st.items() if k.endswith("_s")} for st in base]
    fast = [{k: v for k, v in st.items() if k.endswith("_s")} for st in base]
    # block 0 between a fast and a slow profiler step, block 1 between two slow ones
    prof = {**run.profile, "samples": [{"stages": fast}, {"stages": slow}, {"stages": slow}]}
    rep = compare_run(replace(run, profile=prof, step_block=(0, 1)))
    b = rep.blocks.set_index("block")
    assert list(b.index) == [0, 1] and list(b["steps"]) == [1, 1]
    assert b.loc[0, "measured_s"] == pytest.approx(sim0.iteration_time_s)
    # block 1 is priced exactly as a run profiled slow throughout (p2p unchanged)
    slow_run = replace(run, profile={**run.profile, "stages": [
        {**st, **sl} for st, sl in zip(base, slow, strict=True)]})
    slow_t = simulate_run(slow_run).iteration_time_s
    assert 1.9 * sim0.iteration_time_s < slow_t < 2 * sim0.iteration_time_s
    assert b.loc[1, "predicted_s"] == pytest.approx(slow_t, rel=1e-9)
    assert b.loc[1, "error"] == pytest.approx(slow_t / sim0.iteration_time_s - 1, rel=1e-9)
    assert sim0.iteration_time_s < b.loc[0, "predicted_s"] < slow_t
    s = rep.summary()
    assert s["blocks"] == 2 and s["block_error_max"] == pytest.approx(b.loc[1, "error"])
    # two blocks: the standard error of their mean is half their difference
    assert s["block_error_se"] == pytest.approx(abs(b.loc[1, "error"] - b.loc[0, "error"]) / 2)
    assert "per block (2 blocks" in rep.to_markdown()


def test_cpu_share_compares_a_ranks_cpu_time_with_its_busy_time(tmp_path):
    d, sim = _synthetic_dir(tmp_path, _cfg(), _profile(2))
    run = read_run(d)
    assert run.cpu_s == () and compare_run(run).cpu.empty  # older run directories
    rep = compare_run(run)
    assert rep.summary()["cpu_share_min"] != rep.summary()["cpu_share_min"]  # NaN
    assert "cpu_share_min" not in summarize([rep])
    busy = {r.rank: r.compute_s + r.recompute_s for r in sim.ranks}
    # rank 0 had its core throughout; rank 1 lost a fifth of it in the second iteration
    cpu = ((busy[0], busy[0]), (busy[1], 0.8 * busy[1]))
    body = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**body, "cpu_s": [list(c) for c in cpu]}))
    run = read_run(d)
    assert run.cpu_s == cpu
    rep = compare_run(run)
    sh = rep.cpu.set_index(["step", "rank"])["share"]
    assert sh[(0, 0)] == pytest.approx(1.0) and sh[(1, 0)] == pytest.approx(1.0)
    assert sh[(0, 1)] == pytest.approx(1.0) and sh[(1, 1)] == pytest.approx(0.8)
    s = rep.summary()
    assert s["cpu_share_min"] == pytest.approx(0.8) and s["cpu_share_median"] == pytest.approx(1)
    assert summarize([rep])["cpu_share_min"] == pytest.approx(0.8)
    assert "lowest 0.800" in rep.to_markdown()
    # under TP the compute actions hold their collectives' waits: no share
    assert cpu_shares(replace(run, config=_cfg(pp=1, tp=2))).empty
    assert cpu_shares(replace(run, meta={"backend": "nccl"})).empty  # GPU: host waits
