"""The studies, one command each: ``python -m research.studies.NAME`` (research/README.md)."""
