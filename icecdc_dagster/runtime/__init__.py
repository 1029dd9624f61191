"""Starting Spark with Iceberg here: jars, Java, and the shared catalog (no Dagster)."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["catalog", "jars", "java", "relocation", "rest_server", "spark"]
