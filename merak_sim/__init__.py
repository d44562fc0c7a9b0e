"""merak_sim: a torch-free simulator, planner and schedule toolkit for 3D-parallel
transformer training (reproducing and extending Merak, Lai et al., TPDS 2023).

Importing this package never imports torch.
"""

__version__ = "0.1.0"
