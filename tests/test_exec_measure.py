"""Measurement: events in the shared schema, Chrome trace, and the profiler's trace."""

import json
from pathlib import Path

from merak_sim.timeline import EVENT_COLUMNS


def test_events_cover_every_action_in_the_shared_schema(two_rank_scenarios):
    codes, res, arg = two_rank_scenarios["scenario_events"]
    trace = Path(arg["trace"])
    assert codes == [0, 0], res
    r = res[0]
    assert "exception" not in r, r.get("exception")
    assert r["columns"] == list(EVENT_COLUMNS) == ["rank", "stage", "chunk", "stream",
                                                   "kind", "action", "microbatch",
                                                   "start_s", "end_s", "bytes"]
    # one row per action of the schedule on every rank (global rank == pp rank here)
    assert [list(a) for a in r["actions"]] == r["expected"]
    assert r["ordered"]
    assert r["streams"] == ["collective", "compute", "p2p"]
    assert r["p2p_bytes"] == [1 * 8 * 16 * 4]  # mbs x seq x hidden x fp32
    assert r["trace_events"] == r["rows"]
    d = json.loads(trace.read_text())
    assert {e["pid"] for e in d["traceEvents"]} == {0, 1}


def test_gantt_draws_one_bar_per_compute_or_collective_event():
    import matplotlib

    matplotlib.use("Agg")
    from merak_exec.result import RunResult

    ev = [dict(rank=r, stage=r, chunk=0, stream=s, kind=k, action=a, microbatch=m,
               start_s=t, end_s=t + 1.0, bytes=0)
          for r, s, k, a, m, t in [(0, "compute", "FORWARD", "F0", 0, 0.0),
                                   (0, "p2p", "SEND_ACT", "sA0", 0, 1.0),
                                   (1, "compute", "FORWARD", "F0", 0, 1.5),
                                   (1, "collective", "ALL_REDUCE", "AR", -1, 3.0)]]
    ax = RunResult(events=ev, step_times_s=[3.0, 1.0, 2.0]).gantt()
    assert len(ax.patches) == 3
    assert RunResult(events=ev, step_times_s=[3.0, 1.0, 2.0]).iteration_time_s == 2.0


def test_profiler_writes_a_readable_merak_trace(tmp_path):
    import torch

    from merak_exec.models import GPT
    from merak_exec.profiling.layer_trace import profile_chain, write_trace
    from support.models import tiny_gpt_config
    from merak_sim.trace import read_trace

    torch.manual_seed(0)
    model = GPT(tiny_gpt_config())
    out = tmp_path / "p.json"
    small = profile_chain(model, 1, 8, warmup=1, repeats=2)
    big = profile_chain(model, 4, 8, warmup=1, repeats=2)
    write_trace(small, out)
    t = read_trace(out)
    assert [r.kind for r in t.layers] == ["embedding", "block", "head"]
    blk = {lp.name: lp for lp in small.layers}["block"]
    blk4 = {lp.name: lp for lp in big.layers}["block"]
    assert blk.forward_s > 0 and blk.backward_s > 0 and blk.flops > 0
    # activations scale with the micro-batch; a checkpointed block keeps only its input
    assert blk4.activation_bytes == 4 * blk.activation_bytes
    assert blk.checkpoint_bytes == 1 * 8 * 16 * 4 < blk.activation_bytes


def test_profile_command_adds_gloo_collectives(tmp_path):
    from merak_exec.__main__ import cli
    from merak_sim.trace import read_trace

    out = tmp_path / "t.json"
    cli.main(["profile", "--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "32",
              "--seq", "8", "--repeats", "1", "--collectives", "--name", "tiny", "--out",
              str(out)], standalone_mode=False)
    t = read_trace(out)
    assert [r.kind for r in t.layers] == ["embedding", "block", "head"]
    assert {c.collective for c in t.collectives} == {"all-reduce", "all-gather", "p2p"}
    assert len(t.collectives) == 3 * 4 and all(c.seconds > 0 for c in t.collectives)
    assert {(c.group_size, c.placement) for c in t.collectives} == {(2, "intra")}
