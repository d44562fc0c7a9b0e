"""Measuring what the simulator predicts, on this machine (torch).

- :mod:`~merak_exec.profiling.layer_trace`: per-layer forward / backward / recompute
  times and activation bytes of a model's chain, written as a ``merak-trace/1`` trace
  (``merak-exec profile``); :mod:`~merak_exec.profiling.collectives` adds gloo
  collective timings to it.
- :mod:`~merak_exec.profiling.stage_profile`: every action kind of a rank's stage timed
  through the runtime's own action code (the validation loop's profiler step).
- :mod:`~merak_exec.profiling.machine`: gloo point-to-point latency and bandwidth,
  posting cost and contention; :mod:`~merak_exec.profiling.post_probe`: posting cost
  measured inside a running pipeline.
- :mod:`~merak_exec.profiling.measure`: profile, train for real and write a run
  directory for :mod:`merak_sim.validation` (cases in
  :mod:`~merak_exec.profiling.cases`, the CPU suite's in
  :mod:`~merak_exec.profiling.cpu_suite`).
- :mod:`~merak_exec.profiling.saved_tensors`: the one saved-tensor tracker every
  activation figure is measured with.
"""
