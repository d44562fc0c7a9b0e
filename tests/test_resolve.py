"""One reading of model and cluster arguments, and the cluster record of plan files."""

from __future__ import annotations

import dataclasses

import pytest

from merak_sim.hardware import get_cluster
from merak_sim.model import ModelSpecError, get_model
from merak_sim.resolve import cluster_record, resolve_cluster, resolve_model


def test_model_forms_agree():
    spec = get_model("gpt-1.5b")
    assert resolve_model("gpt-1.5b") == spec
    assert resolve_model(spec) is spec
    assert resolve_model({"preset": "gpt-1.5b"}) == spec
    assert resolve_model(spec.to_dict()) == spec
    with pytest.raises(ModelSpecError, match="unknown model preset"):
        resolve_model("nope")


def test_cluster_forms_and_nodes():
    by_name = resolve_cluster("paper-3090", nodes=2)
    assert by_name == get_cluster("paper-3090", nodes=2)
    assert resolve_cluster(get_cluster("paper-3090"), nodes=2) == by_name
    assert resolve_cluster(by_name) is by_name
    assert resolve_cluster(by_name.to_dict()) == by_name


def test_cluster_record_is_a_preset_only_when_it_is_one():
    c = get_cluster("paper-3090", nodes=2)
    assert cluster_record(c) == {"preset": "paper-3090", "nodes": 2}
    assert cluster_record(resolve_cluster(c.to_dict())) == {"preset": "paper-3090",
                                                            "nodes": 2}
    mine = dataclasses.replace(c, name="my-cluster")
    assert cluster_record(mine) == mine.to_dict()
    assert resolve_cluster(cluster_record(mine)) == mine
