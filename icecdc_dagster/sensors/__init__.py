"""Sensors: one per source table, materialising snapshots strictly in commit order."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["ingest", "snapshots"]
