"""One measured run as the calibration sees it: what ran and how long a step took."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from merak_sim.config import ParallelConfig
    from merak_sim.hardware import Cluster
    from merak_sim.model import ModelSpec

__all__ = ["MeasuredRun", "RunsError"]


class RunsError(ValueError):
    """A runs file or run folder cannot be read (one line: where, what, the fix)."""


@dataclass(frozen=True)
class MeasuredRun:
    """A measured training run.

    Attributes:
        label: where it comes from (``file:line`` or the run folder).
        model, cluster, config: what ran (the cluster sized to the run's GPUs).
        step_time_s: measured seconds per training step (iteration).
        stack: the software stack that ran it (:data:`merak_sim.calibrate.stacks.STACKS`).
    """

    label: str
    model: ModelSpec
    cluster: Cluster
    config: ParallelConfig
    step_time_s: float
    stack: str = "default"
