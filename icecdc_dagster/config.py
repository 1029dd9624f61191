"""The pipeline file: one YAML that declares catalog, Spark, tables with their sinks, and ingestion.

Validation is strict and early: an unknown key, a missing table name or an
unknown sink type fails at load with the file, the key path and what is wrong.
Secrets are never written in the file: ``password: {env: OS_PASSWORD}``.
"""

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from icecdc_dagster.errors import ConfigError
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings

CONFIG_ENV = "ICECDC_CONFIG"
_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?"
    r"(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$")
_TABLE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


def parse_duration(text: str) -> float:
    """ISO-8601 duration (``PT30S``, ``PT5M``, ``P1DT2H``) in seconds."""
    match = _DURATION.match(str(text).strip())
    if not match or text in ("P", "PT") or str(text).endswith("T"):
        raise ValueError(f"{text!r} is not an ISO-8601 duration like PT30S")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    if not parts:
        raise ValueError(f"{text!r} is not an ISO-8601 duration like PT30S")
    return (parts.get("days", 0) * 86400 + parts.get("hours", 0) * 3600
            + parts.get("minutes", 0) * 60 + parts.get("seconds", 0))


# Counts where 0 means "never" (e.g. no automatic retry).
_MAY_BE_ZERO = frozenset({"max_retries"})


@dataclass(frozen=True)
class EnvRef:
    """A value taken from an environment variable when it is used, never stored."""

    name: str

    def resolve(self) -> str | None:
        return os.environ.get(self.name)


@dataclass(frozen=True)
class OpenSearchSinkConfig:
    index: str
    hosts: tuple[str, ...] = ("http://localhost:9200",)
    username: str | EnvRef | None = None
    password: EnvRef | None = None
    verify_certs: bool = True
    ca_certs: str | None = None
    chunk_size: int = 500
    max_chunk_bytes: int = 10 * 1024 * 1024
    parallelism: int = 2
    max_retries: int = 5
    refresh: bool = True
    request_timeout_s: float = 60.0
    mapping: dict | None = None

    kind = "opensearch"

    @property
    def asset_name(self) -> str:
        return self.index


@dataclass(frozen=True)
class IcebergSinkConfig:
    table_name: str

    kind = "iceberg"

    @property
    def asset_name(self) -> str:
        return self.table_name


SinkConfig = OpenSearchSinkConfig | IcebergSinkConfig
SINK_TYPES: dict[str, type] = {"opensearch": OpenSearchSinkConfig, "iceberg": IcebergSinkConfig}


@dataclass(frozen=True)
class TableConfig:
    table_name: str
    identifier_columns: tuple[str, ...] = ()
    disable_export: bool = False
    polling_interval: str = "PT30S"
    max_snapshots_per_run: int = 10
    max_retries: int = 3
    # Declares a table without identifier columns (and without v3 row lineage) insert-only, so an
    # OpenSearch sink may index it with generated ids; a DELETE then fails its batch.
    append_only: bool = False
    sinks: tuple[SinkConfig, ...] = ()
    # Maintenance of the table group (asset maintenance/<ns>/<table>, on this cron schedule):
    maintenance_schedule: str = "0 3 * * *"
    compact_delete_files: int = 50    # compact a replica / ingest target when a partition has more delete files
    changelog_retention: str = "P7D"  # applied changelog batches and replica snapshots older than this are expired

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


@dataclass(frozen=True)
class IngestConfig:
    name: str
    landing: str
    target: str
    identifier_columns: tuple[str, ...] = ()
    auto_create: bool = False
    schema: dict | None = None
    schema_evolution: bool = False
    files_per_batch: int = 1
    polling_interval: str = "PT30S"
    max_retries: int = 3

    @property
    def polling_interval_s(self) -> float:
        return parse_duration(self.polling_interval)


@dataclass(frozen=True)
class CatalogConfig:
    name: str = "lake"
    uri: str = "sqlite:///lake/catalog.db"
    warehouse: str = "lake/warehouse"
    password: EnvRef | None = None
    properties: dict = field(default_factory=dict)

    def settings(self) -> CatalogSettings:
        uri = self.uri
        if self.password is not None and self.password.resolve():
            from sqlalchemy.engine import make_url

            uri = make_url(uri).set(password=self.password.resolve()).render_as_string(hide_password=False)
        return CatalogSettings(self.name, uri, self.warehouse, {k: str(v) for k, v in self.properties.items()})


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    app_name: str = "icecdc_dagster"
    conf: dict = field(default_factory=dict)
    jars: tuple[str, ...] = ()

    def settings(self) -> SparkSettings:
        return SparkSettings(master=self.master, app_name=self.app_name,
                             conf={k: str(v) for k, v in self.conf.items()}, jars=self.jars)


@dataclass(frozen=True)
class PipelineConfig:
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    tables: tuple[TableConfig, ...] = ()
    ingest: tuple[IngestConfig, ...] = ()
    source: str = "<defaults>"

    def table(self, table_name: str) -> TableConfig:
        for table in self.tables:
            if table.table_name == table_name:
                return table
        raise ConfigError(f"{self.source}: no table {table_name!r} in tables")


class _Reader:
    """Builds dataclasses from YAML mappings, naming the file and key path on error."""

    def __init__(self, source: str, base_dir: Path):
        self.source = source
        self.base_dir = base_dir

    def fail(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path}: {message}")

    def mapping(self, value: Any, path: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {type(value).__name__}")
        return value

    def build(self, cls: type, value: Any, path: str, **overrides: Any) -> Any:
        data = self.mapping(value, path)
        known = {f.name: f for f in fields(cls) if f.name != "source"}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise self.fail(f"{path}.{unknown[0]}", f"unknown key (expected one of: {', '.join(sorted(known))})")
        kwargs: dict[str, Any] = {}
        for name, spec in known.items():
            if name in overrides:
                kwargs[name] = overrides[name]
            elif name in data:
                kwargs[name] = self.scalar(spec, data[name], f"{path}.{name}")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            missing = [n for n, f in known.items() if n not in kwargs and _required(f)]
            raise self.fail(path, f"missing required key {missing[0] if missing else ''!r}") from exc

    def scalar(self, spec: Any, value: Any, path: str) -> Any:
        type_text = str(spec.type)
        if "EnvRef" in type_text:
            return self.secret(value, path, allow_plain=spec.name != "password")
        if spec.type is bool:
            if not isinstance(value, bool):
                raise self.fail(path, f"expected true or false, got {value!r}")
            return value
        if spec.type is int:
            lowest = 0 if spec.name in _MAY_BE_ZERO else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                kind = "a non-negative" if lowest == 0 else "a positive"
                raise self.fail(path, f"expected {kind} integer, got {value!r}")
            return value
        if spec.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise self.fail(path, f"expected a positive number, got {value!r}")
            return float(value)
        if "tuple[str" in type_text:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                raise self.fail(path, f"expected a list of strings, got {value!r}")
            return tuple(items)
        if spec.type is dict or "dict" in type_text:
            if value is not None and not isinstance(value, dict):
                raise self.fail(path, f"expected a mapping, got {type(value).__name__}")
            return value
        if spec.type is str or "str" in type_text:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise self.fail(path, f"expected a string, got {value!r}")
            return str(value)
        return value

    def secret(self, value: Any, path: str, allow_plain: bool) -> Any:
        if value is None:
            return None
        if isinstance(value, dict):
            if set(value) != {"env"} or not isinstance(value["env"], str):
                raise self.fail(path, "expected {env: VARIABLE_NAME}")
            return EnvRef(value["env"])
        if allow_plain and isinstance(value, str):
            return value
        raise self.fail(path, "secrets must come from the environment: write {env: VARIABLE_NAME}")

    def path_uri(self, value: str) -> str:
        """Relative warehouse paths and SQLite files are relative to the config file."""
        if value.startswith("sqlite:///") and not value.startswith("sqlite:////"):
            return "sqlite:///" + str((self.base_dir / value[len("sqlite:///"):]).resolve())
        if "://" not in value:
            return "file://" + str((self.base_dir / value).resolve())
        return value


def _required(spec: Any) -> bool:
    from dataclasses import MISSING

    return spec.default is MISSING and spec.default_factory is MISSING


def parse_config(data: Any, source: str = "<config>", base_dir: Path | None = None) -> PipelineConfig:
    reader = _Reader(source, base_dir or Path.cwd())
    root = reader.mapping(data, "<root>")
    unknown = sorted(set(root) - {"catalog", "spark", "tables", "ingest"})
    if unknown:
        raise reader.fail(unknown[0], "unknown key (expected one of: catalog, ingest, spark, tables)")
    catalog = reader.build(CatalogConfig, root.get("catalog"), "catalog")
    catalog = CatalogConfig(catalog.name, reader.path_uri(catalog.uri), reader.path_uri(catalog.warehouse),
                            catalog.password, catalog.properties or {})
    try:
        catalog.settings().backend  # noqa: B018 - validates the URI scheme
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    spark = reader.build(SparkConfig, root.get("spark"), "spark")

    tables = []
    raw_tables = root.get("tables") or []
    if not isinstance(raw_tables, list):
        raise reader.fail("tables", "expected a list of tables")
    for i, raw in enumerate(raw_tables):
        path = f"tables[{i}]"
        raw = reader.mapping(raw, path)
        if not raw.get("table_name"):
            raise reader.fail(f"{path}.table_name", "missing required key 'table_name'")
        path = f"tables[{i}] ({raw['table_name']})"
        sinks = tuple(_sink(reader, s, f"{path}.sinks[{j}]") for j, s in enumerate(raw.get("sinks") or []))
        table = reader.build(TableConfig, raw, path, sinks=sinks)
        if not _TABLE_NAME.match(table.table_name):
            raise reader.fail(f"{path}.table_name", "expected <namespace>.<table>")
        try:
            table.polling_interval_s  # noqa: B018
        except ValueError as exc:
            raise reader.fail(f"{path}.polling_interval", str(exc)) from None
        try:
            table.changelog_retention_s  # noqa: B018
        except ValueError as exc:
            raise reader.fail(f"{path}.changelog_retention", str(exc)) from None
        tables.append(table)
    _unique(reader, "tables", [t.table_name for t in tables])
    _unique(reader, "sinks", [f"{s.kind}:{s.asset_name}" for t in tables for s in t.sinks])

    ingests = []
    raw_ingest = root.get("ingest") or []
    if not isinstance(raw_ingest, list):
        raise reader.fail("ingest", "expected a list of ingestion entries")
    for i, raw in enumerate(raw_ingest):
        entry = reader.build(IngestConfig, raw, f"ingest[{i}]")
        ingests.append(IngestConfig(**{**entry.__dict__, "landing": reader.path_uri(entry.landing)}))
    _unique(reader, "ingest", [e.name for e in ingests])
    return PipelineConfig(catalog=catalog, spark=spark, tables=tuple(tables), ingest=tuple(ingests), source=source)


def _sink(reader: _Reader, raw: Any, path: str) -> SinkConfig:
    raw = reader.mapping(raw, path)
    if len(raw) != 1:
        raise reader.fail(path, f"a sink is one of {sorted(SINK_TYPES)} with its settings, e.g. 'opensearch: {{index: x}}'")
    (kind, settings), = raw.items()
    if kind not in SINK_TYPES:
        raise reader.fail(f"{path}.{kind}", f"unknown sink type (expected one of: {', '.join(sorted(SINK_TYPES))})")
    sink = reader.build(SINK_TYPES[kind], settings, f"{path}.{kind}")
    if isinstance(sink, IcebergSinkConfig) and not _TABLE_NAME.match(sink.table_name):
        raise reader.fail(f"{path}.iceberg.table_name", "expected <namespace>.<table>")
    return sink


def _unique(reader: _Reader, path: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise reader.fail(path, f"{name!r} is declared twice")
        seen.add(name)


def load_config(path: str | os.PathLike | None = None) -> PipelineConfig:
    """Load the pipeline file at ``path``, or ``$ICECDC_CONFIG``; no file means an empty pipeline."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        return PipelineConfig()
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{file}: pipeline config file not found")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    return parse_config(data, str(file), file.resolve().parent)
