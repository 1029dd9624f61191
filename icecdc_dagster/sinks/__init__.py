"""Sinks: apply CDC event batches to targets, each keeping its own checkpoint (no Dagster)."""
