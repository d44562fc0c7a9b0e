"""Plan files: the chosen configuration, written by the planner, read by dispatch and
by the real backend (merak_exec).

Format ``merak-plan/1`` (JSON)::

    {"format": "merak-plan/1",
     "model": {"family": "gpt", "layers": 24, "hidden": 1024, ...},   # or {"preset": "gpt-1.5b"}
     "cluster": {"preset": "paper-3090", "nodes": 16},                  # or a cluster JSON dict
     "parallel": {...ParallelConfig.to_dict()...},
     "predicted": {"iteration_time_s": ..., ...},                       # optional
     "provenance": {"tool": "merak-sim plan", "version": "...", "date": "..."}}

A file of another format version, or one edited into an invalid state, is rejected
with a one-line :class:`PlanError` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merak_sim.config import ParallelConfig
from merak_sim.io import atomic_write_text
from merak_sim.sim.from_config import schedule_for

__all__ = ["Plan", "PlanError", "PLAN_FORMAT"]

PLAN_FORMAT = "merak-plan/1"


class PlanError(ValueError):
    """A plan file is unreadable, of another version, or invalid (names the field)."""


@dataclass(frozen=True)
class Plan:
    """A parallel configuration bound to a model and a cluster.

    Attributes:
        model: the model as a JSON dict (the ModelSpec JSON contract, or
            ``{"preset": NAME}``).
        cluster: ``{"preset": NAME, "nodes": N}`` or a cluster JSON dict.
        parallel: the validated parallel configuration.
        predicted: simulator predictions for this plan (iteration time, memory, ...).
        provenance: who wrote the plan, when, with which version.
    """

    model: dict[str, Any]
    cluster: dict[str, Any]
    parallel: ParallelConfig
    predicted: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict in the ``merak-plan/1`` format."""
        return {
            "format": PLAN_FORMAT,
            "model": self.model,
            "cluster": self.cluster,
            "parallel": self.parallel.to_dict(),
            "predicted": self.predicted,
            "provenance": self.provenance,
        }

    def save(self, path: str | Path) -> None:
        """Write the plan atomically."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @staticmethod
    def from_dict(d: Any) -> Plan:
        """Parse and validate a plan dict; :class:`PlanError` names the bad field."""
        if not isinstance(d, dict):
            raise PlanError("plan must be a JSON object")
        fmt = d.get("format")
        if fmt != PLAN_FORMAT:
            raise PlanError(
                f"plan field 'format' is {fmt!r}, expected {PLAN_FORMAT!r} (a plan from "
                "another version: re-run `merak-sim plan`)"
            )
        for key in ("model", "cluster", "parallel"):
            if key not in d:
                raise PlanError(f"plan is missing field {key!r}")
            if not isinstance(d[key], dict):
                raise PlanError(f"plan field {key!r} must be a JSON object")
        try:
            parallel = ParallelConfig.from_dict(d["parallel"])
        except (TypeError, ValueError) as e:
            raise PlanError(f"plan field 'parallel' is invalid: {e}") from None
        try:
            schedule_for(parallel)
        except ValueError as e:
            raise PlanError(f"plan field 'parallel.schedule' is invalid: {e}") from None
        for key in ("predicted", "provenance"):
            if not isinstance(d.get(key, {}), dict):
                raise PlanError(f"plan field {key!r} must be a JSON object")
        return Plan(
            model=d["model"],
            cluster=d["cluster"],
            parallel=parallel,
            predicted=d.get("predicted", {}),
            provenance=d.get("provenance", {}),
        )

    @staticmethod
    def load(path: str | Path) -> Plan:
        """Read a plan file; :class:`PlanError` for missing, malformed or invalid files."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise PlanError(f"cannot read plan file {p}: {e.strerror}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan file {p} is not valid JSON: {e}") from None
        return Plan.from_dict(d)
