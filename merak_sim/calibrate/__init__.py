"""Calibration: fit a cost profile to your own measured runs (``merak-sim calibrate``).

Give measured step times (a runs CSV of configuration + step time,
:mod:`~merak_sim.calibrate.runs`; vTrain's published files; merak-exec run folders)
and get the GPU's efficiency curve fitted within physical bounds
(:mod:`~merak_sim.calibrate.fit`), its error on the runs it saw and on held-out runs,
and a profile file (:mod:`merak_sim.costs.profiles`) that ``--profile FILE`` on
``simulate``, ``plan`` and ``costs`` uses. The shipped A100 profile is this command's
output on vTrain's open data (docs/calibrate.md).
"""

from merak_sim.calibrate.fit import Calibration, Errors, calibrate, hold_out_every
from merak_sim.calibrate.measured import MeasuredRun, RunsError
from merak_sim.calibrate.runs import load_runs, read_run_folder

__all__ = ["Calibration", "Errors", "MeasuredRun", "RunsError", "calibrate", "hold_out_every",
           "load_runs", "read_run_folder"]
