"""The what-if flags of ``merak-sim simulate`` checked against the run they change.

``--slow-gpu RANK:FACTOR`` and ``--degrade-link LINK:FACTOR`` name GPUs and links; a
name the run does not have would change nothing and report the healthy time, so every
name is checked against the ranks the run places (``gpu<R>.out`` / ``gpu<R>.in`` for
R below dp x tp x pp x cp, ``node<N>.nic.out`` / ``node<N>.nic.in`` for the nodes those
ranks fill) before any work. Each GPU and each link may be named once: a second
factor for the same name is refused rather than silently replacing the first (give
the product instead). Factors are finite and positive.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["WhatIfError", "WhatIfs", "parse_what_ifs"]

_LINK = re.compile(r"^(?:gpu(\d+)\.(?:out|in)|node(\d+)\.nic\.(?:out|in))$")


class WhatIfError(ValueError):
    """A what-if flag names something the run does not have, twice, or a bad factor
    (one line naming the flag and the fix)."""


@dataclass(frozen=True)
class WhatIfs:
    """Checked what-ifs: compute slowdown per rank and capacity factor per link."""

    slowdown: dict[int, float]
    degraded_links: dict[str, float]


def _split(flag: str, value: str) -> tuple[str, float]:
    key, sep, text = value.rpartition(":")
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not sep or not key or not math.isfinite(factor) or factor <= 0:
        what = "RANK" if flag == "--slow-gpu" else "LINK"
        raise WhatIfError(f"{flag} takes {what}:FACTOR with a finite FACTOR > 0, got "
                          f"{value!r}")
    return key, factor


def _once(flag: str, pairs: list[tuple[str, float]], what: str) -> None:
    seen: dict[str, float] = {}
    for key, factor in pairs:
        if key in seen:
            raise WhatIfError(f"{flag} names {what} {key} twice ({key}:{seen[key]:g} and "
                              f"{key}:{factor:g}); give each once (the product for a "
                              "combined factor)")
        seen[key] = factor


def parse_what_ifs(slow_gpu: tuple[str, ...], degrade_link: tuple[str, ...], *,
                   world_size: int, gpus_per_node: int, mode: str) -> WhatIfs:
    """The checked what-ifs of a run of ``world_size`` ranks placed on nodes of
    ``gpus_per_node`` GPUs (module docstring); ``mode`` must be "full" when any is
    given."""
    if (slow_gpu or degrade_link) and mode != "full":
        raise WhatIfError("--slow-gpu and --degrade-link change single GPUs and links, "
                          "which only --mode full simulates: add --mode full")
    nodes = -(-world_size // gpus_per_node)
    slow = [_split("--slow-gpu", v) for v in slow_gpu]
    _once("--slow-gpu", slow, "GPU")
    slowdown = {}
    for key, factor in slow:
        if not key.isdigit() or int(key) >= world_size:
            raise WhatIfError(f"--slow-gpu {key}:{factor:g}: no GPU {key} in this run; its "
                              f"ranks are 0-{world_size - 1}")
        slowdown[int(key)] = factor
    links = [_split("--degrade-link", v) for v in degrade_link]
    _once("--degrade-link", links, "link")
    for key, factor in links:
        m = _LINK.match(key)
        bad = m is None or (m.group(1) is not None and int(m.group(1)) >= world_size) or (
            m.group(2) is not None and int(m.group(2)) >= nodes)
        if bad:
            raise WhatIfError(
                f"--degrade-link {key}:{factor:g}: no link {key} in this run; its links "
                f"are gpu<R>.out|in for R in 0-{world_size - 1} and node<N>.nic.out|in "
                f"for N in 0-{nodes - 1}")
    return WhatIfs(slowdown, dict(links))
