"""Op codes of a compiled program step (:class:`~merak_sim.sim.structure.ProgramStructure`
``op_words``), in a module of their own so both structure builders (the walk of
:mod:`merak_sim.sim.structure` and the array build of
:mod:`merak_sim.sim.flat_structure`) read one definition."""

__all__ = ["OP_COMPUTE", "OP_POST", "OP_AR"]

#: A compute action (x: action id, y: consumed transfer or -1), the posting of a send
#: or receive (x: transfer id, y: 1 for a send), the gradient all-reduce (x: action id).
OP_COMPUTE, OP_POST, OP_AR = 0, 1, 2
