"""How the OpenSearch sink reads the whole source at a snapshot, to fill a new index version.

The existing export path (``changelog.export`` then ``to_events``, as a bootstrap batch does), read
by Spark; its scan tasks are released when the block ends.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame

from icecdc_dagster import changelog
from icecdc_dagster.errors import ReindexError
from icecdc_dagster.sinks.kind import SinkContext
from icecdc_dagster.sinks.opensearch.sink import SourceExport


def source_export(context: SinkContext) -> SourceExport:
    """The export of ``context``'s source table at a snapshot, as CDC events (every row an INSERT)."""

    @contextmanager
    def export(snapshot_id: int, identifier_columns: tuple[str, ...]) -> Iterator[DataFrame]:
        spark, source = context.spark, context.source_table
        if spark is None:
            raise ReindexError(f"{context.table_name}: a new index version is filled from an export of snapshot "
                               f"{snapshot_id}, which needs a SparkSession; this sink was opened without one")
        use_row_id = changelog.uses_row_lineage(source) and not identifier_columns
        with changelog.staged_scans(spark):
            rows = changelog.export(spark, context.catalog_name, source, snapshot_id, identifier_columns).rows
            yield changelog.to_events(rows, context.table_name, identifier_columns, "append", snapshot_id,
                                      use_row_id=use_row_id, unique_ids=True)  # the export checked its keys

    return export
