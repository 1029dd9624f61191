"""Build the sink object of a sink config (no Dagster): one place that knows every sink type."""

from typing import Any

from icecdc_dagster.config import IcebergSinkConfig, OpenSearchSinkConfig, SinkConfig
from icecdc_dagster.sinks.base import Sink


def sink_name(sink: SinkConfig) -> str:
    if isinstance(sink, OpenSearchSinkConfig):
        return f"opensearch/{sink.index}"
    return f"replica/{sink.table_name}"


def opensearch_settings(sink: OpenSearchSinkConfig, hosts: list[str] | None = None, username: str | None = None,
                        password: str | None = None, verify_certs: bool | None = None,
                        ca_certs: str | None = None) -> Any:
    from icecdc_dagster.sinks.opensearch import OpenSearchSinkSettings

    return OpenSearchSinkSettings(
        hosts=tuple(hosts or sink.hosts), index=sink.index, username=username, password=password,
        verify_certs=sink.verify_certs if verify_certs is None else verify_certs,
        ca_certs=ca_certs if ca_certs is not None else sink.ca_certs,
        chunk_size=sink.chunk_size, max_chunk_bytes=sink.max_chunk_bytes, parallelism=sink.parallelism,
        max_retries=sink.max_retries, refresh=sink.refresh, request_timeout_s=sink.request_timeout_s,
        mapping=sink.mapping)


def open_configured_sink(sink: SinkConfig, table: Any, *, spark: Any, catalog: Any, source_table: Any,
                         cluster: Any = None) -> Sink:
    """The sink of a table's sink config. ``catalog``: the catalog resource (``name``, ``load()``);
    ``cluster``: the OpenSearch connection resource (hosts, credentials) for an OpenSearch sink."""
    from icecdc_dagster.pipeline.batches import identifier_columns_of

    settings = None
    if isinstance(sink, OpenSearchSinkConfig) and cluster is not None:
        settings = opensearch_settings(sink, hosts=cluster.hosts, username=cluster.username,
                                       password=cluster.password, verify_certs=cluster.verify_certs,
                                       ca_certs=cluster.ca_certs)
    return open_sink(sink, spark=spark, catalog_name=catalog.name, pyiceberg_catalog=catalog.load(),
                     source_table=source_table,
                     identifier_columns=identifier_columns_of(table.identifier_columns, source_table),
                     opensearch=settings)


def open_sink(sink: SinkConfig, *, spark: Any, catalog_name: str, pyiceberg_catalog: Any, source_table: Any,
              identifier_columns: tuple[str, ...], opensearch: Any = None) -> Sink:
    """``opensearch``: OpenSearchSinkSettings for an OpenSearch sink (credentials already resolved)."""
    if isinstance(sink, OpenSearchSinkConfig):
        from icecdc_dagster.sinks.opensearch import OpenSearchSink

        return OpenSearchSink(opensearch or opensearch_settings(sink), source_table.schema(), name=sink_name(sink))
    if isinstance(sink, IcebergSinkConfig):
        from icecdc_dagster.sinks.iceberg import IcebergReplicaSink

        return IcebergReplicaSink(spark, catalog_name, pyiceberg_catalog, sink.table_name, source_table,
                                  identifier_columns=identifier_columns, name=sink_name(sink))
    raise TypeError(f"unknown sink config {sink!r}")
