"""Cost profiles: fitted efficiency constants in a file, each with the command that
rebuilt it.

A profile file (``merak-cost-profile/1``, JSON) is what ``merak-sim calibrate`` writes
and what ``--profile FILE`` on ``simulate``, ``plan`` and ``costs`` reads::

    {"format": "merak-cost-profile/1",
     "gpu": "A100",                       # the GPU family it describes (gpu_family)
     "parameters": {"gemm_max": 0.8, ...}, # Efficiency / KernelEfficiency fields
     "command": "merak-sim calibrate ...", # how it was made
     "fit": {...}}                        # the fit's record: rows, bounds, errors

``parameters`` names fields of :class:`~merak_sim.costs.efficiency.Efficiency` (the
GEMM / memory curve) or :class:`~merak_sim.costs.kernels.KernelEfficiency` (the
attention kernels); a field a profile lacks keeps the GPU's published default. The
shipped profiles live beside this module (:data:`SHIPPED`); the file is the one
place their values are written, so a rebuild shows up as a diff of the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from merak_sim.costs.efficiency import Efficiency, default_efficiency
from merak_sim.costs.kernels import KernelEfficiency, default_kernels

__all__ = ["PROFILE_FORMAT", "SHIPPED", "CostProfile", "ProfileError", "gpu_family",
           "read_profile", "shipped_profile"]

PROFILE_FORMAT = "merak-cost-profile/1"
#: The profiles shipped with the package: name -> file beside this module.
SHIPPED: dict[str, Path] = {"a100": Path(__file__).with_name("a100.json")}

_EFFICIENCY = tuple(f.name for f in fields(Efficiency))
_KERNELS = tuple(f.name for f in fields(KernelEfficiency))


class ProfileError(ValueError):
    """A profile file is missing, of another format or malformed (one line)."""


def gpu_family(gpu_name: str) -> str:
    """The name a profile keys its GPU by: ``A100`` for every A100 preset (40 and 80 GB
    share the die), ``Hopper`` for H100 / H200 / GH200, else the preset name."""
    if gpu_name.startswith("A100"):
        return "A100"
    if gpu_name.startswith(("H100", "H200", "GH200")):
        return "Hopper"
    return gpu_name


@dataclass(frozen=True)
class CostProfile:
    """Fitted efficiency parameters of one GPU family (module docstring).

    Attributes:
        gpu: the GPU family (:func:`gpu_family`) the values describe.
        parameters: Efficiency / KernelEfficiency field -> fitted value.
        command: the command that produced the file.
        fit: the fit's record (rows, bounds, start, stopping rule, errors).
    """

    gpu: str
    parameters: Mapping[str, float] = field(hash=False)
    command: str = ""
    fit: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.parameters) - set(_EFFICIENCY) - set(_KERNELS))
        if unknown:
            raise ProfileError(f"unknown profile parameter(s) {', '.join(unknown)}; known: "
                               f"{', '.join(_EFFICIENCY + _KERNELS)}")
        for k, v in self.parameters.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ProfileError(f"profile parameter {k} must be a finite number, got {v!r}")
        self.efficiency_for(None)  # Efficiency's own range checks, now rather than later

    def matches(self, gpu_name: str) -> bool:
        """Whether the profile describes ``gpu_name``'s family."""
        return gpu_family(gpu_name) == self.gpu

    def efficiency_for(self, gpu_name: str | None
                       ) -> tuple[Efficiency, KernelEfficiency | None]:
        """(efficiency, kernel efficiency or None when the profile sets no kernel field)
        on ``gpu_name``: its published defaults with the profile's values over them.
        None checks the values against the A100 defaults; a GPU of another family is a
        one-line ProfileError naming the fix."""
        if gpu_name is not None and not self.matches(gpu_name):
            raise ProfileError(f"the cost profile describes {self.gpu} GPUs, the cluster has "
                               f"{gpu_name}; give a profile calibrated on {gpu_family(gpu_name)} "
                               "runs (merak-sim calibrate) or drop --profile")
        gpu = gpu_name or "A100-80GB"
        eff_values = {k: float(v) for k, v in self.parameters.items() if k in _EFFICIENCY}
        kern_values = {k: v for k, v in self.parameters.items() if k in _KERNELS}
        try:
            eff = default_efficiency(gpu).with_(**eff_values)
            kern = replace(default_kernels(gpu), **kern_values) if kern_values else None
        except ValueError as e:
            raise ProfileError(f"cost profile: {e}") from None
        return eff, kern

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"format": PROFILE_FORMAT, "gpu": self.gpu, "parameters": dict(self.parameters),
                "command": self.command, "fit": dict(self.fit)}

    def to_json(self) -> str:
        """The file's text (stable: the same profile gives the same bytes)."""
        return json.dumps(self.to_dict(), indent=1) + "\n"


def read_profile(path: str | Path) -> CostProfile:
    """A profile file (module docstring); a missing, foreign or malformed file is a
    one-line ProfileError naming the file and the fix."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"cost profile {path}: no such file; write one with "
                           "merak-sim calibrate") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"cost profile {path}: not a readable JSON file ({e})") from None
    if not isinstance(d, dict) or d.get("format") != PROFILE_FORMAT:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise ProfileError(f"cost profile {path}: format {got!r}, expected {PROFILE_FORMAT!r} "
                           "(a file written by merak-sim calibrate)")
    if not isinstance(d.get("gpu"), str) or not isinstance(d.get("parameters"), dict):
        raise ProfileError(f"cost profile {path}: needs a \"gpu\" name and a \"parameters\" "
                           "object")
    try:
        return CostProfile(d["gpu"], d["parameters"], str(d.get("command", "")),
                           d.get("fit") if isinstance(d.get("fit"), dict) else {})
    except ProfileError as e:
        raise ProfileError(f"cost profile {path}: {e}") from None


def shipped_profile(name: str) -> CostProfile:
    """A profile shipped with the package (:data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise ProfileError(f"no shipped cost profile {name!r}; choose one of: "
                           f"{', '.join(SHIPPED)}")
    return read_profile(SHIPPED[name])
