"""Prediction versus measurement, torch-free: run directories, pricing, comparison,
reports and their history.

Modules:

- :mod:`~merak_sim.validation.rundir`: the ``merak-run/1`` run-directory format (read
  and write; the backend's ``RunResult.save`` / ``load`` use it);
- :mod:`~merak_sim.validation.profile`: stage profiles (``merak-stage-profile/1``);
- :mod:`~merak_sim.validation.pricing`: a run's configuration priced from its profile
  and simulated;
- :mod:`~merak_sim.validation.measured`: the measured side's conventions (effective
  starts, exposed communication, CPU shares);
- :mod:`~merak_sim.validation.memory`: memory and parameter bytes per stage;
- :mod:`~merak_sim.validation.compare`: :func:`~merak_sim.validation.compare.compare_run`,
  one run's comparison;
- :mod:`~merak_sim.validation.report`: its
  :class:`~merak_sim.validation.report.AccuracyReport` (markdown, JSON, the side-by-side
  Gantt chart);
- :mod:`~merak_sim.validation.suite` and :mod:`~merak_sim.validation.history`:
  figures over many runs and over many suite runs.

The measuring half (profiling, real runs) lives in the backend, ``merak_exec``.
"""
