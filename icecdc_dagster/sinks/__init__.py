"""Sinks: apply CDC event batches to targets, each keeping its own checkpoint (no Dagster)."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["base", "iceberg", "kind", "opensearch", "registry"]
