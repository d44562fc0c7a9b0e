"""The NCCL posting rule: proved for every generator, mixed postings caught with a grid."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.schedule import SCHEDULES, generate, validate
from merak_sim.schedule.posting import (
    Posting,
    PostingError,
    channel,
    channels,
    check_postings,
    fused_only_postings,
    pipeline_group_postings,
    runtime_postings,
)


def _valid(name, pp, m, v):
    """Nearest arguments ``name`` accepts (pp 1..8, M 1..32, v 1..4)."""
    spec = SCHEDULES[name]
    if not spec.interleaved or pp == 1:
        v = 1
    if spec.placement == "v":  # two chunks in a V, on at least two ranks
        pp, v = max(pp, 2), 2
    if spec.min_virtual_stages > 1:  # at least that many chunks, on at least two ranks
        pp, v = max(pp, 2), max(v, spec.min_virtual_stages)
    m = max(m, spec.min_microbatches(pp))
    if spec.microbatches_multiple_of_pp:
        m = max(pp, (m // pp) * pp)
    assert not spec.violation(pp, m, v)
    return pp, m, v


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(list(SCHEDULES)), pp=st.integers(1, 8), m=st.integers(1, 32),
       v=st.integers(1, 4))
def test_runtime_posting_rule_holds_for_every_generator(name, pp, m, v):
    sched = generate(name, *_valid(name, pp, m, v))
    check_postings(sched)  # raises PostingError with the grid otherwise
    posts = runtime_postings(sched)
    used = set()
    for r, rp in enumerate(posts):
        for p in rp:
            assert p.batched and len(p.ops) == 1  # both ends post alike: one batch each
            assert p.group == channel(sched, r, p.ops[0])
            used.add(p.group)
    assert used <= set(channels(sched.num_stages, sched.virtual_stages, sched.placement))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_validate_runs_the_posting_rule(name):
    pp, m, v = _valid(name, 4, 8, 2)
    validate(generate(name, pp, m, v))


def test_planted_mixed_posting_is_caught_with_a_grid():
    sched = generate("1f1b", 2, 4)
    posts = [list(rp) for rp in runtime_postings(sched)]
    # rank 1 posts its first gradient send alone (a lone isend) instead of batched
    j = next(j for j, p in enumerate(posts[1]) if p.ops[0].kind.name == "SEND_GRAD")
    posts[1][j] = Posting(1, posts[1][j].step, posts[1][j].ops, posts[1][j].group, False)
    with pytest.raises(PostingError) as e:
        check_postings(sched, tuple(tuple(rp) for rp in posts))
    msg = str(e.value)
    assert "never meet" in msg
    lines = msg.splitlines()
    assert lines[1].startswith("  S0") and lines[2].startswith("  S1")
    assert ">><sG0>[rA1]<<" in lines[2] and ">>[sA1][rG0]<<" in lines[1]  # both ends
    assert "lone isend/irecv" in lines[-1]


@pytest.mark.parametrize("name", ["gpipe", "zb-h1", "pre-recompute", "last-no-recompute",
                                  "interleaved-1f1b"])
def test_fusing_only_adjacent_pairs_mixes_the_ends(name):
    """Batching only fused groups (lone operations otherwise) leaves one end lone and
    the other batched in these schedules."""
    sched = generate(name, *_valid(name, 2, 4, 1))
    with pytest.raises(PostingError, match="never meet"):
        check_postings(sched, fused_only_postings(sched))


def test_one_communicator_for_all_p2p_hangs_interleaving():
    """All of a rank's batches on one pipeline-group communicator run in posting order;
    interleaved 1F1B then needs buffering NCCL does not promise."""
    sched = generate("interleaved-1f1b", 2, 4, 2)
    with pytest.raises(PostingError, match="hangs on NCCL") as e:
        check_postings(sched, pipeline_group_postings(sched))
    assert ">>" in str(e.value).splitlines()[1] and ">>" in str(e.value).splitlines()[2]


def test_channels_cover_the_ring_only_when_chunks_wrap():
    assert channels(1, 1) == ()
    assert channels(3, 1) == (("A", 0, 1), ("G", 1, 0), ("A", 1, 2), ("G", 2, 1))
    assert channels(2, 2)[-2:] == (("A", 1, 0), ("G", 0, 1))
