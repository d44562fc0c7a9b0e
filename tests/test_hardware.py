"""Hardware presets, placement queries, JSON clusters, errors."""

import json

import pytest

from merak_sim.hardware import (
    CLUSTER_PRESETS,
    GPU_PRESETS,
    Cluster,
    HardwareError,
    get_cluster,
)

GB = 1e9


def test_required_cluster_names_exist():
    for name in ("paper-3090", "dgx-a100-80g", "dgx-a100-40g", "vtrain-a100", "dgx-h100",
                 "h200", "local-cpu"):
        assert name in CLUSTER_PRESETS
        c = get_cluster(name)
        assert c.world_size >= 1 and c.gpu.memory_bytes > 0


def test_paper_cluster_shape_and_assumption_label():
    c = get_cluster("paper-3090")
    assert (c.nodes, c.gpus_per_node, c.world_size) == (16, 4, 64)
    assert c.gpu.name == "RTX3090" and c.gpu.memory_bytes == 24 * GB
    assert any("ASSUMPTION" in n for n in c.notes)
    assert c.inter.raw_bandwidth_Bps == pytest.approx(12.5 * GB)
    assert c.intra.raw_bandwidth_Bps == pytest.approx(32 * GB)


def test_gpu_spec_numbers_from_reference():
    assert GPU_PRESETS["A100-80GB"].peak("bf16") == 312e12
    assert GPU_PRESETS["A100-40GB"].mem_bandwidth_Bps == 1555 * GB
    assert GPU_PRESETS["H100-80GB"].peak("fp16") == 989e12
    assert GPU_PRESETS["H200-141GB"].memory_bytes == 141 * GB
    assert GPU_PRESETS["V100-32GB"].peak("fp32") == 15.7e12


def test_dgx_links():
    c = get_cluster("dgx-a100-80g", nodes=4)
    assert c.world_size == 32
    assert c.inter.raw_bandwidth_Bps == pytest.approx(8 * 25 * GB)
    assert c.intra.raw_bandwidth_Bps == pytest.approx(300 * GB)
    assert c.inter_bandwidth_per_gpu_Bps == pytest.approx(c.inter.bandwidth_Bps / 8)


def test_placement_queries():
    c = get_cluster("dgx-a100-80g", nodes=2)
    assert c.same_node(0, 7) and not c.same_node(7, 8)
    assert c.node_of(9) == 1
    assert c.link_between(0, 1) is c.intra and c.link_between(0, 8) is c.inter
    with pytest.raises(HardwareError, match="rank 16"):
        c.node_of(16)


def test_vtrain_cluster_matches_its_config():
    c = get_cluster("vtrain-a100", nodes=8)
    assert c.intra.bandwidth_Bps == 150 * GB
    assert c.inter.bandwidth_Bps == 800 / 8 * GB


def test_json_roundtrip_and_preset_override(tmp_path):
    c = get_cluster("dgx-h100", nodes=3)
    assert Cluster.from_json(c.to_dict()) == c
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"preset": "paper-3090", "nodes": 2, "name": "mine"}))
    c2 = get_cluster(str(p))
    assert c2.nodes == 2 and c2.name == "mine" and c2.gpu.name == "RTX3090"
    c3 = Cluster.from_json({"name": "x", "gpu": "A100-40GB", "nodes": 1, "gpus_per_node": 2,
                            "intra": {"name": "l", "bandwidth_Bps": 1e9, "latency_s": 1e-6},
                            "inter": {"name": "n", "bandwidth_Bps": 1e9, "latency_s": 1e-6}})
    assert c3.world_size == 2 and c3.intra.efficiency == 1.0


@pytest.mark.parametrize("kw,needle", [
    ({"name": "nope"}, "unknown cluster preset 'nope'"),
    ({"name": "paper-3090", "nodes": 0}, "nodes must be a positive integer, got 0"),
    ({"name": "h200", "nodes": 2}, "nodes must be 1"),
])
def test_bad_cluster_input(kw, needle):
    with pytest.raises(HardwareError) as e:
        get_cluster(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_cluster_json_fields():
    with pytest.raises(HardwareError, match="gpus_per_node"):
        Cluster.from_json({"gpu": "A100-40GB", "nodes": 1, "intra": {}, "inter": {}})
    with pytest.raises(HardwareError, match="bandwidth_Bps must be positive, got -1"):
        Cluster.from_json({"gpu": "A100-40GB", "nodes": 1, "gpus_per_node": 1,
                           "intra": {"name": "l", "bandwidth_Bps": -1, "latency_s": 0},
                           "inter": {"name": "n", "bandwidth_Bps": 1, "latency_s": 0}})
