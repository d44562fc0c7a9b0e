"""The engine's event loop (merak_sim.sim.kernel, issue 34 item 5) processes events in
SimPy's order: random processes of timeouts, events triggered by other processes,
sub-processes and all-of conditions leave the same (time, label) trace under both;
the fabric's link bundles give the same flow ends as one load per link."""

import random

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from merak_sim.sim.entities import Fabric, Topology
from merak_sim.sim.kernel import Environment


def _script(env, rng_seed: int, log: list) -> None:
    """Processes that wait on timeouts (ties included), on events other processes
    trigger, on sub-processes and on all-of conditions, logging what they see."""
    rng = random.Random(rng_seed)
    shared = [env.event() for _ in range(4)]

    def child(name, d):
        yield env.timeout(d)
        log.append((env.now, f"{name} child done"))
        return name

    def proc(name):
        for step in range(rng.randint(2, 6)):
            r = rng.random()
            if r < 0.4:
                v = yield env.timeout(rng.choice([0.0, 0.5, 1.0, 1.5]), value=step)
                log.append((env.now, f"{name} timeout {v}"))
            elif r < 0.6:
                ev = shared[rng.randrange(4)]
                if not ev.triggered:
                    ev.succeed(name)
                    log.append((env.now, f"{name} triggers"))
                v = yield ev
                log.append((env.now, f"{name} saw {v}"))
            elif r < 0.8:
                v = yield env.process(child(f"{name}.{step}", rng.choice([0.0, 1.0])))
                log.append((env.now, f"{name} joined {v}"))
            else:
                yield env.all_of([env.timeout(rng.choice([0.0, 1.0])),
                                  env.timeout(rng.choice([0.5, 1.0]))])
                log.append((env.now, f"{name} all"))

    for i in range(rng.randint(2, 6)):
        env.process(proc(f"p{i}"))
    for ev in shared:  # leave nothing waiting forever
        env.process(_late(env, ev))


def _late(env, ev):
    yield env.timeout(10.0)
    if not ev.triggered:
        ev.succeed("late")


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_same_order_as_simpy(seed):
    ours, theirs = [], []
    env = Environment()
    _script(env, seed, ours)
    n = env.run()
    ref = simpy.Environment()
    _script(ref, seed, theirs)
    ref.run()
    assert ours == theirs and n > 0


def test_run_reports_progress_and_counts_events():
    env = Environment()
    for d in range(10):
        env.timeout(float(d))
    seen = []
    assert env.run(every=3, report=lambda: seen.append(env.now)) == 10
    assert seen == [2.0, 5.0, 8.0]


def test_an_event_succeeds_once():
    env = Environment()
    ev = env.event().succeed(1)
    with pytest.raises(RuntimeError):
        ev.succeed(2)
    with pytest.raises(ValueError):
        env.timeout(-1.0)


def _flows(fab: Fabric, env, plan: list, ends: dict) -> None:
    def one(i, at, links, work, demand):
        yield env.timeout(at)
        yield fab.start(links, work, demand)
        ends[i] = env.now

    for i, p in enumerate(plan):
        env.process(one(i, *p))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_bundled_links_equal_one_load_per_link(seed):
    """Random flows over routes that share some links: bundling the links the routes
    always cross together changes no flow's end (nor their order)."""
    rng = random.Random(seed)
    topo = Topology(4, 10.0, 4.0, {"gpu1.out": 0.5})
    names = [f"gpu{g}.{d}" for g in range(4) for d in ("out", "in")] + ["node0.nic.out"]
    routes = []
    for _ in range(rng.randint(1, 5)):
        k = rng.randint(1, 5)
        routes.append(tuple((ln, float(rng.choice([1, 1, 2]))) for ln in rng.sample(names, k)))
    plan = [(rng.choice([0.0, 0.0, 0.5, 1.0]), rng.choice(routes), rng.uniform(0.5, 2.0),
             rng.uniform(1.0, 20.0)) for _ in range(rng.randint(1, 12))]
    got, ref = {}, {}
    env = Environment()
    _flows(Fabric(env, topo, routes), env, plan, got)
    env.run()
    env2 = Environment()
    _flows(Fabric(env2, topo), env2, plan, ref)
    env2.run()
    assert got == ref and len(got) == len(plan)


def test_fabric_refuses_a_route_it_was_not_given():
    env = Environment()
    fab = Fabric(env, Topology(4, 10.0, 4.0), [(("gpu0.out", 1.0), ("gpu1.in", 1.0))])
    with pytest.raises(ValueError, match="no route"):
        fab.start((("gpu2.out", 1.0),), 1.0, 1.0)
