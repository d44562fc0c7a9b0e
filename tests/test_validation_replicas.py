"""The measured side pairs each receive with its own sender: under data (or tensor)
parallelism a pipeline stage has several ranks, each sending its own copy of a
micro-batch's activation at its own time, so the send is found by the sending rank,
not by (stage, kind, micro-batch), which would take whichever replica came first."""

from __future__ import annotations

from pathlib import Path

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.layout import RankLayout
from merak_sim.validation.measured import step_frame
from merak_sim.validation.rundir import MeasuredRun


def _row(rank, stage, stream, kind, action, start, end):
    return {"rank": rank, "stage": stage, "chunk": 0, "stream": stream, "kind": kind,
            "action": action, "microbatch": 0, "start_s": start, "end_s": end,
            "bytes": 4096 if stream == "p2p" else 0, "step": 0}


def test_a_receive_waits_for_its_own_replicas_send():
    cfg = ParallelConfig(pp=2, dp=2, micro_batch_size=1, global_batch_size=4,
                         schedule="1f1b", dtype="fp32")
    lay = RankLayout.of(cfg)
    events = []
    # replica d of stage 0 sends F0's activation at 1 + 2d; its stage-1 peer posted
    # the receive at 0.5, started timing F0 then, and got the activation 0.2 s later
    for d in (0, 1):
        s0, s1 = lay.rank(0, d), lay.rank(1, d)
        t = 1.0 + 2.0 * d
        events += [_row(s0, 0, "p2p", "SEND_ACT", "sA0", t, t + 1e-4),
                   _row(s1, 1, "p2p", "RECV_ACT", "rA0", 0.5, t + 0.2),
                   _row(s1, 1, "compute", "FORWARD", "F0", 0.5, t + 1.0)]
    run = MeasuredRun(path=Path("unused"), config=cfg.to_dict(), model={}, seq_len=16,
                      events=events, wall_s=[1.0], losses=[], memory=[], profile={})
    f = step_frame(run, 0).set_index(["rank", "kind"])
    for d in (0, 1):
        r = f.loc[(lay.rank(1, d), "FORWARD")]
        assert r["eff_start_s"] == pytest.approx(1.2 + 2.0 * d)
        # in flight from its own replica's send on: 0.2 s exposed, the rest bubble
        assert r["wait_comm_s"] == pytest.approx(0.2)
