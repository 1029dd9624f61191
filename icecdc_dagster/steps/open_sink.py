"""Open the engine sink of a table's sink config (no Dagster): the one place that builds a
:class:`~icecdc_dagster.sinks.kind.SinkContext`; the sink kind itself decides how it opens."""

from typing import TYPE_CHECKING, Any

from icecdc_dagster.sinks.kind import SinkConfig, SinkContext
from icecdc_dagster.steps.batches import identifier_columns_of

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from icecdc_dagster.config import TableConfig
    from icecdc_dagster.sinks.base import Sink


def sink_context(table: "TableConfig", *, spark: "SparkSession | None", catalog: Any, source_table: "Table",
                 connection: Any = None, target_catalog: Any = None) -> SinkContext:
    """``catalog``: anything with ``name`` and ``load()`` (the catalog resource); ``connection``: the
    sink's connection resource (e.g. the OpenSearch cluster), None to use the sink config's own;
    ``target_catalog``: the catalog of the sink's table when it is another (both attached to ``spark``)."""
    other = target_catalog is not None and target_catalog.name != catalog.name
    return SinkContext(catalog_name=catalog.name, pyiceberg_catalog=catalog.load(), source_table=source_table,
                       table_name=table.table_name,
                       identifier_columns=identifier_columns_of(table.identifier_columns, source_table),
                       spark=spark, connection=connection,
                       target_catalog_name=target_catalog.name if other else None,
                       target_pyiceberg_catalog=target_catalog.load() if other else None)


def open_configured_sink(sink: SinkConfig, table: "TableConfig", *, spark: "SparkSession | None", catalog: Any,
                         source_table: "Table", connection: Any = None, target_catalog: Any = None) -> "Sink":
    return sink.open(sink_context(table, spark=spark, catalog=catalog, source_table=source_table,
                                  connection=connection, target_catalog=target_catalog))
