"""The pipeline file as one typed model tree: catalog, Spark, tables with their sinks, ingestion.

Every section forbids unknown keys; every value is checked for its type without coercion; rules
that involve several keys are model validators here, so a mistake fails at load with the file
and the key path (see :mod:`icecdc_dagster.config.load`), never in the middle of a run.
"""

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from icecdc_dagster.errors import ConfigError, SchemaDeclarationError
from icecdc_dagster.fields import (
    AssetKeyPath,
    Duration,
    EnvRef,
    Flag,
    Keyed,
    LocationOrUri,
    Model,
    Names,
    NonNegativeInt,
    PositiveInt,
    PropertyValue,
    Secret,
    TableName,
    is_secret_property,
    is_table_name,
    local_path,
    parse_duration,
)
from icecdc_dagster.ingest import routing
from icecdc_dagster.inputs.base import InputConfig
from icecdc_dagster.inputs.landing.config import LandingConfig
from icecdc_dagster.inputs.registry import INPUT_KINDS
from icecdc_dagster.runtime.catalog import CATALOG_TYPES, CatalogSettings, with_password
from icecdc_dagster.runtime.spark import SparkSettings
from icecdc_dagster.sinks.kind import SinkConfig
from icecdc_dagster.sinks.registry import SINK_KINDS
from icecdc_dagster.writer.auto_create import check_declared

WriteMode = Literal["merge", "equality_deletes"]


def _sink_entry(kind: str, config: type[SinkConfig] | type[InputConfig]) -> Any:
    """``{<kind>: {settings}}``: the YAML shape of one sink (or stream input), as its own small model."""
    fields: dict[str, Any] = {kind: (config, Field(description=config.__doc__))}
    entry = create_model(f"{config.__name__}Entry", __base__=Model, **fields)
    return Annotated[entry, Tag(kind)]


def _sink_kind(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        return next(iter(value))
    if isinstance(value, Model):
        return next(iter(type(value).model_fields))
    return None


# ``snapshot_sensors: auto``: from this many tables one sensor ticks them all. A sensor per table costs the
# daemon a tick record, a code-server call and a cursor per table per loop; measured at 20 and 50 tables
# (bench/freshness.py --sensors both, docs/performance.md "Sensor layout"). Below it, the UI's per-table
# switch and tick history are worth the few sensors.
ONE_SENSOR_FROM_TABLES = 10
_ENTRIES = tuple(_sink_entry(kind, config) for kind, config in SINK_KINDS.items())
SinkEntry = Annotated[Union[_ENTRIES],  # type: ignore[valid-type]  # noqa: UP007 - built from the registry
                      Discriminator(_sink_kind, custom_error_type="sink_kind", custom_error_message="unknown sink type",
                                    custom_error_context={"expected": ", ".join(sorted(SINK_KINDS))})]


_INPUTS = tuple(_sink_entry(kind, config) for kind, config in INPUT_KINDS.items())
InputEntry = Annotated[Union[_INPUTS],  # type: ignore[valid-type]  # noqa: UP007 - built from the registry
                       Discriminator(_sink_kind, custom_error_type="input_kind",
                                     custom_error_message="unknown input type (expected one of: "
                                                          f"{', '.join(sorted(INPUT_KINDS))})")]


class TableConfig(Keyed):
    """One source table followed snapshot by snapshot into its sinks."""

    table_name: TableName = Field(description="<namespace>.<table> in the catalog")
    asset_key: AssetKeyPath | None = Field(
        default=None, description="the source table's Dagster asset key, a list or 'a/b' (default: iceberg/<namespace>/"
                                  "<table>); e.g. the key a dbt source of the same table has")
    identifier_columns: Names = Field(default=(), description="row key (default: the table's identifier fields)")
    disable_export: Flag = Field(default=False, description="start from the current snapshot without an export")
    polling_interval: Duration = Field(default="PT30S", description="sensor interval")
    max_snapshots_per_run: PositiveInt = Field(default=10, description="snapshots applied as one batch at most")
    max_retries: NonNegativeInt = Field(default=3, description="automatic retries of a failed batch")
    append_only: Flag = Field(
        default=False, description="a keyless table without row lineage is insert-only: OpenSearch documents get "
                                   "generated ids and a DELETE fails its batch")
    sink_entries: tuple[SinkEntry, ...] = Field(default=(), alias="sinks",
                                               description="where the table's changes go")
    maintenance_schedule: str = Field(default="0 3 * * *", description="cron schedule of the maintenance asset")
    compact_delete_files: PositiveInt = Field(
        default=50, description="compact a replica / ingest target when a partition has more delete files")
    changelog_retention: Duration = Field(
        default="P7D", description="applied changelog batches and replica snapshots older than this are expired")

    @property
    def sinks(self) -> tuple[SinkConfig, ...]:
        return tuple(getattr(entry, _sink_kind(entry) or "") for entry in self.sink_entries)

    @property
    def changelog_retention_s(self) -> float:
        return parse_duration(self.changelog_retention)

    @property
    def namespace(self) -> str:
        return self.table_name.rsplit(".", 1)[0]

    @property
    def name(self) -> str:
        return self.table_name.rsplit(".", 1)[1]

    @property
    def polling_interval_s(self) -> float:
        return parse_duration(self.polling_interval)


class IngestConfig(Keyed):
    """Debezium-style change events from landing files or a stream (NATS JetStream, Redis Streams) into Iceberg."""

    name: str = Field(min_length=1, description="names the ingest asset, sensor and line")
    landing: LocationOrUri | None = Field(default=None, description="directory of landing files (relative to the "
                                                                    "pipeline file); the same as input.landing.path")
    input_entry: InputEntry | None = Field(default=None, alias="input",
                                           description="where the events come from: {landing: {path: ...}}, "
                                                       "{nats_jetstream: {...}} or {redis_stream: {...}}")
    target: str = Field(description="target table, or a template over envelope fields: db.{source.table}")
    catalog: str | None = Field(default=None, strict=True, min_length=1,
                                description="the catalog the targets (and their dead-letter tables) live in: a name "
                                            "under catalogs (default: the default catalog)")
    identifier_columns: Names | dict[str, Names] = Field(
        default=(), description="upsert key; per routed target: {table or short name: [columns]}")
    write_mode: WriteMode | dict[str, WriteMode] = Field(
        default="merge", description="merge (a MERGE that reads the target) or equality_deletes (data files + "
                                     "equality deletes, no read of the target; readers must apply them); per "
                                     "routed target: {table or short name: mode}")
    auto_create: Flag = Field(default=False, description="create missing targets (declared or inferred schema)")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema",
                                          description="declared schema of a created target: columns, "
                                                      "partition_spec, table_properties")
    schema_evolution: Flag = Field(default=False, description="add new fields as columns, widen types safely")
    files_per_batch: PositiveInt = Field(default=1, description="landing files per batch (one commit per target); "
                                                               "with input.landing, set it there")
    polling_interval: Duration = Field(default="PT30S", description="sensor interval")
    max_retries: NonNegativeInt = Field(default=3, description="automatic retries of a failed batch")
    max_file_age: Duration = Field(default="P7D", description="the ledger keeps landing files younger than this "
                                                              "(Spark's maxFileAge, against the newest file); an "
                                                              "older file never ingested is counted, not ingested")
    take_expired_files: Flag = Field(default=False, description="ingest landing files older than max_file_age "
                                                                "that were never ingested, instead of counting them")
    snapshot_deletes: Flag = Field(default=True, description="a completed Debezium snapshot (first .. last) is the "
                                                             "table's whole content: rows it lacks are deleted "
                                                             "(off: snapshots only upsert)")

    @property
    def max_file_age_s(self) -> float:
        """The ledger's horizon: input.landing's ``max_file_age`` when given there, else the entry's."""
        spelled = self._landing_block()
        return parse_duration(spelled.max_file_age if spelled is not None else self.max_file_age)

    @property
    def landing_files_per_batch(self) -> int:
        spelled = self._landing_block()
        return spelled.files_per_batch if spelled is not None else self.files_per_batch

    @property
    def takes_expired_files(self) -> bool:
        spelled = self._landing_block()
        return spelled.take_expired_files if spelled is not None else self.take_expired_files

    def _landing_block(self) -> LandingConfig | None:
        if self.input_entry is None:
            return None
        block = getattr(self.input_entry, _sink_kind(self.input_entry) or "")
        return block if isinstance(block, LandingConfig) else None

    @property
    def landing_input(self) -> LandingConfig | None:
        """The landing input, from either spelling (``input: {landing: ...}`` or the entry's ``landing:``);
        None for a broker input."""
        spelled = self._landing_block()
        if spelled is not None or self.landing is None:
            return spelled
        return LandingConfig(path=self.landing, files_per_batch=self.files_per_batch, max_file_age=self.max_file_age,
                             take_expired_files=self.take_expired_files)

    @property
    def schema(self) -> dict[str, Any] | None:  # type: ignore[override]
        return self.schema_

    @property
    def input(self) -> InputConfig | None:
        """The broker (stream) input, or None for landing files (either spelling: see :attr:`landing_input`)."""
        if self.input_entry is None or self._landing_block() is not None:
            return None
        return getattr(self.input_entry, _sink_kind(self.input_entry) or "")

    @property
    def any_input(self) -> InputConfig:
        """The entry's input plugin, whichever kind (landing files included): one contract for all."""
        found = self.landing_input or self.input
        assert found is not None, "validated: exactly one of landing and input"
        return found

    @property
    def landing_path(self) -> str:
        """The landing directory (an entry with a stream input has none: an error names the entry)."""
        landing_input = self.landing_input
        if landing_input is None:
            raise ConfigError(f"ingest {self.name}: reads a stream input, not landing files")
        return landing_input.path

    @property
    def source(self) -> str:
        """What the ledger names as this entry's source: the landing location or the stream input's name."""
        stream = self.input
        return stream.source if stream is not None else self.landing_path

    @property
    def polling_interval_s(self) -> float:
        return parse_duration(self.polling_interval)

    @field_validator("target")
    @classmethod
    def _routable(cls, target: str) -> str:
        if routing.is_template(target):
            routing.namespace_of(target)  # ValueError names the fixed namespace rule
        elif not is_table_name(target):
            raise ValueError("expected <namespace>.<table> or a template like db.{source.table}")
        return target

    @model_validator(mode="after")
    def _declared_schema(self) -> "IngestConfig":
        """A declared schema's types, keys and partition spec, checked at load (YAML's flow style splits
        ``{type: decimal(10,2)}`` at its comma: found at load, not by the batch that creates the table)."""
        if self.schema_ is not None and not routing.is_template(self.target):
            keys = self.identifier_columns if not isinstance(self.identifier_columns, dict) else ()
            try:
                check_declared(self.schema_, self.target, keys)
            except SchemaDeclarationError as exc:
                raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _one_schema_per_table(self) -> "IngestConfig":
        if self.schema_ is not None and routing.is_template(self.target):
            raise ValueError("a declared schema describes one table, but the target is a routing template that "
                             "writes many: drop 'schema' (the schema is inferred per table) or use a fixed target")
        if (self.landing is None) == (self.input_entry is None):
            raise ValueError("give exactly one of 'landing' (a directory of landing files) and 'input' (a stream)")
        misplaced = sorted({"files_per_batch", "max_file_age", "take_expired_files"} & self.model_fields_set)
        if self._landing_block() is not None and misplaced:
            raise ValueError(f"with input.landing, set {', '.join(misplaced)} under input.landing")
        if isinstance(self.identifier_columns, dict) and not routing.is_template(self.target):
            raise ValueError("identifier_columns per target only applies to a routing template; "
                             "give a list of columns for a fixed target")
        if isinstance(self.write_mode, dict) and not routing.is_template(self.target):
            raise ValueError("write_mode per target only applies to a routing template; "
                             "give one mode (merge or equality_deletes) for a fixed target")
        return self


class CatalogConfig(Model):
    """The Iceberg catalog that pyiceberg and Spark share."""

    type: Literal[CATALOG_TYPES] = Field(  # type: ignore[valid-type]
        default="sql", description="rest (an Iceberg REST catalog: Polaris, Nessie, Unity Catalog, Lakekeeper, "
                                   "S3 Tables, ...; tested), sql (SQLite/PostgreSQL, shared with Spark's JDBC "
                                   "catalog; tested), hive or glue (passed through unchanged)")
    name: str = Field(default="lake", pattern=r"^[A-Za-z_]\w*$", description="catalog name in Spark SQL")
    uri: LocationOrUri = Field(default="sqlite:///lake/catalog.db", validate_default=True,
                               description="rest: the catalog's base URL (http://host:8181, https://.../api/catalog); "
                                           "sql: a SQLAlchemy URL (relative SQLite paths are relative to the file)")
    warehouse: str | None = Field(
        default=None, strict=True,
        description="rest: the warehouse name the catalog asks for, passed as written (a Polaris catalog, a "
                    "Lakekeeper warehouse, an S3 table bucket ARN); unset: none sent. sql: where table files go, "
                    "path or URI (default lake/warehouse, relative paths: relative to the file)")
    password: Secret | None = Field(default=None, description="sql: catalog database password: {env: VARIABLE}")
    properties: dict[str, PropertyValue] = Field(
        default_factory=dict,
        description="extra catalog properties for both engines, e.g. rest: token, credential, oauth2-server-uri, "
                    "scope, prefix, header.<Name>; a value may be {env: VARIABLE}, and secrets (token, credential, "
                    "header.Authorization, *secret*, *password*) must be")

    @model_validator(mode="before")
    @classmethod
    def _sql_warehouse_is_a_path(cls, data: Any, info: ValidationInfo) -> Any:
        """A SQL catalog's warehouse is where its table files go (a path relative to the file); other
        catalogs name their warehouse themselves (a Polaris catalog, an ARN) and get it as written."""
        if isinstance(data, dict) and data.get("type", "sql") == "sql":
            warehouse = data.get("warehouse") or "lake/warehouse"
            if isinstance(warehouse, str):
                data = {**data, "warehouse": local_path(warehouse, info)}
        return data

    @field_validator("properties")
    @classmethod
    def _secrets_from_the_environment(cls, properties: dict[str, EnvRef | str]) -> dict[str, EnvRef | str]:
        for key, value in properties.items():
            if is_secret_property(key) and not isinstance(value, EnvRef):
                raise ValueError(f"{key!r} holds a secret: write {key}: {{env: VARIABLE_NAME}}, never the value")
        return properties

    @model_validator(mode="after")
    def _usable(self) -> "CatalogConfig":
        try:
            self._settings(resolve=False).check()
        except ConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return self

    def settings(self, key: str = "catalog") -> CatalogSettings:
        """Both engines' settings, secrets read from the environment now (an unset one is an error).
        ``key``: where the block is in the file (``catalog``, ``catalogs.analytics``), for the message.

        Raises:
            ConfigError: a ``properties`` value names an environment variable that is not set.
        """
        return self._settings(resolve=True, key=key)

    def _settings(self, resolve: bool, key: str = "catalog") -> CatalogSettings:
        uri = with_password(self.uri, self.type, self.password.resolve() if self.password is not None else None)
        properties = {}
        for prop, value in self.properties.items():
            if isinstance(value, EnvRef):
                if value.resolve() is None and resolve:
                    raise ConfigError(f"{key}.properties.{prop}: environment variable {value.name} is not set")
                value = value.resolve() or ""
            properties[prop] = value
        return CatalogSettings(self.name, uri, self.warehouse, properties, type=self.type)


class SparkConfig(Model):
    """The SparkSession every run shares (local by default)."""

    master: str = Field(default="local[*]", description="Spark master URL")
    app_name: str = Field(default="icecdc_dagster", description="Spark application name")
    conf: dict[str, str | int | float | bool] = Field(default_factory=dict, description="spark.* settings")
    jars: tuple[str, ...] = Field(default=(), description="extra jars (a cluster's own Iceberg runtime)")
    spark_config: dict[str, Any] = Field(default_factory=dict, description="dagster-pyspark's spark_config, as a "
                                                                          "Dagster user has it (flat or nested); "
                                                                          "conf wins where both set a key")

    def settings(self) -> SparkSettings:
        return SparkSettings(master=self.master, app_name=self.app_name,
                             conf={k: str(v) for k, v in self.conf.items()}, jars=self.jars)


class LineageConfig(Model):
    """OpenLineage events per batch step; OpenLineage's own configuration (OPENLINEAGE_URL,
    openlineage.yml) also turns them on."""

    enabled: Flag | None = Field(default=None, description="false: never emit; true: emit with OpenLineage's "
                                                           "own configuration; unset: emit when one is found")
    namespace: str = Field(default="icecdc", min_length=1, description="OpenLineage job namespace")
    transport: dict[str, Any] | None = Field(default=None, description="an OpenLineage client transport, e.g. "
                                                                       "{type: http, url: ...} or {type: file, ...}")


class InstanceConfig(Model):
    """Where the Dagster instance keeps runs, events and schedules (written into a new ``dagster.yaml``)."""

    storage: Literal["sqlite", "postgres"] = Field(
        default="sqlite", description="sqlite: files under DAGSTER_HOME; postgres: a PostgreSQL database shared "
                                      "by the daemon, dagster dev and every icecdc command (line locks become "
                                      "PostgreSQL advisory locks)")
    postgres_url: Secret | None = Field(default=None, description="postgres: the database URL, {env: VARIABLE}")

    @model_validator(mode="after")
    def _url_for_postgres(self) -> "InstanceConfig":
        if self.storage == "postgres" and self.postgres_url is None:
            raise ValueError("storage: postgres needs postgres_url: {env: VARIABLE} (e.g. DAGSTER_PG_URL)")
        return self


def _directory(value: str, info: ValidationInfo) -> str:
    """A local directory, relative to the pipeline file (a model built in code keeps what it was given)."""
    if not info.context or "base_dir" not in info.context:
        return value
    return str((Path(info.context["base_dir"]) / Path(value).expanduser()).resolve())


class PipelineConfig(Model):
    """The pipeline file."""

    catalog: CatalogConfig = Field(default_factory=CatalogConfig,
                                   description="the default catalog: the source tables, their changelog stores, "
                                               "and every replica or ingest target that names no other")
    catalogs: dict[str, CatalogConfig] = Field(
        default_factory=dict,
        description="more catalogs by name (the key is the catalog's name in Spark SQL; a block takes what "
                    "'catalog' takes, and must give uri, and warehouse for sql): a replica (sinks[].iceberg.catalog) "
                    "or an ingest target (ingest[].catalog) lives there when it names one")
    spark: SparkConfig = Field(default_factory=SparkConfig)
    tables: tuple[TableConfig, ...] = ()
    ingest: tuple[IngestConfig, ...] = ()
    lineage: LineageConfig = Field(default_factory=LineageConfig)
    instance: InstanceConfig = Field(default_factory=InstanceConfig)
    snapshot_sensors: Literal["auto", "per_table", "one"] = Field(
        default="auto",
        description="per_table: one sensor per table (pause, resume and tick history per table in the UI); one: a "
                    "single sensor plans every table in one tick (same runs, in the same order, less CPU at rest and "
                    f"per batch, a lower p95); auto: per_table below {ONE_SENSOR_FROM_TABLES} tables, one from there "
                    "on (docs/performance.md, 'Sensor layout')")
    dagster_home: Annotated[str, Field(strict=True, min_length=1), AfterValidator(_directory)] | None = Field(
        default=None, description="the Dagster instance directory this pipeline runs in (relative to the pipeline "
                                  "file); icecdc commands use it when neither --dagster-home nor $DAGSTER_HOME is set")
    _source: str = PrivateAttr(default="<defaults>")

    @property
    def sensor_layout(self) -> Literal["per_table", "one"]:
        """The layout ``snapshot_sensors`` stands for with this file's tables (``auto`` resolved)."""
        if self.snapshot_sensors != "auto":
            return self.snapshot_sensors
        return "one" if len(self.tables) >= ONE_SENSOR_FROM_TABLES else "per_table"

    @property
    def source(self) -> str:
        """The pipeline file this was loaded from (named in every error)."""
        return self._source

    @model_validator(mode="before")
    @classmethod
    def _named_catalogs(cls, data: Any) -> Any:
        """A ``catalogs:`` block is named by its key; naming the default catalog by its name is naming none."""
        if not isinstance(data, dict):
            return data
        named = data.get("catalogs")
        if isinstance(named, dict):
            data = {**data, "catalogs": {key: _named_block(key, block) for key, block in named.items()}}
        default = data.get("catalog", {}).get("name", "lake") if isinstance(data.get("catalog"), dict) else "lake"
        return _unname_default(data, default)

    @model_validator(mode="after")
    def _unique(self) -> "PipelineConfig":
        _unique("tables", [t.table_name for t in self.tables])
        _unique("sinks", [f"{s.kind}:{s.target}" for t in self.tables for s in t.sinks])
        _unique("ingest", [e.name for e in self.ingest])
        if self.catalog.name in self.catalogs:
            raise ValueError(f"catalogs.{self.catalog.name}: {self.catalog.name!r} is the default catalog's name "
                             "(catalog.name); give the other catalog another name")
        for path, name in self._catalog_references():
            if name not in self.catalogs:
                known = ", ".join(sorted({self.catalog.name, *self.catalogs}))
                raise ValueError(f"{path}: unknown catalog {name!r} (the pipeline's catalogs: {known})")
        self._followed_targets_in_the_default_catalog()
        return self

    def _catalog_references(self) -> list[tuple[str, str]]:
        """(key path, catalog name) of every sink and ingest entry that names a catalog."""
        found = []
        for i, table in enumerate(self.tables):
            for j, sink in enumerate(table.sinks):
                if sink.target_catalog is not None:
                    found.append((f"tables[{i}] ({table.table_name}).sinks[{j}].{sink.kind}.catalog",
                                  sink.target_catalog))
        found += [(f"ingest[{i}] ({entry.name}).catalog", entry.catalog)
                  for i, entry in enumerate(self.ingest) if entry.catalog is not None]
        return found

    def _followed_targets_in_the_default_catalog(self) -> None:
        """``tables:`` are in the default catalog: an ingest entry writing one of them writes it there."""
        followed = {t.table_name for t in self.tables}
        for i, entry in enumerate(self.ingest):
            if entry.catalog is not None and not routing.is_template(entry.target) and entry.target in followed:
                raise ValueError(f"ingest[{i}] ({entry.name}).catalog: its target {entry.target} is also a table "
                                 f"of tables:, which are in the default catalog ({self.catalog.name}); drop catalog "
                                 f"to follow what it writes, or name another target")

    def catalog_config(self, name: str | None) -> CatalogConfig:
        """The catalog block named ``name`` (None or the default's name: the default catalog).

        Raises:
            ConfigError: no catalog of that name (a model built in code; a loaded file was checked).
        """
        if name is None or name == self.catalog.name:
            return self.catalog
        if name not in self.catalogs:
            raise ConfigError(f"{self.source}: unknown catalog {name!r}")
        return self.catalogs[name]

    def catalog_settings(self, name: str | None = None) -> CatalogSettings:
        """Both engines' settings of catalog ``name`` (None: the default), secrets read now.

        Raises:
            ConfigError: an unknown catalog, or a secret's environment variable is not set.
        """
        key = "catalog" if name is None or name == self.catalog.name else f"catalogs.{name}"
        return self.catalog_config(name).settings(key)

    def table(self, table_name: str) -> TableConfig:
        for table in self.tables:
            if table.table_name == table_name:
                return table
        raise ConfigError(f"{self.source}: no table {table_name!r} in tables")


def _named_block(key: Any, block: Any) -> Any:
    """A named catalog's block with its name (the key) and nothing left to a default that would put it
    where the default catalog is (the same SQLite file and warehouse)."""
    if not isinstance(block, dict):
        return block
    if "name" in block and block["name"] != key:
        raise ValueError(f"catalogs.{key}.name: a named catalog's name is its key ({key!r}), not {block['name']!r}")
    missing = [k for k in ("uri", *(("warehouse",) if block.get("type", "sql") == "sql" else ())) if k not in block]
    if missing:
        raise ValueError(f"catalogs.{key}: a named catalog gives {' and '.join(missing)} (no default: the default "
                         "catalog's would be used)")
    return {**block, "name": key}


def _unname_default(data: dict[str, Any], default: str) -> dict[str, Any]:
    """``catalog: <the default's name>`` on a sink or an ingest entry is the default catalog: spelled None."""
    entries = data.get("ingest")
    if isinstance(entries, list):
        data = {**data, "ingest": [{k: v for k, v in e.items() if k != "catalog"}
                                   if isinstance(e, dict) and e.get("catalog") == default else e for e in entries]}
    tables = data.get("tables")
    if not isinstance(tables, list):
        return data
    changed = []
    for table in tables:
        sinks = table.get("sinks") if isinstance(table, dict) else None
        if isinstance(sinks, list) and any(_names_default(sink, default) for sink in sinks):
            table = {**table, "sinks": [_without_catalog(sink) if _names_default(sink, default) else sink
                                        for sink in sinks]}
        changed.append(table)
    return {**data, "tables": changed}


def _names_default(sink: Any, default: str) -> bool:
    if not isinstance(sink, dict) or len(sink) != 1:
        return False
    block = next(iter(sink.values()))
    return isinstance(block, dict) and block.get("catalog") == default


def _without_catalog(sink: dict[str, Any]) -> dict[str, Any]:
    kind, block = next(iter(sink.items()))
    return {kind: {k: v for k, v in block.items() if k != "catalog"}}


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what}: {name!r} is declared twice")
        seen.add(name)
