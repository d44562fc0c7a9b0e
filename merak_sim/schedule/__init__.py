"""The schedule IR, generators, lowering, validation and unit-cost replay (torch-free)."""

from .execute import DeadlockError, Execution, execute
from .generators import SCHEDULES, generate
from .ir import (
    Action,
    Fused,
    Kind,
    Schedule,
    ScheduleError,
    Step,
    format_program,
    iter_actions,
    parse_program,
    parse_step,
)
from .liveness import LiveTrace, liveness
from .lowering import lower
from .replay import ReplayResult, replay, stage_aware_fractions
from .spec import ScheduleSpec
from .validate import ScheduleCheck, validate

__all__ = [
    "Action",
    "DeadlockError",
    "Execution",
    "Fused",
    "Kind",
    "LiveTrace",
    "ReplayResult",
    "SCHEDULES",
    "Schedule",
    "ScheduleError",
    "ScheduleCheck",
    "ScheduleSpec",
    "Step",
    "execute",
    "format_program",
    "generate",
    "iter_actions",
    "liveness",
    "lower",
    "parse_program",
    "parse_step",
    "replay",
    "stage_aware_fractions",
    "validate",
]
