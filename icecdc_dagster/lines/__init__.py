"""A line as the Dagster instance records it: its keys in order, what each asset has materialised, the
window of snapshots still pending, and what a batch records (``batch_metadata``). Below the assets, sensors, checks
and status that read it; above ``lease`` (who holds a line) and ``steps.ordering`` (the plan)."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["batch_metadata", "line", "window"]
