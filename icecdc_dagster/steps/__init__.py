"""Orchestrator-neutral steps of a sync: which batch comes next, computing and storing it.

The Dagster layer (assets, sensors) and the CLI are thin shells around this
package; nothing here imports Dagster.
"""

# A package of modules, no facade: callers import the module they need.
__all__ = ["batches", "changelog_store", "ingest", "lifecycle", "maintenance", "observed", "ordering", "sinks"]
