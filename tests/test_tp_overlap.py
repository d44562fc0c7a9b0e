"""Chunked tensor-parallel overlap (TE userbuffers, torch async TP), issue 36 item 3."""

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.costs.analytic import AnalyticCostModel
from merak_sim.costs.tp_overlap import CHUNKED_OVERLAPS, chunked_exposed_s, chunked_pass
from merak_sim.hardware import get_cluster
from merak_sim.model import get_model
from merak_sim.planner.space import SearchSpace, enumerate_candidates


def test_chunk_pipeline_formula():
    # Communication shorter than the GEMM: only one chunk of it shows.
    assert chunked_exposed_s(4.0, 8.0, 4) == pytest.approx(1.0)
    # Longer: one chunk plus (n-1)/n of the excess.
    assert chunked_exposed_s(8.0, 4.0, 4) == pytest.approx(2.0 + 3 * 4.0 / 4)
    # One chunk: nothing overlaps.
    assert chunked_exposed_s(3.0, 10.0, 1) == pytest.approx(3.0)
    assert chunked_exposed_s(4.0, 8.0, 4, gemm_slowdown=0.05) == pytest.approx(1.4)
    with pytest.raises(ValueError, match="chunks must be a positive integer"):
        chunked_exposed_s(1.0, 1.0, 0)


def test_pass_shares_gemm_between_collectives():
    m = CHUNKED_OVERLAPS["te-chunked"]
    got = chunked_pass("te-chunked", 1.0, 1.0, 2, 4, 8.0)
    one = chunked_exposed_s(1.0, 2.0, 4, m.gemm_slowdown)
    assert got == pytest.approx(4 * one)
    with pytest.raises(ValueError, match="unknown chunked TP overlap"):
        chunked_pass("sub-pipelined", 1.0, 1.0, 2, 4, 8.0)


def _stage(overlap: str, mbs: int = 1):
    m = get_model("llama3-70b")
    cfg = ParallelConfig(dp=1, tp=8, pp=1, micro_batch_size=mbs, global_batch_size=mbs,
                         sequence_parallel=True, tp_overlap=overlap, dtype="fp8")
    return AnalyticCostModel().cost_table(m, get_cluster("dgx-h100"), cfg).stages[0]


def test_chunked_overlap_at_micro_batch_one_hides_most_tp_comm():
    none, te, at = _stage("none"), _stage("te-chunked"), _stage("async-tp")
    assert none.tp_comm_fwd_s == pytest.approx(te.tp_comm_fwd_s)  # same collectives
    assert none.tp_exposed_fwd_s == pytest.approx(none.tp_comm_fwd_s)
    for s in (te, at):
        assert 0 < s.tp_exposed_fwd_s < 0.5 * none.tp_exposed_fwd_s
        assert s.forward_s < none.forward_s and s.backward_s < none.backward_s
    assert te.tp_exposed_fwd_s < at.tp_exposed_fwd_s  # smaller GEMM slowdown


def test_sub_pipelined_still_needs_even_micro_batch_chunked_does_not():
    with pytest.raises(ValueError, match="not divisible"):
        ParallelConfig(tp=2, micro_batch_size=1, global_batch_size=1,
                       tp_overlap="sub-pipelined", tp_overlap_parts=2)
    ParallelConfig(tp=2, micro_batch_size=1, global_batch_size=1, sequence_parallel=True,
                   tp_overlap="async-tp")
    with pytest.raises(ValueError, match="add sequence_parallel"):
        ParallelConfig(tp=2, global_batch_size=1, tp_overlap="te-chunked")


def test_planner_pairs_chunked_overlap_with_sequence_parallel():
    space = SearchSpace(tp=(2,), pp=(1,), cp=(1,), micro_batch_sizes=(1,),
                        tp_overlap=("none", "te-chunked"), recompute=("none",),
                        zero=(0,))
    cands = [c for c in enumerate_candidates(get_model("llama3-8b"), 8, 8, 8, space)
             if not c.pruned]
    kinds = {(c.sequence_parallel, c.tp_overlap) for c in cands}
    assert (True, "te-chunked") in kinds and (False, "te-chunked") not in kinds
    assert (False, "none") in kinds
