"""Dagster assets built from the pipeline config by small factories."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["changelog", "ingest", "json_file", "line_record", "lineage", "maintenance", "metadata", "metadata_cache",
           "naming", "sinks", "source", "table_metadata"]
