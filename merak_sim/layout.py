"""Rank layout: the one map between global ranks and parallel coordinates.

A job of ``dp * cp * tp * pp`` GPUs gives every global rank four coordinates
(pipeline, data, tensor and context parallel index). The default order is Megatron's,
written fastest first: ``"tp-cp-dp-pp"``: tensor-parallel peers are consecutive ranks
(one node, fast links whenever tp divides the GPUs per node), pipeline peers lie
``dp * cp * tp`` ranks apart::

    rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx

With ``cp = 1`` this is ``(pp_idx * dp + dp_idx) * tp + tp_idx``.

Another order (``ParallelConfig.order``, ``--order`` on the command line) puts other
peers side by side: ``"dp-tp-cp-pp"`` keeps data-parallel replicas in a node and spreads
each tensor-parallel group over nodes. The cost models price each group kind of a stage
by the group of the stage's first rank; with degrees and GPUs per node that are powers
of two, every group of one kind then spans the same number of nodes with the same GPUs
per node, so that group stands for all of them.

Groups: the ranks that differ only in one coordinate ("tp", "cp", "dp", "pp"), and
"tied": the first and the last pipeline rank of one (dp, cp, tp) slice, which hold the
two copies of a tied word embedding. Every group lists its ranks in increasing order of
the varying coordinate, and :meth:`RankLayout.groups` lists groups in increasing order of
their first rank, the same on every process (torch.distributed needs every process to
create every group in one order).

Which node a rank is on is a fact of the launch (ranks fill a node before the next):
:func:`node_of`; which NVLink domain (a whole number of nodes: one HGX node, or the 18
trays of a GB200 / GB300 NVL72 rack) it is in: :func:`domain_of`. A group is priced on
NVLink when its ranks share a domain, whatever nodes they are on.

Expert layers (mixture of experts) fold their own degrees over the same ranks
(Megatron-core's parallel folding, Liu et al. 2025, "MoE Parallel Folding",
arXiv:2504.14960): the ``tp * cp * dp`` ranks of one pipeline stage, taken in increasing
rank order (inner index i), are split fastest first into expert-tensor (``etp``),
expert (``ep``) and expert-data (``edp = tp * cp * dp / (etp * ep)``) coordinates::

    i = (edp_idx * ep + ep_idx) * etp + etp_idx

so with Megatron's order and ``etp = 1`` an expert-parallel group is ``ep`` consecutive
ranks (in a node while ep divides the GPUs per node). Their groups are the kinds of
:data:`EXPERT_KINDS`; ``etp * ep`` must divide ``tp * cp * dp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["AXES", "DEFAULT_ORDER", "EXPERT_KINDS",  # noqa: RUF022 (grouped)
           "GROUP_KINDS", "Coords", "RankLayout", "domain_of",
           "layout_key", "node_of"]

AXES = ("tp", "cp", "dp", "pp")
GROUP_KINDS = (*AXES, "tied")
#: Group kinds of the expert layers (module docstring: parallel folding).
EXPERT_KINDS = ("etp", "ep", "edp")
#: Megatron's placement, fastest varying first (module docstring).
DEFAULT_ORDER = "tp-cp-dp-pp"


class Coords(NamedTuple):
    """Parallel coordinates of one global rank."""

    pp: int
    dp: int
    tp: int
    cp: int = 0


def layout_key(config: Any) -> tuple[int, int, int, int, str] | None:
    """``(dp, tp, pp, cp, order)`` of ``config`` (cp 1 and Megatron's order where it has
    none) when the degrees are plain ints and the order a str, else None: the memo key
    of the layout's groups, which a value the layout would reject never enters."""
    key = (config.dp, config.tp, config.pp, getattr(config, "cp", 1),
           getattr(config, "order", DEFAULT_ORDER))
    if all(type(x) is int for x in key[:4]) and type(key[4]) is str:
        return key
    return None


def node_of(rank: int, gpus_per_node: int) -> int:
    """Node index of global ``rank`` when ranks fill a node before the next."""
    return rank // gpus_per_node


def domain_of(rank: int, domain_size: int) -> int:
    """NVLink-domain index of global ``rank`` when ranks fill a domain of
    ``domain_size`` GPUs (whole nodes, filled in node order) before the next."""
    return rank // domain_size


@dataclass(frozen=True, slots=True)
class RankLayout:
    """Degrees of a dp x cp x tp x pp job and the placement of its ranks.

    Attributes:
        dp, tp, pp: data-, tensor- and pipeline-parallel degrees.
        cp: context-parallel degree (1: none).
        order: the four axes joined by "-", fastest varying first.

    Raises ValueError (naming the values) on a degree below 1 or an order that is not a
    permutation of tp, cp, dp, pp.
    """

    dp: int
    tp: int
    pp: int
    cp: int = 1
    order: str = DEFAULT_ORDER
    ep: int = 1
    etp: int = 1
    _stride: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        degrees = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        for name, v in degrees.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.order, str):
            raise ValueError(f"order must be a string such as {DEFAULT_ORDER!r}, got "
                             f"{self.order!r}")
        axes = self.order.split("-")
        if len(axes) != len(AXES) or set(axes) != degrees.keys():
            raise ValueError(f"order must list tp, cp, dp and pp once each joined by '-' "
                             f"(fastest first, e.g. {DEFAULT_ORDER!r}), got {self.order!r}")
        stride, step = {}, 1
        for a in axes:
            stride[a] = step
            step *= degrees[a]
        # Strides in Coords field order (pp, dp, tp, cp).
        object.__setattr__(self, "_stride",
                           (stride["pp"], stride["dp"], stride["tp"], stride["cp"]))
        self._check_folding()

    def _check_folding(self) -> None:
        for name in ("ep", "etp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        inner = self.tp * self.cp * self.dp
        if inner % (self.ep * self.etp):
            raise ValueError(
                f"expert folding: etp x ep = {self.etp} x {self.ep} does not divide the "
                f"tp x cp x dp = {inner} ranks of a pipeline stage (choose ep and etp whose "
                "product divides them)")

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: tp * cp * dp / (etp * ep)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def _inner(self, rank: int) -> tuple[int, list[tuple[int, int]]]:
        """(index of ``rank`` among its pipeline stage's ranks in rank order, the
        (stride, degree) of the non-pipeline axes fastest first)."""
        c = self.coords(rank)
        axes = [(a, getattr(self, a)) for a in self.order.split("-") if a != "pp"]
        strides = [(self._stride[Coords._fields.index(a)], n) for a, n in axes]
        i, mult = 0, 1
        for (a, n) in axes:
            i += getattr(c, a) * mult
            mult *= n
        return i, strides

    def expert_group(self, kind: str, rank: int) -> tuple[int, ...]:
        """Global ranks of the expert ``kind`` group (:data:`EXPERT_KINDS`) holding
        ``rank``, in increasing order of its varying coordinate (module docstring)."""
        if kind not in EXPERT_KINDS:
            raise ValueError(f"unknown expert group kind {kind!r}; choose one of "
                             f"{', '.join(EXPERT_KINDS)}")
        i, strides = self._inner(rank)
        base = self.coords(rank).pp * self._stride[0]  # inner index 0 of the stage
        step = {"etp": 1, "ep": self.etp, "edp": self.etp * self.ep}[kind]
        n_k = {"etp": self.etp, "ep": self.ep, "edp": self.edp}[kind]
        first = i - ((i // step) % n_k) * step
        out = []
        for j in range(first, first + n_k * step, step):
            r, rest = base, j
            for (st, n) in strides:
                r += (rest % n) * st
                rest //= n
            out.append(r)
        return tuple(out)

    @classmethod
    def of(cls, config: Any) -> RankLayout:
        """The layout of a :class:`merak_sim.config.ParallelConfig` (or any object with
        ``dp``, ``tp`` and ``pp``, and optionally ``cp`` and ``order``)."""
        return cls(config.dp, config.tp, config.pp, getattr(config, "cp", 1),
                   getattr(config, "order", DEFAULT_ORDER), getattr(config, "ep", 1),
                   getattr(config, "etp", 1))

    @property
    def world_size(self) -> int:
        """dp * cp * tp * pp."""
        return self.dp * self.cp * self.tp * self.pp

    def degree(self, kind: str) -> int:
        """Size of a ``kind`` group (see :data:`GROUP_KINDS`)."""
        if kind == "tied":
            return 2 if self.pp > 1 else 1
        if kind not in AXES:
            raise ValueError(f"unknown group kind {kind!r}; choose one of "
                             f"{', '.join(GROUP_KINDS)}")
        return getattr(self, kind)

    def rank(self, pp: int, dp: int = 0, tp: int = 0, cp: int = 0) -> int:
        """Global rank of the given coordinates."""
        if not (0 <= pp < self.pp and 0 <= dp < self.dp and 0 <= tp < self.tp
                and 0 <= cp < self.cp):
            for name, v in zip(Coords._fields, (pp, dp, tp, cp), strict=True):
                n = getattr(self, name)
                if not 0 <= v < n:
                    raise ValueError(f"{name} index {v} outside 0..{n - 1} of layout {self}")
        s = self._stride
        return pp * s[0] + dp * s[1] + tp * s[2] + cp * s[3]

    def coords(self, rank: int) -> Coords:
        """Coordinates of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1} of layout {self}")
        s = self._stride
        return Coords((rank // s[0]) % self.pp, (rank // s[1]) % self.dp,
                      (rank // s[2]) % self.tp, (rank // s[3]) % self.cp)

    def group(self, kind: str, rank: int) -> tuple[int, ...]:
        """Global ranks of the ``kind`` group that contains ``rank``, in increasing
        order of the coordinate that varies (for "tied": first, then last pipeline
        rank; a single rank when pp = 1)."""
        n = self.degree(kind)
        c = self.coords(rank)
        if kind == "tied":
            first = rank - c.pp * self._stride[0]
            return tuple(dict.fromkeys((first, first + (self.pp - 1) * self._stride[0])))
        step = self._stride[Coords._fields.index(kind)]
        first = rank - getattr(c, kind) * step
        return tuple(range(first, first + n * step, step))

    def groups(self, kind: str) -> tuple[tuple[int, ...], ...]:
        """Every ``kind`` group, in increasing order of its first rank: they partition
        the world (for "tied": the pipeline's first-stage ranks with their partners)."""
        self.degree(kind)
        seen: dict[int, tuple[int, ...]] = {}
        for r in range(self.world_size):
            g = self.group(kind, r)
            seen.setdefault(g[0], g)
        return tuple(seen[k] for k in sorted(seen))
