"""Each registered ScheduleSpec's declared facts hold for its generator's output, the
configuration reads them, and the planner enumerates exactly what the specs allow."""

from __future__ import annotations

import itertools

import pytest

from merak_sim.config import ParallelConfig
from merak_sim.model import get_model
from merak_sim.planner import SearchSpace, enumerate_candidates
from merak_sim.schedule import SCHEDULES, ScheduleError, generate, validate
from merak_sim.schedule.ir import Kind, iter_actions
from merak_sim.schedule.replay import stage_aware_fractions
from merak_sim.sim.from_config import recompute_fractions, schedule_for

GRID = list(itertools.product(range(1, 7), range(1, 13), (1, 2, 3)))
EXPLICIT = (Kind.FORWARD_NOGRAD, Kind.RECOMPUTE)


def _kinds(sched, rank):
    return {a.kind for a in iter_actions(sched.programs[rank])}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_requirements_decide_exactly_what_builds(name):
    spec = SCHEDULES[name]
    built = 0
    for S, M, v in GRID:
        bad = spec.violation(S, M, v)
        if bad:
            with pytest.raises(ScheduleError) as e:
                generate(name, S, M, v)
            assert str(e.value) == bad
            continue
        sched = generate(name, S, M, v)
        validate(sched)  # deadlock-free, every micro-batch through every stage
        assert (sched.num_stages, sched.num_microbatches, sched.virtual_stages) == (S, M, v)
        assert M >= spec.min_microbatches(S)
        built += 1
    assert built > 0


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_never_recompute_and_explicit_recompute_hold(name):
    spec = SCHEDULES[name]
    explicit_somewhere = False
    for S, M, v in GRID:
        if spec.violation(S, M, v):
            continue
        sched = generate(name, S, M, v)
        never = spec.never_recompute(S)
        assert sched.no_recompute_stages == never
        for r in range(S):
            has = bool(_kinds(sched, r) & set(EXPLICIT))
            explicit_somewhere |= has
            if r in never or not spec.explicit_recompute:
                assert not has, (S, M, v, r)
    assert explicit_somewhere == spec.explicit_recompute


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_stage_fractions_follow_the_micro_batches_held(name):
    """A rank whose stage-aware fraction departs from Merak's formula holds as many
    micro-batches as the rank whose fraction it takes."""
    spec = SCHEDULES[name]
    S = 6
    M = max(12, spec.min_microbatches(S))
    v = 2 if spec.interleaved else 1
    peak = validate(generate(name, S, M, v)).peak_in_flight
    base, mine = stage_aware_fractions(S, 0.75), spec.stage_fractions(S, 0.75)
    assert len(mine) == S
    for s, x in enumerate(mine):
        if x != base[s]:
            assert any(base[t] == x and peak[t] == peak[s] for t in range(S)), s


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("rc", ["none", "full", "selective", "stage-aware"])
def test_config_reads_the_spec_as_the_ir_says(name, rc):
    spec = SCHEDULES[name]
    for S in range(2 if spec.placement == "v" or spec.min_virtual_stages > 1 else 1, 7):
        v = 2 if spec.interleaved and S > 1 else 1
        M = max(spec.min_microbatches(S), S)
        cfg = ParallelConfig(pp=S, virtual_stages=v, global_batch_size=M, schedule=name,
                             recompute=rc)
        assert recompute_fractions(cfg) == recompute_fractions(cfg, schedule_for(cfg))


def test_config_rejects_virtual_stages_where_the_spec_has_none():
    for name, spec in SCHEDULES.items():
        if spec.interleaved:
            ParallelConfig(pp=2, virtual_stages=2, global_batch_size=4, schedule=name)
        else:
            with pytest.raises(ValueError, match="interleaved"):
                ParallelConfig(pp=2, virtual_stages=2, global_batch_size=4, schedule=name)


def test_planner_enumerates_exactly_what_the_specs_allow():
    model = get_model("gpt-2.5b")
    space = SearchSpace(tp=(1,), pp=(2, 4), micro_batch_sizes=(1, 2, 4),
                        virtual_stages=(1, 2), sequence_parallel=(False,),
                        tp_overlap=("none",), zero=(0,))
    seen = set()
    for c in enumerate_candidates(model, 8, 8, 16, space):
        if c.schedule == "-":
            continue
        spec = SCHEDULES[c.schedule]
        assert spec.pairs_with(c.recompute)
        assert c.pruned == spec.violation(c.pp, c.microbatches, c.virtual_stages)
        seen.add((c.pp, c.micro_batch_size, c.schedule, c.virtual_stages, c.recompute))
    want = {(pp, mbs, name, v, rc)
            for pp in (2, 4) for mbs in (1, 2, 4) for name, spec in SCHEDULES.items()
            for v in ((1, 2) if spec.interleaved else (1,))
            for rc in space.recompute if spec.pairs_with(rc)}
    assert seen == want
    # Explicit re-forwards are only paired with a policy that checkpoints.
    assert not any(SCHEDULES[n].explicit_recompute and rc in ("none", "selective")
                   for _pp, _m, n, _v, rc in seen)
