"""``icecdc demo``: a local lakehouse with a changing table, synced end to end."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["run", "workload"]
