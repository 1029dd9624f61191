"""What a sink kind is: its config section, and everything derived from it (no Dagster).

A sink kind is one folder under ``sinks/`` whose ``config.py`` subclasses :class:`SinkConfig`.
The config class is the plugin: it names the YAML key, the asset path, the connection resource
(if the sink reaches a service), how the engine sink is opened, what a source table must offer,
and how the consistency check compares the sink with its source. The Dagster layer
(``definitions``, assets, checks, ``status``) loops over sinks and never branches on their kind.
Registering a new kind is one line in :mod:`icecdc_dagster.sinks.registry`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from icecdc_dagster.fields import AssetKeyPath, Keyed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from icecdc_dagster.batch import Checkpoint
    from icecdc_dagster.lineage import LineageDataset
    from icecdc_dagster.sinks.base import Sink


@dataclass(frozen=True)
class SinkContext:
    """What opening a sink needs from the run: sessions, the source table and its keys.

    ``catalog_name`` / ``pyiceberg_catalog``: the source's catalog. ``target_catalog_name`` /
    ``target_pyiceberg_catalog``: the catalog of the table the sink writes (:attr:`SinkConfig.target_catalog`),
    unset when it is the source's. ``connection``: the sink's connection resource with secrets resolved (see
    :meth:`SinkConfig.connection_resource`), or None to use the config's own values.
    """

    catalog_name: str
    pyiceberg_catalog: "Catalog"
    source_table: "Table"
    table_name: str
    identifier_columns: tuple[str, ...]
    spark: "SparkSession | None" = None
    connection: Any = None
    target_catalog_name: str | None = None
    target_pyiceberg_catalog: "Catalog | None" = None

    def target_catalog(self) -> tuple[str, "Catalog"]:
        """(Spark name, pyiceberg catalog) of the catalog the sink's table lives in."""
        if self.target_catalog_name is None or self.target_pyiceberg_catalog is None:
            return self.catalog_name, self.pyiceberg_catalog
        return self.target_catalog_name, self.target_pyiceberg_catalog


@dataclass(frozen=True)
class Comparison:
    """A sink compared with its source at the sink's checkpoint (the consistency check)."""

    sink_rows: int
    mismatches: list[str] = field(default_factory=list)
    sampled_rows: int = 0


class SinkConfig(Keyed):
    """One entry of a table's ``sinks:`` list (``- <kind>: {settings}``)."""

    kind: ClassVar[str]
    asset_prefix: ClassVar[str]
    tags: ClassVar[frozenset[str]]

    asset_key: AssetKeyPath | None = Field(
        default=None, description="the sink's Dagster asset key, a list or 'a/b' (default: replica/<ns>/<ns>_<table>, "
                                  "opensearch/<index>_opensearch); e.g. [demo_replica, orders], the key of a dbt "
                                  "source demo_replica.orders")

    @property
    def target(self) -> str:
        """The index or table this sink writes (unique per kind in a pipeline file)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """``<asset prefix>/<target>``: how logs, metadata and status name the sink."""
        return f"{self.asset_prefix}/{self.target}"

    @property
    def asset_name(self) -> str:
        return self.target

    def asset_path(self) -> tuple[str, ...]:
        return (self.asset_prefix, *self.target.split("."))

    def describe(self, source_table: str) -> str:
        raise NotImplementedError

    @property
    def target_catalog(self) -> str | None:
        """The named catalog (``catalogs:``) of the table this sink writes; None: the default catalog."""
        return None

    def maintained_table(self) -> str | None:
        """An Iceberg table this sink owns and the table group's maintenance compacts and expires."""
        return None

    def lineage_dataset(self, catalog_name: str, load_table: Callable[[str], "Table"]) -> "LineageDataset | None":
        """The sink's target as an OpenLineage dataset (an Iceberg table it writes by default)."""
        target = self.maintained_table()
        if target is None:
            return None
        from icecdc_dagster.lineage import iceberg_dataset  # openlineage's client: 0.7 s to import, on use

        return iceberg_dataset(catalog_name, load_table(target))

    def target_schema(self, source: "Table", identifier_columns: Sequence[str], by_row_id: bool) -> "Schema | None":
        """The schema of the table this sink writes, derived from the source's (no catalog call): what
        the asset page shows at load. None when the target is not a table or its schema is not derivable."""
        return None

    def resource_key(self) -> str | None:
        """The Dagster resource key of this sink's connection; None when it needs none."""
        return None

    def connection_resource(self) -> Any:
        """The connection as a Dagster ``ConfigurableResource`` (secrets as ``EnvVar``), or None."""
        return None

    def derived_columns(self, source_columns: Sequence[str], identifier_columns: Sequence[str],
                        by_row_id: bool) -> dict[str, list[str]]:
        """Column lineage: each column (or document field) of the target <- the source columns it comes
        from. ``by_row_id``: rows are named by the source's v3 ``_row_id`` (no identifier columns)."""
        return {name: [name] for name in source_columns}

    def refuse_source(self, table_name: str, source: "Table", rows_identifiable: bool) -> str | None:
        """Why this sink cannot follow ``source`` (checked at load), or None."""
        return None

    def open(self, context: SinkContext) -> "Sink":
        raise NotImplementedError

    def compare(self, context: SinkContext, sink: "Sink", checkpoint: "Checkpoint", source_rows: "DataFrame",
                source_count: int, sample_size: int) -> Comparison:
        """Row count and a sample of source rows at ``checkpoint`` looked up in the sink."""
        raise NotImplementedError
