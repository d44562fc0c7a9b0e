"""``--profile FILE`` on simulate, plan and costs: a cost profile written by
``merak-sim calibrate`` (:mod:`merak_sim.costs.profiles`). Its fitted efficiency
replaces the shipped calibration on the GPU family it was fitted on; a cluster of
another family, or a file that is not a profile, is one line with exit status 2."""

from __future__ import annotations

from collections.abc import Callable

import click

from merak_sim.costs.profiles import CostProfile, read_profile

__all__ = ["PROFILE_HELP", "load_profile", "profile_option"]

PROFILE_HELP = ("Cost profile (merak-cost-profile/1, written by merak-sim calibrate): its "
                "fitted efficiency replaces the shipped calibration on its GPU family.")


def profile_option(f: Callable) -> Callable:
    """The ``--profile FILE`` option (parameter ``profile_file``)."""
    return click.option("--profile", "profile_file", type=click.Path(dir_okay=False),
                        default=None, help=PROFILE_HELP)(f)


def load_profile(path: str | None) -> CostProfile | None:
    """The profile of ``--profile`` (None without one); a bad file is a one-line
    ProfileError."""
    return None if path is None else read_profile(path)
