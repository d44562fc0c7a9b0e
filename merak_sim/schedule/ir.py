"""The schedule IR shared by the simulator (merak_sim) and the real backend (merak_exec).

A :class:`Schedule` is one program per pipeline rank: a tuple of *steps*. A step is
either a single :class:`Action` or a :class:`Fused` group of communication actions
posted together at one point (how the runtime posts each operation on NCCL is
:mod:`merak_sim.schedule.posting`).

Communication semantics (the one place they are written down; both back ends obey
them, and :func:`merak_sim.schedule.validate.validate` proves schedules safe under them)
-------------------------------------------------------------------------------------
1. Each rank runs its program strictly in order. Compute actions (F, F*, R, B, I, W,
   AR, OPT) run one after another on the rank's compute stream.
2. Sends and receives are *posted* asynchronously when the program reaches them;
   posting takes no time and never blocks the program. A send's data is the output
   of compute that precedes it in program order.
3. A transfer starts when both its send and its matching receive are posted and
   completes one transfer time later; the send and the receive complete together.
4. A compute action waits only for the receive it consumes: F/F* wait for their
   ``rA``, B/I for their ``rG``; R and W consume nothing remote (R re-forwards from
   the input F* kept). This is what lets "R3 rG3 B3" overlap the re-forward with the
   gradient in flight. A :class:`Fused` group is posted at one point (the runtime
   posts one batch per operation, :mod:`merak_sim.schedule.posting`); its consumer
   still waits only for its own receive, and a send's completion is awaited only
   before its buffer is freed at the end.
5. Matching is by tag: the activation of micro-batch m leaving global virtual stage
   g is received by g+1; its gradient goes back from g+1 to g. Which rank holds model
   stage g is the schedule's *placement* (:meth:`Schedule.rank_of`): ``"loop"`` puts
   chunk c of rank r at g = c*S + r (chunks wrap from the last rank to the first),
   ``"v"`` (two chunks) puts chunk 0 at g = r and chunk 1 at g = 2S-1-r, so the model
   runs down the ranks and back up. When g and g+1 sit on the same rank (model stages
   S-1 and S under ``"v"``) the hand-off is *local*: no send or receive, and program
   order alone orders the producer before its consumer. Between any ordered
   pair of ranks, sends of one tensor kind (activations, or gradients: one *channel*
   with its own communicator, :mod:`merak_sim.schedule.posting`) must be posted in
   the same order as the peer posts the matching receives (NCCL matches
   point-to-point operations by order, not tag).
6. ``AR`` (gradient all-reduce) and ``OPT`` (optimizer step) end each rank's
   program. AR involves the rank's data-parallel peers, which run the identical
   program, and on the ranks holding the first and the last model stage of a model
   whose word embedding is tied to its LM head across them, the other of those two
   ranks: AR first sums the tied weight's gradients between them, so their AR is a
   two-rank collective that both must reach before either passes it (the earlier
   waits). Under ``"loop"`` these are ranks 0 and S-1; under ``"v"`` both model stages
   live on rank 0, the tie is local and no AR waits on another pipeline rank
   (:meth:`Schedule.tied_ranks`). No other AR or OPT waits on another pipeline rank.
   Because AR and OPT end
   every program, this rendezvous cannot deadlock a schedule that rules 1-5 make safe.

Tokens
------
Every action has a one-token string form that parses back to an equal action:
``F3`` forward, ``F*3`` forward without grad (Merak's F*: keeps only the stage input
and RNG state), ``R3`` re-forward (recompute), ``B3`` backward, ``I3`` / ``W3`` the
zero-bubble backward-input / backward-weight halves, ``sA3``/``rA3`` send/receive
activation, ``sG3``/``rG3`` send/receive gradient, ``AR``, ``OPT``. A chunk (virtual
stage) other than 0 is written as a prefix: ``1F3``, ``1sA3``. A fused group joins its
parts with ``/`` (``sA3/rG0``); the bracketed form ``[sA3/rG0]`` of the reference is
also accepted.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from merak_sim.schedule.placement import PLACEMENTS, placed_rank, placed_stage

__all__ = ["Kind", "Action", "ActionTwin", "make_action", "Fused", "FusedTwin",
           "make_fused", "Step", "Schedule", "ScheduleError", "parse_step", "parse_program",
           "format_program", "iter_actions"]


class ScheduleError(ValueError):
    """A schedule, token or generator argument is invalid (message names the problem)."""


class Kind(enum.Enum):
    """What an :class:`Action` does. The value is the token's letter code."""

    FORWARD = "F"
    FORWARD_NOGRAD = "F*"
    RECOMPUTE = "R"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_ACT = "sA"
    RECV_ACT = "rA"
    SEND_GRAD = "sG"
    RECV_GRAD = "rG"
    ALL_REDUCE = "AR"
    OPTIMIZER = "OPT"

    # The predicates below are read in every pass over every action, so they are
    # plain attributes set once per member (after the class body) rather than
    # set-membership tests that hash the member each time.
    is_compute: bool  #: occupies the compute stream
    is_comm: bool  #: a point-to-point send or receive
    is_send: bool  #: sA or sG
    is_recv: bool  #: rA or rG
    per_microbatch: bool  #: False only for the once-per-iteration AR and OPT
    code: int  #: the member's position (0 ..): indexes per-kind lists in hot loops


_COMM_KINDS = frozenset({Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD})
for _i, _k in enumerate(Kind):
    _k.code = _i
    _k.is_comm = _k in _COMM_KINDS
    _k.is_compute = not _k.is_comm
    _k.is_send = _k in (Kind.SEND_ACT, Kind.SEND_GRAD)
    _k.is_recv = _k in (Kind.RECV_ACT, Kind.RECV_GRAD)
    _k.per_microbatch = _k not in (Kind.ALL_REDUCE, Kind.OPTIMIZER)
del _i, _k

# chunk prefix, kind code, micro-batch. Longest codes first so "F*" wins over "F".
_TOKEN_RE = re.compile(r"^(\d*)(F\*|OPT|AR|sA|rA|sG|rG|F|R|B|I|W)(\d*)$")
_BY_CODE = {k.value: k for k in Kind}


@dataclass(frozen=True, slots=True, order=True, init=False)
class Action:
    """One instruction of a rank's program.

    Attributes:
        kind: what the action does.
        stage: the pipeline rank (physical stage) that runs it, 0-based.
        microbatch: micro-batch index, or -1 for AR/OPT.
        chunk: virtual-stage index on this rank (interleaved schedules), else 0. The
            model stage it belongs to follows the schedule's placement
            (:meth:`Schedule.model_stage`).
    """

    kind: Kind
    stage: int
    microbatch: int = -1
    chunk: int = 0

    # Built as make_action builds it (which hot loops call directly, one call less).
    def __new__(cls, kind: Kind, stage: int, microbatch: int = -1, chunk: int = 0
                ) -> Action:
        return make_action(kind, stage, microbatch, chunk)

    def __getnewargs__(self) -> tuple[Kind, int, int, int]:
        """What pickling and copying rebuild the action from (:meth:`__new__`)."""
        return (self.kind, self.stage, self.microbatch, self.chunk)

    def _invalid(self) -> None:
        if self.stage < 0 or self.chunk < 0:
            raise ScheduleError(f"action has negative stage {self.stage} or chunk {self.chunk}")
        if self.kind.per_microbatch:
            raise ScheduleError(f"{self.kind.name} needs a micro-batch index >= 0")
        raise ScheduleError(f"{self.kind.value} takes no micro-batch index")

    def __str__(self) -> str:
        prefix = str(self.chunk) if self.chunk else ""
        mb = str(self.microbatch) if self.kind.per_microbatch else ""
        return f"{prefix}{self.kind.value}{mb}"

    @property
    def parts(self) -> tuple[Action, ...]:
        """The actions posted by this step: just itself (see :attr:`Fused.parts`)."""
        return (self,)

    @staticmethod
    def parse(token: str, stage: int) -> Action:
        """Parse one token such as ``"1F*3"`` on pipeline rank ``stage``."""
        m = _TOKEN_RE.match(token.strip())
        if not m:
            raise ScheduleError(
                f"malformed action token {token!r}: expected e.g. F3, F*3, R3, B3, I3, W3, "
                "sA3, rG3, AR, OPT, with an optional chunk prefix like 1F3"
            )
        chunk_s, code, mb_s = m.groups()
        kind = _BY_CODE[code]
        if kind.per_microbatch and not mb_s:
            raise ScheduleError(f"action token {token!r} is missing its micro-batch number")
        if not kind.per_microbatch and (mb_s or chunk_s):
            raise ScheduleError(f"action token {token!r}: {code} takes no numbers")
        return Action(kind, stage, int(mb_s) if mb_s else -1, int(chunk_s) if chunk_s else 0)


_NEW = object.__new__


class ActionTwin:
    """:class:`Action`'s slots without its frozen ``__setattr__`` (for
    :func:`make_action` and :mod:`merak_sim.schedule.unchecked`): set kind, stage,
    microbatch and chunk, then ``__class__ = Action``."""

    __slots__ = Action.__slots__


def make_action(kind: Kind, stage: int, microbatch: int = -1, chunk: int = 0) -> Action:
    """``Action(kind, stage, microbatch, chunk)``, checked as it is, at the cost of
    one plain function call (for the generators' and the lowering's loops)."""
    # Frozen Action refuses assignment: the fields go to a twin with the same slots
    # (plain stores, the cheapest there are), which then becomes an Action; half the
    # cost of setting slot descriptors. A valid action passes one comparison chain.
    self = _NEW(ActionTwin)
    self.kind = kind
    self.stage = stage
    self.microbatch = microbatch
    self.chunk = chunk
    self.__class__ = Action
    if stage < 0 or chunk < 0 or (microbatch < 0 if kind.per_microbatch
                                  else microbatch != -1):
        self._invalid()
    return self


class FusedTwin:
    """:class:`Fused`'s slots without its frozen ``__setattr__`` (for
    :func:`make_fused` and :mod:`merak_sim.schedule.unchecked`): set parts, then
    ``__class__ = Fused``."""

    __slots__ = ("parts",)


@dataclass(frozen=True, slots=True, init=False)
class Fused:
    """Communication actions posted together as one batched posting (e.g. ``sA3/rG0``)."""

    parts: tuple[Action, ...]

    # Built as make_fused builds it (which the lowering calls directly: a plain call
    # costs far less than a class call through a Python __new__).
    def __new__(cls, parts: tuple[Action, ...]) -> Fused:
        return make_fused(parts)

    def __getnewargs__(self) -> tuple[tuple[Action, ...]]:
        """What pickling and copying rebuild the group from (:meth:`__new__`)."""
        return (self.parts,)

    def __str__(self) -> str:
        return "/".join(str(a) for a in self.parts)

Step = Action | Fused


def make_fused(parts: tuple[Action, ...]) -> Fused:
    """``Fused(parts)``, checked as it is, at the cost of one plain function call."""
    self = _NEW(FusedTwin)  # a twin, as make_action's
    self.parts = parts
    self.__class__ = Fused
    if len(parts) < 2:
        raise ScheduleError("a fused group needs at least two actions")
    for a in parts:
        if not a.kind.is_comm:
            raise ScheduleError(f"only sends and receives can be fused, not {a}")
    return self


def parse_step(token: str, stage: int) -> Step:
    """Parse a step token: one action, or a fused group ``a/b`` (brackets optional)."""
    t = token.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    pieces = t.split("/")
    if len(pieces) == 1:
        return Action.parse(pieces[0], stage)
    return Fused(tuple(Action.parse(p, stage) for p in pieces))


def parse_program(text: str, stage: int) -> tuple[Step, ...]:
    """Parse a whitespace-separated program such as ``"F0 sA0 F1 [sA1/rG0] B0"``."""
    return tuple(parse_step(tok, stage) for tok in text.split())


def format_program(program: tuple[Step, ...], brackets: bool = False) -> str:
    """Render a program as space-separated tokens (fused groups bracketed if asked)."""
    out = []
    for step in program:
        s = str(step)
        out.append(f"[{s}]" if brackets and isinstance(step, Fused) else s)
    return " ".join(out)


def iter_actions(program: tuple[Step, ...]) -> Iterator[Action]:
    """Yield every action of a program, fused groups flattened in order."""
    for step in program:
        yield from step.parts


@dataclass(frozen=True)
class Schedule:
    """Per-rank programs plus the metadata both back ends need.

    Attributes:
        name: generator name (``"1f1b"``, ``"shifted-critical-path"``, ...).
        num_stages: pipeline ranks S.
        num_microbatches: micro-batches M per iteration.
        virtual_stages: model chunks per rank v (1 unless interleaved).
        programs: one tuple of steps per rank.
        no_recompute_stages: ranks whose forwards keep all activations whatever the
            recompute policy says (Merak's last stage never recomputes).
        lowered: whether communication actions have been added.
        placement: where model stage g lives, ``"loop"`` or ``"v"``
            (:data:`~merak_sim.schedule.placement.PLACEMENTS`).
    """

    name: str
    num_stages: int
    num_microbatches: int
    virtual_stages: int
    programs: tuple[tuple[Step, ...], ...]
    no_recompute_stages: frozenset[int] = field(default_factory=frozenset)
    lowered: bool = True
    placement: str = "loop"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ScheduleError(f"placement {self.placement!r} is not one of "
                                f"{', '.join(PLACEMENTS)}")
        if self.placement == "v" and self.virtual_stages != 2:
            raise ScheduleError(f"placement 'v' needs virtual stages 2, got {self.virtual_stages}")
        if len(self.programs) != self.num_stages:
            raise ScheduleError(
                f"schedule has {len(self.programs)} programs for {self.num_stages} stages"
            )
        v = self.virtual_stages
        for rank, prog in enumerate(self.programs):
            # Every action of every schedule is checked, so the loop is inlined (a
            # generator per program costs more than the checks).
            for step in prog:
                if type(step) is Action:
                    if step.stage != rank or step.chunk >= v:
                        _misplaced(step, rank, v)
                else:
                    for a in step.parts:
                        if a.stage != rank or a.chunk >= v:
                            _misplaced(a, rank, v)

    @property
    def num_model_stages(self) -> int:
        """Model stages (S * v): how many pieces the layers are cut into."""
        return self.num_stages * self.virtual_stages

    def model_stage(self, a: Action) -> int:
        """Global virtual stage that ``a`` works on (:meth:`stage_of`)."""
        return self.stage_of(a.stage, a.chunk)

    def stage_of(self, rank: int, chunk: int) -> int:
        """Model stage held by chunk ``chunk`` of ``rank`` under the schedule's placement
        (:func:`~merak_sim.schedule.placement.placed_stage`)."""
        return placed_stage(self.placement, self.num_stages, rank, chunk)

    def rank_of(self, model_stage: int) -> tuple[int, int]:
        """(rank, chunk) that holds ``model_stage`` (inverse of :meth:`stage_of`)."""
        return placed_rank(self.placement, self.num_stages, model_stage)

    def is_local(self, model_stage: int) -> bool:
        """Whether model stages ``model_stage`` and ``model_stage + 1`` sit on one rank
        (their hand-off needs no send or receive)."""
        return self.rank_of(model_stage)[0] == self.rank_of(model_stage + 1)[0]

    def tied_ranks(self) -> tuple[int, ...]:
        """The distinct ranks holding the first and the last model stage (who sum a
        tied embedding's gradients): (0, S-1) under ``"loop"`` with S > 1, (0,) under
        ``"v"`` or with one rank."""
        return tuple(sorted({self.rank_of(0)[0], self.rank_of(self.num_model_stages - 1)[0]}))

    def num_actions(self) -> int:
        """Total number of actions over all ranks (fused groups counted per part)."""
        return sum(sum(len(s.parts) for s in p) for p in self.programs)

    def format(self, brackets: bool = True) -> str:
        """Human-readable per-rank listing."""
        return "\n".join(
            f"S{r}: {format_program(p, brackets)}" for r, p in enumerate(self.programs)
        )

    # -- persistence -------------------------------------------------------------
    def to_json(self) -> str:
        """Serialise as JSON (stable keys, one token string per rank)."""
        return json.dumps(
            {
                "format": "merak-schedule/1",
                "name": self.name,
                "num_stages": self.num_stages,
                "num_microbatches": self.num_microbatches,
                "virtual_stages": self.virtual_stages,
                "no_recompute_stages": sorted(self.no_recompute_stages),
                "lowered": self.lowered,
                "placement": self.placement,
                "programs": [format_program(p) for p in self.programs],
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str) -> Schedule:
        """Inverse of :meth:`to_json`; raises :class:`ScheduleError` on malformed input."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"schedule JSON is malformed: {e}") from None
        if not isinstance(d, dict) or d.get("format") != "merak-schedule/1":
            raise ScheduleError("schedule JSON lacks \"format\": \"merak-schedule/1\"")
        try:
            return Schedule(
                name=str(d["name"]),
                num_stages=int(d["num_stages"]),
                num_microbatches=int(d["num_microbatches"]),
                virtual_stages=int(d["virtual_stages"]),
                programs=tuple(parse_program(p, r) for r, p in enumerate(d["programs"])),
                no_recompute_stages=frozenset(int(x) for x in d.get("no_recompute_stages", [])),
                lowered=bool(d.get("lowered", True)),
                placement=str(d.get("placement", "loop")),
            )
        except KeyError as e:
            raise ScheduleError(f"schedule JSON is missing field {e.args[0]!r}") from None
        except (TypeError, AttributeError) as e:
            raise ScheduleError(f"schedule JSON has a field of the wrong type: {e}") from None

    def to_csv(self) -> str:
        """CSV: a header row, then one row per rank: rank followed by its step tokens."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(
            [
                f"# merak-schedule/1 name={self.name} S={self.num_stages} "
                f"M={self.num_microbatches} v={self.virtual_stages} "
                f"no_recompute={','.join(map(str, sorted(self.no_recompute_stages)))} "
                f"lowered={int(self.lowered)} placement={self.placement}"
            ]
        )
        for r, p in enumerate(self.programs):
            w.writerow([r, *(str(s) for s in p)])
        return buf.getvalue()

    @staticmethod
    def from_csv(text: str) -> Schedule:
        """Inverse of :meth:`to_csv`; raises :class:`ScheduleError` on malformed input."""
        rows = list(csv.reader(io.StringIO(text)))
        if not rows or not rows[0] or not rows[0][0].startswith("# merak-schedule/1"):
            raise ScheduleError("schedule CSV must start with a '# merak-schedule/1 ...' header")
        meta = dict(kv.split("=", 1) for kv in rows[0][0].split()[2:] if "=" in kv)
        try:
            S, M, v = int(meta["S"]), int(meta["M"]), int(meta["v"])
        except (KeyError, ValueError):
            raise ScheduleError("schedule CSV header needs integer S=, M= and v= fields") from None
        programs = []
        for i, row in enumerate(rows[1:]):
            if not row:
                continue
            if row[0].strip() != str(i):
                raise ScheduleError(f"schedule CSV row {i + 2} should start with rank {i}")
            programs.append(tuple(parse_step(tok, i) for tok in row[1:] if tok.strip()))
        nr = meta.get("no_recompute", "")
        return Schedule(
            name=meta.get("name", "custom"),
            num_stages=S,
            num_microbatches=M,
            virtual_stages=v,
            programs=tuple(programs),
            no_recompute_stages=frozenset(int(x) for x in nr.split(",") if x),
            lowered=meta.get("lowered", "1") == "1",
            placement=meta.get("placement", "loop"),
        )


def _misplaced(a: Action, rank: int, virtual_stages: int) -> None:
    """Raise the :class:`ScheduleError` of an action ``a`` that rank ``rank``'s program
    may not hold."""
    if a.stage != rank:
        raise ScheduleError(f"action {a} of stage {a.stage} placed on rank {rank}")
    raise ScheduleError(f"action {a} uses chunk {a.chunk} but virtual_stages={virtual_stages}")
