"""Invariants of the validation pricing.

- Backwards that add into existing gradients: the profiler measures their extra cost
  as the median of paired differences (a backward adding into gradients minus one on
  cleared gradients), a small effect under two samples' noise. A stall in one pair's
  fresh sample (a descheduled rank; under tensor parallelism a peer late to one of the
  backward's collectives) can make the difference more negative than the backward is
  long, which priced those backwards, and the per-action prediction, below zero. The
  pricing floors an accumulating backward at the fastest fresh sample.
- No action is priced at a negative time; the error names the action.
- Each (stage, IR token) names one action, as the per-action keys assume.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.schedule import SCHEDULES
from merak_sim.validation.compare import compare_run
from merak_sim.validation.memory import gpt_param_bytes
from merak_sim.validation.pricing import ValidationError, simulate_run
from merak_sim.validation.rundir import MeasuredRun, read_run, write_run

TINY = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 4, "n_head": 4,
        "dropout": 0.0}
#: the end-to-end test's tp=2 case (one pipeline stage, micro-batches split in two)
SUB = dict(tp=2, micro_batch_size=2, global_batch_size=8, dtype="fp32",
           tp_overlap="sub-pipelined")
MS = 1e-3


def _tp_stage(pp: int = 1, s: int = 0) -> dict:
    """A stage profile of tiny action times (milliseconds, as the tiny GPT's are),
    each with its fastest sample 25 % below the figure."""
    times = {"forward": 2 * MS, "forward_plain": 2 * MS, "backward": 4 * MS,
             "backward_ckpt": 5 * MS, "forward_nograd": 1.5 * MS, "reforward": 2 * MS,
             "backward_input": 2 * MS, "backward_weight": 2 * MS, "all_reduce": 0.5 * MS,
             "optimizer": 1 * MS, "bare_forward_nograd": 1 * MS}
    st = {k + "_s": v for k, v in times.items()}
    st.update({k + "_min_s": 0.75 * v for k, v in times.items()})
    st.update(recompute_layers=0, heavy_layers=2, recompute_fraction=0.0,
              activation_bytes=1000.0, checkpoint_bytes=200.0, kept_bytes=1000.0,
              input_bytes=50.0, p2p_bytes=0 if s == pp - 1 else 4096, param_bytes=4000.0,
              optimizer_bytes=8000.0)
    return st


def _profile(pp: int = 1, **delta) -> dict:
    return {"format": "merak-stage-profile/1",
            "stages": [dict(_tp_stage(pp, s), **delta) for s in range(pp)],
            "machine": {"p2p_alpha_s": 1e-4, "p2p_s_per_byte": 1e-9}}


def _stub(config: dict, profile: dict) -> MeasuredRun:
    return MeasuredRun(path=Path("unused"), config=config, model=TINY, seq_len=16,
                       events=[], wall_s=[0.1], losses=[], memory=[], profile=profile)


def _durations(sim, kind: str) -> list[float]:
    ev = sim.events()
    b = ev[(ev["stage"] == 0) & (ev["kind"] == kind)].sort_values("start_s")
    return list(b["end_s"] - b["start_s"])


def _measured_dir(tmp_path, config: dict, profile: dict) -> Path:
    """A run directory whose measurement is the simulation of ``profile`` (one
    pipeline stage: no receive waits to rewrite)."""
    sim = simulate_run(_stub(config, profile))
    rows = [dict(r, step=k) for k in (0, 1) for r in sim.events().to_dict(orient="records")]
    cfg = sim.config
    params = gpt_param_bytes(TINY, cfg.pp, cfg.tp)
    memory = [{"rank": r, "pp_rank": 0, "param_bytes": params[0], "grad_bytes": params[0],
               "optimizer_bytes": 0, "activation_peak_bytes":
                   sim.peak_memory_bytes[0] - sim.trace.prog.state_bytes[0]}
              for r in range(cfg.tp)]
    return write_run(tmp_path / "run", {"config": config, "model": TINY, "seq_len": 16,
                                        "wall_s": [sim.iteration_time_s] * 2,
                                        "losses": [1.0, 0.9], "memory": memory}, rows, profile)


def test_stalled_fresh_sample_cannot_make_a_predicted_action_negative(tmp_path):
    config = ParallelConfig(**SUB).to_dict()
    d = _measured_dir(tmp_path, config, _profile())
    # one pair's fresh sample stalled: the paired difference exceeds the backward
    stalled = _profile(backward_accum_delta_s=-6 * MS)
    rep = compare_run(replace(read_run(d), profile=stalled))
    b = rep.actions[rep.actions["kind"] == "BACKWARD"].set_index("action")["predicted_s"]
    assert (rep.actions["predicted_s"] > 0).all(), rep.actions
    # the first backward stores fresh gradients; the others at the fastest fresh sample
    assert b["B0"] == pytest.approx(4 * MS)
    assert list(b[["B1", "B2", "B3"]]) == pytest.approx([3 * MS] * 3)


@pytest.mark.parametrize("kw,kind,key", [
    (SUB, "BACKWARD", "backward"),
    (dict(pp=2, micro_batch_size=1, global_batch_size=4, schedule="zb-h1", dtype="fp32"),
     "BACKWARD_WEIGHT", "backward_weight")])
def test_accumulation_difference_applies_down_to_the_fastest_fresh_sample(kw, kind, key):
    cfg = ParallelConfig(**kw)
    fresh = _durations(simulate_run(_stub(cfg.to_dict(), _profile(cfg.pp))), kind)
    base = _tp_stage()[key + "_s"]
    for delta, want in ((-0.25 * MS, base - 0.25 * MS), (-50 * MS, 0.75 * base),
                        (0.5 * MS, base + 0.5 * MS)):
        prof = _profile(cfg.pp, **{key + "_accum_delta_s": delta})
        got = _durations(simulate_run(_stub(cfg.to_dict(), prof)), kind)
        assert got[0] == pytest.approx(fresh[0])
        assert got[1:] == pytest.approx([want] * (len(got) - 1))
    # without a fastest sample (older profiles) the fresh figure is the floor
    prof = _profile(cfg.pp, **{key + "_accum_delta_s": -50 * MS})
    for st in prof["stages"]:
        del st[key + "_min_s"]
    assert _durations(simulate_run(_stub(cfg.to_dict(), prof)), kind) == pytest.approx(fresh)


def test_an_action_priced_at_a_negative_time_is_a_clear_error():
    prof = _profile(forward_s=-1 * MS)
    with pytest.raises(ValidationError, match=r"stage 0 action F0 priced at -0\.001 s"):
        simulate_run(_stub(ParallelConfig(**SUB).to_dict(), prof))


def test_every_schedule_validation_accepts_has_one_action_per_token():
    """The post costs, the replay's times and the per-action table are keyed by
    (stage, IR token): every program validation prices must have each once."""
    priced = set()
    for name, rc, pp in itertools.product(SCHEDULES, ("none", "full"), (2, 4)):
        try:
            cfg = ParallelConfig(pp=pp, dp=2, micro_batch_size=1, global_batch_size=4 * pp,
                                 schedule=name, recompute=rc, dtype="fp32")
            sim = simulate_run(_stub(cfg.to_dict(), _profile(pp)))
        except ValidationError as e:
            assert "virtual_stages" in str(e)  # interleaved: not a validation config
            continue
        except ValueError:
            continue  # the schedule refuses this shape
        ev = sim.events()
        comp = ev[ev["stream"] != "p2p"]
        assert not comp.duplicated(["rank", "stage", "action"]).any(), (name, rc, pp)
        priced.add(name)
    assert {"gpipe", "1f1b", "zb-h1", "zb-h2", "shifted-critical-path"} <= priced, priced
