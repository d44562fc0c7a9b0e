"""Experiment recipes: small functions that run a study and return its numbers
(the paper reproduction lives in :mod:`merak_sim.reproduce`)."""
