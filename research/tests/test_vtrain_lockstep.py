"""DeepSpeed's lock-step TrainSchedule (research.vtrain_lockstep) as a cross-check
of the evaluator's pricing of the vTrain runs' pipeline."""

import pytest

from research.vtrain import PreparedRow, VTrainRow
from research.vtrain_lockstep import lockstep_makespan, step_micro_batch


@pytest.mark.parametrize("stages,m", [(1, 3), (2, 4), (4, 4), (4, 7), (5, 2), (8, 16)])
def test_every_stage_runs_each_micro_batch_forward_then_backward_once(stages, m):
    for g in range(stages):
        fwd, bwd = [], []
        for step in range(2 * (m + stages - 1)):
            i, is_fwd = step_micro_batch(step, g, stages)
            if 0 <= i < m:
                (fwd if is_fwd else bwd).append((i, step))
        assert [i for i, _ in fwd] == list(range(m)) == [i for i, _ in bwd]
        assert all(f < b for (_, f), (_, b) in zip(fwd, bwd, strict=True))
        # 1F1B: at most stages - g forwards are in flight before their backwards.
        for i, b in bwd:
            assert sum(1 for _, f in fwd if f < b) - i <= stages - g


@pytest.mark.parametrize("stages,m", [(2, 4), (4, 8), (3, 5)])
def test_neighbours_meet_with_matching_tensors(stages, m):
    # Stage g's backward step meets g + 1's forward step: the activation g sends
    # (its previous forward) is the one g + 1 receives, the gradient g receives (its
    # backward's micro-batch) is the one g + 1 sends (its previous backward).
    last: dict[int, tuple[int, bool]] = {}
    for step in range(2 * (m + stages - 1)):
        now = {g: step_micro_batch(step, g, stages) for g in range(stages)}
        for g in range(stages - 1):
            (i, fw), (j, fw_next) = now[g], now[g + 1]
            if fw or not fw_next:
                continue
            prev_g, prev_next = last.get(g, (-1, False)), last.get(g + 1, (-1, False))
            sent_act = prev_g[0] if 0 <= prev_g[0] < m else None
            got_act = j if 0 <= j < m else None
            assert sent_act == got_act
            got_grad = i if 0 <= i < m else None
            sent_grad = prev_next[0] if 0 <= prev_next[0] < m else None
            assert got_grad == sent_grad
        last = now


def test_lockstep_equals_the_evaluator_without_a_pipeline():
    row = VTrainRow(gpus=8, global_batch=32, micro_batch=4, hidden=1024, heads=16,
                    layers=12, seq_len=1024, tp=2, dp=4, pp=1, time_ms=1.0)
    p = PreparedRow.of(row)
    assert lockstep_makespan(p) == pytest.approx(p.predict(), rel=1e-9)


@pytest.mark.parametrize("tp,dp,pp,mbs", [(1, 1, 4, 1), (2, 2, 2, 4), (2, 8, 4, 2)])
def test_lockstep_is_never_slower_and_close_to_the_evaluator(tp, dp, pp, mbs):
    # Only the fill and drain differ: a meeting there moves one tensor, where the
    # evaluator's exchange charges two.
    row = VTrainRow(gpus=tp * dp * pp, global_batch=dp * mbs * 8, micro_batch=mbs,
                    hidden=2048, heads=16, layers=8, seq_len=1024, tp=tp, dp=dp, pp=pp,
                    time_ms=1.0)
    p = PreparedRow.of(row)
    ls, ev = lockstep_makespan(p), p.predict()
    assert ls <= ev * (1 + 1e-9)
    assert ls == pytest.approx(ev, rel=0.02)
