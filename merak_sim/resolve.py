"""Model and cluster arguments -> values: the one reading of what a user may pass.

``simulate`` and the planner both take a model as a preset name, a JSON file or dict,
or a :class:`~merak_sim.model.ModelSpec`, and a cluster as a preset name, a JSON file
or dict, or a :class:`~merak_sim.hardware.Cluster`, optionally resized to ``nodes``.
"""

from __future__ import annotations

from typing import Any

from merak_sim.hardware import Cluster, get_cluster
from merak_sim.model import ModelSpec, get_model

__all__ = ["resolve_model", "resolve_cluster", "cluster_record"]


def resolve_model(model: Any) -> ModelSpec:
    """A ModelSpec from a ModelSpec, a preset name, a JSON file / dict, or a plan
    file's ``{"preset": NAME}`` record."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict) and set(model) == {"preset"}:
        return get_model(model["preset"])
    return get_model(model)


def resolve_cluster(cluster: Any, nodes: int | None = None) -> Cluster:
    """A Cluster from a Cluster, a preset name, or a JSON file / dict, with ``nodes``
    nodes when given (default: the preset's or the value's own)."""
    if isinstance(cluster, Cluster):
        return cluster if nodes is None else cluster.with_nodes(nodes)
    return get_cluster(cluster, nodes=nodes)


def cluster_record(cluster: Cluster) -> dict[str, Any]:
    """The cluster as a plan file records it: ``{"preset": NAME, "nodes": N}`` when it
    is that preset at N nodes (however it was given), else its full JSON dict."""
    try:
        if get_cluster(cluster.name, nodes=cluster.nodes) == cluster:
            return {"preset": cluster.name, "nodes": cluster.nodes}
    except ValueError:  # not a preset name
        pass
    return cluster.to_dict()
