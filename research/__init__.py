"""The studies that found the simulator's constants (not installed with the package).

Each study imports the installed ``merak_sim`` and is run from the repository root as
``.venv/bin/python -m research.studies.NAME`` (README.md in this folder lists them).
"""
