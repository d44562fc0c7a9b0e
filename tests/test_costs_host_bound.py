"""The host-issue floor of a layer pass: max(device time, kernels x host seconds)."""

import pytest

from merak_sim.costs.efficiency import Efficiency
from merak_sim.costs.layers import layer_cost
from merak_sim.model import ModelSpec

PEAK, BW = 312e12, 2.039e12
SMALL = ModelSpec(name="h1024", family="gpt", layers=24, hidden=1024, heads=16,
                  seq_len=1024, vocab=51200, dtype="fp16")
LARGE = ModelSpec(name="h8192", family="gpt", layers=48, hidden=8192, heads=64,
                  seq_len=2048, vocab=51200, dtype="fp16")


def test_host_bound_is_the_longer_of_device_and_issue():
    e = Efficiency(host_op_s=5e-5)
    assert e.host_bound(1e-3, 10) == pytest.approx(1e-3)        # device bound
    assert e.host_bound(1e-4, 10) == pytest.approx(5e-4)        # host bound
    assert Efficiency().host_bound(1e-4, 10_000) == 1e-4        # default: never


def test_small_layers_are_flat_in_micro_batch_when_host_bound():
    e = Efficiency(host_op_s=1e-4)
    one, two = (layer_cost(SMALL, PEAK, BW, e, 2, b, 2, False, 1) for b in (1, 2))
    # The host sets the pace: same forward time, kernel count x host seconds.
    assert one.forward_s == pytest.approx(two.forward_s)
    assert one.forward_s == pytest.approx(one.kernels_fwd * 1e-4)
    dev = layer_cost(SMALL, PEAK, BW, Efficiency(), 2, 1, 2, False, 1)
    assert one.forward_s > dev.forward_s
    # The backward's halves are stretched alike.
    assert one.backward_input_s / one.backward_weight_s == pytest.approx(
        dev.backward_input_s / dev.backward_weight_s)


def test_large_layers_are_untouched_by_the_floor():
    a = layer_cost(LARGE, PEAK, BW, Efficiency(host_op_s=1e-4), 2, 4, 2, False, 1)
    b = layer_cost(LARGE, PEAK, BW, Efficiency(), 2, 4, 2, False, 1)
    assert (a.forward_s, a.backward_input_s, a.backward_weight_s) == \
        (b.forward_s, b.backward_input_s, b.backward_weight_s)
