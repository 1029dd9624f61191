"""``- opensearch: {...}``: the OpenSearch sink kind — its settings, asset, connection and check.

Every setting of :class:`~icecdc_dagster.sinks.opensearch.settings.OpenSearchSinkSettings` is
here, and the same rules validate it at load (an invalid index name, a mapping beside a
template, a password without a user name fail before anything runs, naming the key).
"""

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from icecdc_dagster.errors import ConfigError
from icecdc_dagster.fields import EnvOrText, EnvRef, Flag, NonNegativeInt, PositiveInt, Secret
from icecdc_dagster.sinks.kind import Comparison, SinkConfig, SinkContext
from icecdc_dagster.sinks.opensearch.consistency import compare_index
from icecdc_dagster.sinks.opensearch.refill_source import source_export
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings
from icecdc_dagster.sinks.opensearch.sink import OpenSearchSink

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame

    from icecdc_dagster.batch import Checkpoint
    from icecdc_dagster.lineage import LineageDataset
    from icecdc_dagster.sinks.opensearch.resource import OpenSearchResource

_SLUG = re.compile(r"[^A-Za-z0-9_]")


class OpenSearchSinkConfig(SinkConfig):
    """Bulk INDEX/DELETE by document id into one index, versioned by the source commit (idempotent)."""

    kind: ClassVar[str] = "opensearch"
    asset_prefix: ClassVar[str] = "opensearch"
    tags: ClassVar[frozenset[str]] = frozenset({"opensearch", "spark"})

    index: str = Field(description="the alias users query (lowercase), over versioned indexes <index>_v<n> "
                                   "created with a mapping from the Iceberg schema")
    hosts: tuple[str, ...] = Field(default=("http://localhost:9200",), min_length=1, description="cluster URLs")
    username: EnvOrText | None = Field(default=None, description="basic-auth user (plain or {env: VARIABLE})")
    password: Secret | None = Field(default=None, description="{env: VARIABLE}; never written in the file")
    verify_certs: Flag = Field(default=True, description="verify the cluster's TLS certificate")
    ca_certs: str | None = Field(default=None, description="CA bundle file for TLS")
    request_timeout_s: float = Field(default=60.0, gt=0, description="seconds per HTTP request")
    chunk_size: PositiveInt = Field(default=500, description="actions per bulk request")
    max_chunk_bytes: PositiveInt = Field(default=10 * 1024 * 1024, description="bytes per bulk request")
    parallelism: PositiveInt = Field(default=2, description="concurrent bulk requests inside each Spark task")
    max_retries: NonNegativeInt = Field(default=5, description="retries of 429/5xx/timeouts, with backoff")
    initial_backoff_s: float = Field(default=0.5, ge=0, description="first retry delay (seconds, doubling)")
    max_backoff_s: float = Field(default=30.0, ge=0, description="longest retry delay (seconds)")
    refresh: bool | Literal["wait_for"] = Field(
        default=True, description="true: one refresh before the checkpoint; wait_for: every bulk request waits; "
                                  "false: the index's refresh interval")
    mapping: dict[str, Any] | None = Field(default=None, description="the index's mappings body (instead of derived)")
    template_name: str | None = Field(default=None, description="an index template that must exist and shapes "
                                                                "each index version: its patterns must match "
                                                                "<index>_v* (not with mapping)")
    index_settings: dict[str, Any] | None = Field(default=None, description="settings of each new index version")
    evolve_mapping: Flag = Field(default=True, description="add mappings for columns added to the source")
    include_iceberg_metadata: Flag = Field(default=False, description="also store iceberg_operation, "
                                           "iceberg_snapshot_operation, iceberg_table_name, iceberg_snapshot_id")
    max_reported_failures: PositiveInt = Field(default=5, description="failed items quoted in a batch's error")

    @model_validator(mode="after")
    def _same_rules_as_the_engine(self) -> "OpenSearchSinkConfig":
        try:
            self.settings(password="set" if self.password else None,
                          username="set" if self.username is not None else None)
        except ConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return self

    @property
    def target(self) -> str:
        return self.index

    def describe(self, source_table: str) -> str:
        return f"OpenSearch index {self.index} kept in step with {source_table}"

    def lineage_dataset(self, catalog_name: str, load_table: Callable[[str], "Table"]) -> "LineageDataset":
        from icecdc_dagster.lineage import opensearch_dataset  # openlineage's client: 0.7 s to import, on use

        return opensearch_dataset(self.hosts, self.index)

    def resource_key(self) -> str:
        return "icecdc_opensearch__" + _SLUG.sub("_", self.index)

    def connection_resource(self) -> "OpenSearchResource":
        # The Dagster adapter: imported here so the engine's sink kinds load without Dagster.
        from icecdc_dagster.sinks.opensearch.resource import OpenSearchResource  # dagster: the engine imports none

        return OpenSearchResource.of(list(self.hosts), self.username, self.password, self.verify_certs,
                                     self.ca_certs, self.request_timeout_s)

    def settings(self, connection: Any = None, *, username: str | None = None,
                 password: str | None = None) -> OpenSearchSinkSettings:
        """Engine settings; the cluster (hosts, credentials) from ``connection`` when given, else from
        this config with secrets read from the environment now."""
        if connection is not None:
            hosts, username, password, verify, ca_certs, timeout = connection.cluster()
        else:
            hosts, verify, ca_certs, timeout = self.hosts, self.verify_certs, self.ca_certs, self.request_timeout_s
            if username is None:
                username = self.username.resolve() if isinstance(self.username, EnvRef) else self.username
            if password is None and self.password is not None:
                password = self.password.resolve()
        return OpenSearchSinkSettings(
            hosts=hosts, index=self.index, username=username, password=password, verify_certs=verify,
            ca_certs=ca_certs, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
            parallelism=self.parallelism, max_retries=self.max_retries, initial_backoff_s=self.initial_backoff_s,
            max_backoff_s=self.max_backoff_s, refresh=self.refresh, request_timeout_s=timeout,
            mapping=self.mapping, template_name=self.template_name, index_settings=self.index_settings,
            evolve_mapping=self.evolve_mapping, include_iceberg_metadata=self.include_iceberg_metadata,
            max_reported_failures=self.max_reported_failures)

    def derived_columns(self, source_columns: Sequence[str], identifier_columns: Sequence[str],
                        by_row_id: bool) -> dict[str, list[str]]:
        """Document fields are the source's columns; the document id is built from the identifier
        columns, the v3 ``_row_id``, or (append-only, keyless) the whole row."""
        lineage = super().derived_columns(source_columns, identifier_columns, by_row_id)
        lineage["_id"] = list(identifier_columns) or (["_row_id"] if by_row_id else list(source_columns))
        return lineage

    def refuse_source(self, table_name: str, source: "Table", rows_identifiable: bool) -> str | None:
        if rows_identifiable:
            return None
        return (f"{table_name!r} has an OpenSearch sink but no identifier columns (config or table identifier "
                f"fields) and no v3 row lineage, so its deletes cannot name a document; set identifier_columns, "
                f"or declare the table append_only: true")

    def open(self, context: SinkContext) -> OpenSearchSink:
        return OpenSearchSink(self.settings(context.connection), context.source_table.schema(), name=self.name,
                              export=source_export(context))

    def compare(self, context: SinkContext, sink: Any, checkpoint: "Checkpoint", source_rows: "DataFrame",
                source_count: int, sample_size: int) -> Comparison:
        return compare_index(context, sink.settings, checkpoint.snapshot_id, sample_size)
