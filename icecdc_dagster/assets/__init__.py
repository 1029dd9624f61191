"""Dagster assets built from the pipeline config by small factories."""
