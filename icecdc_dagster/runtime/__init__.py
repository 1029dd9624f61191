"""Starting Spark with Iceberg here: jars, Java, and the shared catalog (no Dagster)."""
