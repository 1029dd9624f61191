"""Dagster assets built from the pipeline config by small factories."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["changelog", "ingest_asset", "json_file", "line_record", "lineage", "maintenance", "metadata_cache",
           "naming", "sink_assets", "source_table", "table_metadata"]
