"""Dagster definitions built from the pipeline file (``$ICECDC_CONFIG``; none = empty project).

Nothing is read at import: ``dagster dev`` and run workers call :func:`defs`, the CLI calls
:func:`build_definitions` with the file it was given, so ``--config B`` never loads ``$ICECDC_CONFIG``.
"""

import warnings
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetChecksDefinition,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    Definitions,
    PreviewWarning,
    ScheduleDefinition,
    SensorDefinition,
    SourceAsset,
    definitions,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster.assets import line_record, metadata_cache, naming
from icecdc_dagster.assets.changelog import build_changelog_asset
from icecdc_dagster.assets.ingest_asset import build_dead_letter_asset, build_ingest_asset
from icecdc_dagster.assets.maintenance import build_maintenance_asset, build_maintenance_schedule
from icecdc_dagster.assets.sink_assets import build_sink_asset
from icecdc_dagster.assets.source_table import build_source_asset
from icecdc_dagster.assets.table_metadata import ROW_COUNT, definition_metadata, source_fallback, table_metadata
from icecdc_dagster.changelog import check_supported, uses_row_lineage
from icecdc_dagster.checks.sinks_agree import build_consistency_checks
from icecdc_dagster.config import CatalogConfig, IngestConfig, PipelineConfig, TableConfig, load_config
from icecdc_dagster.errors import ConfigError, UnsupportedFormatVersionError
from icecdc_dagster.lease.executor import line_executor
from icecdc_dagster.lineage import LineageEmitter
from icecdc_dagster.resources import IcebergCatalogResource, SparkResource, catalog_resource_key
from icecdc_dagster.resources.keys import SPARK_KEY
from icecdc_dagster.resources.secrets import env_var
from icecdc_dagster.sensors.ingest_sensor import build_ingest_sensor
from icecdc_dagster.sensors.snapshots import build_snapshot_sensor, build_tables_sensor
from icecdc_dagster.steps.batches import identifier_columns_of
from icecdc_dagster.steps.changelog_store import changelog_table_name
from icecdc_dagster.steps.ingest_entry import fixed_target

if TYPE_CHECKING:
    from pyiceberg.table import Table


def _catalog_resource(catalog: CatalogConfig) -> IcebergCatalogResource:
    return IcebergCatalogResource(type=catalog.type, name=catalog.name, uri=catalog.uri, warehouse=catalog.warehouse,
                                  password=env_var(catalog.password),
                                  properties={k: env_var(v) for k, v in catalog.properties.items()})


def _catalog_kinds(config: PipelineConfig) -> list[str]:
    """What the Spark session needs loaded at start for every catalog: the REST client, JDBC drivers."""
    kinds = set()
    for catalog in (config.catalog, *config.catalogs.values()):
        kinds.add(catalog.type if catalog.type != "sql" else catalog._settings(resolve=False).backend or "sqlite")
    return sorted(kinds & {"rest", "sqlite", "postgresql"})


def build_resources(config: PipelineConfig) -> dict[str, Any]:
    resources: dict[str, Any] = {
        catalog_resource_key(None): _catalog_resource(config.catalog),
        **{catalog_resource_key(name): _catalog_resource(block) for name, block in config.catalogs.items()},
        SPARK_KEY: SparkResource(master=config.spark.master, app_name=config.spark.app_name,
                               conf={k: str(v) for k, v in config.spark.conf.items()}, jars=list(config.spark.jars),
                               spark_config=dict(config.spark.spark_config), catalog_kinds=_catalog_kinds(config)),
    }
    for table in config.tables:
        for sink in table.sinks:
            key = sink.resource_key()
            if key:
                resources[key] = sink.connection_resource()
    return resources


def ingest_writers(config: PipelineConfig) -> dict[str, tuple[Any, ...]]:
    """Table name -> keys of the ingest assets whose fixed target it is."""
    writers: dict[str, tuple[Any, ...]] = {}
    for entry in config.ingest:
        target = fixed_target(entry)
        if target:
            writers[target] = (*writers.get(target, ()), naming.ingest_key(entry))
    return writers


def check_tables_exist(config: PipelineConfig) -> dict[str, "Table"]:
    """A table name that does not exist in the catalog fails at load, naming the table; so does the
    fixed target of an ingest entry without auto_create. A table that an auto-creating ingest entry
    writes may not exist yet (its sensor waits for it). Returns the source tables it loaded."""
    if not config.tables and not config.ingest:
        return {}

    catalog = config.catalog.settings().load_pyiceberg()
    created_later = {fixed_target(e) for e in config.ingest if e.auto_create}
    for i, entry in enumerate(config.ingest):
        target = fixed_target(entry)
        if target and not entry.auto_create:
            where = config.catalog_config(entry.catalog)
            if not (catalog if entry.catalog is None else config.catalog_settings(entry.catalog).load_pyiceberg()
                    ).table_exists(target):
                raise ConfigError(f"{config.source}: ingest[{i}] ({entry.name}).target: table {target!r} does not "
                                  f"exist in catalog {where.name!r} and auto_create is false")
    sources = {}
    for table in config.tables:
        try:
            source = catalog.load_table(table.table_name)
        except NoSuchTableError:
            if table.table_name in created_later:
                continue
            raise ConfigError(f"{config.source}: tables: table {table.table_name!r} does not exist in catalog "
                              f"{config.catalog.name!r} ({config.catalog.uri})") from None
        check_format_version(config, table, source)
        check_sinks_can_follow(config, table, source)
        sources[table.table_name] = source
    return sources


def check_format_version(config: PipelineConfig, table: TableConfig, source: "Table") -> None:
    """A table whose settings its format version cannot hold (a v1 table set to merge-on-read): refused at
    load, with the fix. Other v1 tables are followed (their line orders snapshots by ancestry)."""

    try:
        check_supported(source)
    except UnsupportedFormatVersionError as exc:
        raise ConfigError(f"{config.source}: tables: {table.table_name!r}: {exc}") from None


def _rows_identifiable(table: TableConfig, source: "Table") -> bool:
    """A sink can name a row: identifier columns, v3 row lineage, or the table is declared append-only."""

    keyed = bool(identifier_columns_of(table.identifier_columns, source))
    return table.append_only or keyed or uses_row_lineage(source)


def check_sinks_can_follow(config: PipelineConfig, table: TableConfig, source: "Table") -> None:
    """Each sink kind names what it needs of a source (an OpenSearch sink deletes documents by id,
    a replica matches rows by key): a table that cannot offer it is refused at load, with the fix."""
    identifiable = _rows_identifiable(table, source)
    for sink in table.sinks:
        problem = sink.refuse_source(table.table_name, source, identifiable)
        if problem:
            raise ConfigError(f"{config.source}: tables: {problem}")


def build_definitions(config: PipelineConfig, check_tables: bool = True, rebuilt: Collection[str] = ()) -> Definitions:
    """Assets, checks, sensors, schedules and resources of the pipeline file. ``rebuilt``: tables an
    ``icecdc resync`` rebuilds (their changed identifier columns are accepted).

    Dagster marks APIs we rely on deliberately (``backfill_policy``, ``observable_source_asset``,
    partitioned checks) as beta/preview and warns at every load (``dagster dev``, each run worker):
    noise our users cannot act on, so it is silenced here, for our definitions only."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        warnings.simplefilter("ignore", PreviewWarning)
        warnings.filterwarnings("ignore", message=r"Property `OpDefinition.version` is deprecated")  # Dagster's own
        return _build_definitions(config, check_tables, rebuilt)


def _build_definitions(config: PipelineConfig, check_tables: bool, rebuilt: Collection[str]) -> Definitions:
    # The source tables are loaded once at load for the checks; their schemas become the source
    # assets' definition metadata, so an asset page shows its columns without another catalog call.
    # The tables the assets write: derived from the source (replicas) or remembered from the last
    # batch that wrote them (changelog store, ingest targets): no catalog call either.
    naming.check_unique_keys(config)
    sources = check_tables_exist(config) if check_tables else {}

    line_record.check_pipeline(config, sources, rebuilt)

    remembered = metadata_cache.load() if config.tables or config.ingest else {}
    assets: list[AssetsDefinition | AssetSpec | SourceAsset] = []
    checks: list[AssetChecksDefinition] = []
    sensors: list[SensorDefinition] = []
    schedules: list[ScheduleDefinition] = []
    writers = ingest_writers(config)
    entries_by_target: dict[str | None, list[IngestConfig]] = {}
    for entry in config.ingest:
        entries_by_target.setdefault(fixed_target(entry), []).append(entry)
    configured = {table.table_name: table for table in config.tables}
    lineage = LineageEmitter.configured(config.lineage.namespace, config.lineage.transport, config.lineage.enabled)
    for entry in config.ingest:
        target = fixed_target(entry)
        stands_for_target = target is not None and target not in configured
        written = f"{config.catalog_config(entry.catalog).name}.{target}"  # in the entry's catalog
        assets.append(build_ingest_asset(entry, remembered.get(written, {})
                                         if stands_for_target else None, lineage))
        sensors.append(build_ingest_sensor(entry))
    assets.extend(build_dead_letter_asset(entries, config.catalog_config(entries[0].catalog).name, remembered)
                  for target, entries in entries_by_target.items() if target is not None)
    resources = build_resources(config)
    for table in config.tables:
        source = sources.get(table.table_name)
        described = {k: v for k, v in table_metadata(config.catalog.name, source, table.identifier_columns,
                                                      fallback=source_fallback(table.table_name)).items()
                     if k != ROW_COUNT} if source else {}  # a row count at load would only go stale
        if source is None:  # an ingest target not created yet: what its writer last saw, if anything
            described = remembered.get(f"{config.catalog.name}.{table.table_name}", {})
        assets.append(build_source_asset(table, written_by=writers.get(table.table_name, ()), described=described))
        store = f"{config.catalog.name}.{changelog_table_name(table.table_name)}"
        assets.append(build_changelog_asset(table, lineage, remembered.get(store, {}), config.source))
        assets.extend(build_sink_asset(table, sink, lineage,
                                       definition_metadata(sink.target_catalog or config.catalog.name, table, sink,
                                                           source, remembered),
                                       config.source)
                      for sink in table.sinks)
        assets.append(build_maintenance_asset(table, tuple(entries_by_target.get(table.table_name, ()))))
        schedules.append(build_maintenance_schedule(table))
        if config.sensor_layout == "per_table":
            sensors.append(build_snapshot_sensor(table, config.source, resources[catalog_resource_key(None)]))

    if config.sensor_layout == "one" and config.tables:
        sensors.append(build_tables_sensor(config.tables, config.source, resources[catalog_resource_key(None)]))
    for table in config.tables:
        checks.extend(build_consistency_checks(table))
    # No code-location-wide executor: merged into a user's project it would become theirs too. Our
    # sensors' and schedules' jobs carry the line executor themselves (``lease.executor.line_job``).
    return Definitions(assets=assets, asset_checks=checks, sensors=sensors, schedules=schedules,
                       resources=resources)


@definitions
def defs() -> Definitions:
    """What ``dagster dev``, the daemon and run workers load: the pipeline file named by ``$ICECDC_CONFIG``.

    Our own code location, so the line executor is its default too: a partition materialised from the
    asset graph (Dagster's implicit asset job) runs in one process and holds the line's lock. One
    process per run keeps one warm SparkSession for every step of the batch."""
    return Definitions.merge(build_definitions(load_config()), Definitions(executor=line_executor))

