"""The Merak reproduction recipe (``merak-sim reproduce merak``): the paper models and
systems (:mod:`~merak_sim.reproduce.merak`), the memory-regime map
(:mod:`~merak_sim.reproduce.regimes`), the report (:mod:`~merak_sim.reproduce.report`)
and its charts and tables (:mod:`~merak_sim.reproduce.figures`)."""
