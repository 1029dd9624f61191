"""Debezium landing files -> Iceberg tables: one batch per file (or bounded group), exactly once.

Row work runs in executors: files are read by Spark's text reader, each line named by its line number
(:mod:`landing_lines`), parsed and routed (:mod:`debezium`, :mod:`routing`), then coerced per target
(:mod:`coercion`; or typed natively, :mod:`native`). The driver
only sees aggregates: the distinct (target, field, type) triples and counts.
The ledger is the targets' own history: every commit records the batch id, the
landing location and the full list of tables the batch writes.
"""

import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.errors import TargetTableMissingError
from icecdc_dagster.ingest import dead_letters, horizon, landing, landing_lines, native, routing, snapshot_epoch
from icecdc_dagster.ingest.coercion import IGNORED_FIELDS, STRINGIFIED, CoercionError, coerce
from icecdc_dagster.ingest.columns import NOTES, RAW, REASON, SOURCE_FILE, SOURCE_OFFSET, TOMBSTONE, WIDEN
from icecdc_dagster.ingest.debezium import DELETE, INSERT, NANOS_TRUNCATED, EventError, loads, parse_line
from icecdc_dagster.ingest.schema_inference import merge_types, spark_type, widened
from icecdc_dagster.writer import (
    BATCH_ID_PROPERTY,
    EQUALITY_DELETES,
    MERGE,
    OP_COLUMN,
    OP_DELETE,
    OP_INSERT,
    OP_UPSERT,
    ORDER_COLUMN,
    KeyBounds,
    LedgerRetention,
    add_columns,
    bounds_aggregates,
    bounds_from,
    create_table,
    declared_columns,
    ensure_namespace,
    java_table,
    namespace_exists,
    recorded_summaries,
    table_exists,
    table_properties,
    widen_columns,
    write_batch,
    write_equality_delta,
)

if TYPE_CHECKING:
    from pyspark.sql import Row

LANDING_PROPERTY = "icecdc.landing"
TARGETS_PROPERTY = "icecdc.batch-targets"
ORDER_FILE_SHIFT = 1 << 40
PARSED_SCHEMA = T.StructType([
    T.StructField("file_index", T.LongType()), T.StructField("source_file", T.StringType()),
    T.StructField("source_offset", T.LongType()), T.StructField("raw", T.StringType()),
    T.StructField("target", T.StringType()), T.StructField("op", T.StringType()),
    T.StructField("reason", T.StringType()),
    # (name, Iceberg type) in the envelope's field order: a list, since a map would lose that order
    T.StructField("field_types", T.ArrayType(T.StructType([T.StructField("name", T.StringType()),
                                                           T.StructField("type", T.StringType())])))])
# Declared coercion rules whose applications every run counts (docs/ingestion.md).
RULE_COUNTS = (IGNORED_FIELDS, STRINGIFIED, NANOS_TRUNCATED)
# Lines the native reader routed to the Python rules (a native-path batch counts them: they cost the most).
PYTHON_RULES = "python_rules"


@dataclass(frozen=True)
class IngestSettings:
    """One ``ingest:`` entry. ``target`` is a table name or a template over envelope fields."""

    landing: str
    target: str
    identifier_columns: tuple[str, ...] | Mapping[str, tuple[str, ...]] = ()
    auto_create: bool = False
    schema: Mapping[str, Any] | None = None
    schema_evolution: bool = False
    files_per_batch: int = 1
    max_file_age_s: float = horizon.DEFAULT_MAX_FILE_AGE_S  # the ledger's horizon (``ingest.horizon``)
    take_expired_files: bool = False                        # ingest files past the horizon anyway
    write_mode: str | Mapping[str, str] = MERGE  # merge | equality_deletes; a mapping keys routed tables
    snapshot_deletes: bool = True  # a completed Debezium snapshot deletes the rows it lacks (snapshot_epoch)

    def keys_for(self, table: str) -> tuple[str, ...]:
        """Identifier columns of one target (a mapping keys routed tables by full or short name)."""
        if isinstance(self.identifier_columns, Mapping):
            cols = self.identifier_columns.get(table) or self.identifier_columns.get(table.rsplit(".", 1)[-1]) or ()
            return tuple(cols)
        return tuple(self.identifier_columns)

    def mode_for(self, table: str) -> str:
        """Write mode of one target (a mapping keys routed tables by full or short name; default merge)."""
        if isinstance(self.write_mode, Mapping):
            return str(self.write_mode.get(table) or self.write_mode.get(table.rsplit(".", 1)[-1]) or MERGE)
        return str(self.write_mode)


@dataclass(frozen=True)
class TargetResult:
    table: str
    skipped: bool
    snapshot_id: int | None
    counts: dict[str, int] = field(default_factory=dict)
    added_columns: tuple[str, ...] = ()
    widened_columns: tuple[str, ...] = ()  # "name: old -> new" promotions made for this batch


@dataclass(frozen=True)
class IngestResult:
    batch_id: str
    files: tuple[str, ...]
    skipped: bool
    targets: dict[str, TargetResult] = field(default_factory=dict)
    tombstones: int = 0
    events_read: int = 0  # every line of the batch: events, tombstones and dead letters
    expired: tuple[str, ...] = ()  # files past the ledger's horizon no batch records: set aside, not written

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {"events_read": self.events_read, "tombstones": self.tombstones,
                               "expired_files": len(self.expired)}
        for target in self.targets.values():
            for key, value in target.counts.items():
                out[key] = out.get(key, 0) + value
        return out


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _home_table(settings: IngestSettings) -> str:
    """Where events without a target go (and where an all-tombstone batch is recorded)."""
    if routing.is_template(settings.target):
        return routing.unrouted_dead_letter_table(settings.target)
    return routing.dead_letter_table(settings.target)


def _ledger_tables(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    if routing.is_template(settings.target):
        namespace = routing.namespace_of(settings.target)
        if not namespace_exists(spark, catalog_name, namespace):
            return []  # a fresh catalog: nothing ingested yet
        rows = spark.sql(f"SHOW TABLES IN {catalog_name}.{namespace}").collect()
        return [f"{namespace}.{r.tableName}" for r in rows]
    return [t for t in (settings.target, routing.dead_letter_table(settings.target))
            if table_exists(spark, catalog_name, t)]


@dataclass(frozen=True)
class Ledger:
    """What the targets of a landing location record: batch id -> committed to every table it writes, the
    recorded summaries of this landing, and the ledger tables' properties (for the horizon)."""

    batches: dict[str, bool]
    summaries: list[dict[str, str]]
    properties: list[dict[str, str]]

    def parts(self) -> set[str]:
        """Every ``<uri>#<start>-<end>`` part of a recorded batch (complete or not)."""
        return {part for bid in self.batches for part in bid.split(";")}


def read_ledger(spark: Any, catalog_name: str, settings: IngestSettings) -> Ledger:
    seen: dict[str, set[str]] = {}
    wanted: dict[str, set[str]] = {}
    summaries: list[dict[str, str]] = []
    properties: list[dict[str, str]] = []
    for table in _ledger_tables(spark, catalog_name, settings):
        properties.append(table_properties(java_table(spark, f"{catalog_name}.{table}")))
        for summary in recorded_summaries(spark, f"{catalog_name}.{table}"):  # survives snapshot expiry
            if summary.get(LANDING_PROPERTY) == settings.landing and BATCH_ID_PROPERTY in summary:
                bid = summary[BATCH_ID_PROPERTY]
                seen.setdefault(bid, set()).add(table)
                wanted[bid] = set(json.loads(summary.get(TARGETS_PROPERTY, "[]")))
                summaries.append(summary)
    return Ledger({bid: wanted[bid] <= tables for bid, tables in seen.items()}, summaries, properties)


def recorded_batches(spark: Any, catalog_name: str, settings: IngestSettings) -> dict[str, bool]:
    """Batch id -> True when committed to every table it writes, False when only to some of them
    (a crash between two commits: re-ingesting it with the SAME id completes it, nothing twice)."""
    return read_ledger(spark, catalog_name, settings).batches


def committed_batches(spark: Any, catalog_name: str, settings: IngestSettings) -> set[str]:
    """Batch ids of this landing location committed to every table they write."""
    return {bid for bid, complete in recorded_batches(spark, catalog_name, settings).items() if complete}


def ledger_horizon(settings: IngestSettings, ledger: Ledger,
                   listed: Sequence[landing.LandingFile] | None = None) -> horizon.Horizon:
    """The horizon of this landing location now (``ingest.horizon``)."""
    files = landing.list_files(settings.landing) if listed is None else listed
    return horizon.horizon(settings.max_file_age_s, files, ledger.summaries, ledger.properties)


def _unrecorded(spark: Any, catalog_name: str, settings: IngestSettings) -> horizon.Split:
    """Landing files not fully committed: recorded-but-partial ones are fresh (completed under their id)."""
    ledger = read_ledger(spark, catalog_name, settings)
    listed = landing.list_files(settings.landing)
    done_parts = {part for bid, complete in ledger.batches.items() if complete for part in bid.split(";")}
    recorded_parts = ledger.parts()
    waiting = [f for f in listed if f.batch_part not in done_parts]
    unrecorded = horizon.split([f for f in waiting if f.batch_part not in recorded_parts],
                               ledger_horizon(settings, ledger, listed), settings.take_expired_files)
    aside = {f.uri for f in unrecorded.set_aside}
    return horizon.Split([f for f in waiting if f.uri not in aside], unrecorded.expired, unrecorded.forgotten)


def pending_files(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    """Landing files in name order whose batch is not yet fully committed (files past the horizon set aside)."""
    return [f.uri for f in _unrecorded(spark, catalog_name, settings).fresh]


def expired_files(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    """Landing files past the ledger's horizon that were never ingested (the ledger vouches for it):
    neither ingested nor forgotten silently (``ingest.horizon``)."""
    return [f.uri for f in _unrecorded(spark, catalog_name, settings).expired]


def _parse_records(target: str, home: str) -> Callable[[Iterable["Row"]], Iterator[tuple[Any, ...]]]:
    """Executor function: a stream batch's messages (rows of ``native.LINE_SCHEMA``) -> parsed rows, by the
    same per-line rules as landing lines (:func:`_line_parser`)."""
    parse = _line_parser(target, home)

    def run(rows: Iterable["Row"]) -> Iterator[tuple[Any, ...]]:
        for row in rows:
            yield parse(row.file_index, row.source_file, row.source_offset, row.raw)
    return run


def _line_parser(target: str, home: str) -> Callable[[int, str, int, str], tuple[Any, ...]]:
    """One line (or message) -> its parsed row: routed, with field types, a tombstone, or a dead-letter reason."""
    templated = routing.is_template(target)

    def parse(file_index: int, uri: str, offset: int, line: str) -> tuple[Any, ...]:
        routed = target
        try:
            env = parse_line(line)
            if env is None:
                return (file_index, uri, offset, None, home, TOMBSTONE, None, None)
            if templated:
                routed = routing.route(target, env.payload)
            return (file_index, uri, offset, line, routed, env.op, None, list(env.field_types.items()))
        except EventError as exc:
            if templated:
                routed = home
                try:
                    doc = loads(line)
                    routed = routing.route(target, doc.get("payload") or doc)
                except Exception:  # noqa: BLE001 - unroutable: stays in the home table
                    pass
            return (file_index, uri, offset, line, routed, None, str(exc), None)
    return parse


def _coerce_partition(columns: list[tuple[str, str, bool]], keys: tuple[str, ...], known: set[str],
                      evolve: bool) -> Callable[[Iterable["Row"]], Iterator[tuple[Any, ...]]]:
    """Executor function: parsed rows of one target -> table rows + op/order, or a dead-letter reason.

    A value that only a wider column type would hold (int -> long, float -> double, more decimal
    digits) is recorded in ``_widen``: with schema evolution the pipeline widens and runs again.
    """
    coerce_envelope = _envelope_coercer(columns, keys, known, evolve)

    def run(rows: Iterable["Row"]) -> Iterator[tuple[Any, ...]]:
        for row in rows:
            env = parse_line(row.raw)
            assert env is not None, "tombstones and blank lines are not coerced"
            yield coerce_envelope(env, row.raw, row.file_index, row.source_file, row.source_offset)
    return run


def _python_partition(columns: list[tuple[str, str, bool]], keys: tuple[str, ...], known: set[str],
                      evolve: bool) -> Callable[[Iterable["Row"]], Iterator[tuple[Any, ...]]]:
    """Executor function: landing lines the native reader routed here -> the same rows as the native path
    (tombstones marked by their op, parse errors as dead letters with their reason)."""
    coerce_envelope = _envelope_coercer(columns, keys, known, evolve)
    width = len(columns)
    notes_at = width + 6

    def run(rows: Iterable["Row"]) -> Iterator[tuple[Any, ...]]:
        for row in rows:
            order = row.file_index * ORDER_FILE_SHIFT + row.source_offset
            try:
                env = parse_line(row.raw)
            except EventError as exc:
                yield (*([None] * width), OP_UPSERT, order, str(exc), row.raw, row.source_file, row.source_offset,
                       {}, None)
                continue
            if env is None:
                yield (*([None] * width), TOMBSTONE, order, None, row.raw, row.source_file, row.source_offset,
                       {}, None)
                continue
            out = coerce_envelope(env, row.raw, row.file_index, row.source_file, row.source_offset)
            yield (*out[:notes_at], {**out[notes_at], PYTHON_RULES: 1}, *out[notes_at + 1:])
    return run


def _envelope_coercer(columns: list[tuple[str, str, bool]], keys: tuple[str, ...], known: set[str],
                      evolve: bool) -> Callable[..., tuple[Any, ...]]:
    """The exact Python rules for one envelope: its table row + op/order, or a dead-letter reason."""
    schema = [(name, T._parse_datatype_json_string(dtype), nullable) for name, dtype, nullable in columns]
    ops = {INSERT: OP_INSERT, DELETE: OP_DELETE}
    no_widening = "" if evolve else " (schema_evolution is off, so the column is not widened)"

    def coerce_envelope(env: Any, raw: str, file_index: int, source_file: str, source_offset: int) -> tuple[Any, ...]:
        notes: Counter[str] = Counter(env.notes)
        values: list[Any] = []
        reason: str | None = None
        widen: dict[str, str] = {}
        for name, dtype, nullable in schema:
            needed = name in keys or (not nullable and env.op != DELETE)
            if env.op == DELETE and name not in keys:
                values.append(None)  # a delete matches on its key only
                continue
            try:
                value = coerce(env.image.get(name), dtype, notes)
            except CoercionError as exc:
                if exc.widen_to is not None:
                    widen[name] = exc.widen_to.json()
                    reason = reason or f"column {name}: {exc}{no_widening}"
                else:
                    reason, widen = f"column {name}: {exc}", {}
                    break
                value = None
                needed = False
            if value is None and needed:
                reason, widen = f"{'key' if name in keys else 'required'} column {name} is null or missing", {}
                break
            values.append(value)
        if reason is None and env.op == DELETE and not keys:
            reason = "delete on a table without identifier columns (append only)"
        notes[IGNORED_FIELDS] += sum(k not in known for k in env.image)
        if reason is not None:
            values, notes = [None] * len(schema), Counter()
        order = file_index * ORDER_FILE_SHIFT + source_offset
        return (*values, ops.get(env.op, OP_UPSERT), order, reason, raw, source_file, source_offset,
                {k: v for k, v in notes.items() if v}, widen or None)
    return coerce_envelope


def _prepare_target(spark: Any, catalog_name: str, settings: IngestSettings, table: str,
                    field_types: dict[str, str]) -> tuple[list[str], list[str]]:
    """Create (auto_create) and evolve (schema_evolution) one target; returns added and widened columns.

    Evolution adds new fields as optional columns and promotes existing columns whose field type
    is wider (int -> long, float -> double, decimal precision), as Iceberg allows.
    """
    if not table_exists(spark, catalog_name, table):
        if not settings.auto_create:
            raise TargetTableMissingError(f"ingest {settings.landing}: target table {table} does not exist "
                                          "and auto_create is off")
        ensure_namespace(spark, catalog_name, table)
        if settings.schema:
            columns = declared_columns(settings.schema, f"ingest {settings.landing} target {table}")
        else:
            columns = [(name, t, False) for name, t in field_types.items()]
        create_table(spark, catalog_name, table, columns, settings.keys_for(table),
                     (settings.schema or {}).get("partition_spec") or (),
                     (settings.schema or {}).get("table_properties"))
        if settings.schema and settings.schema_evolution:
            return add_columns(spark, catalog_name, table, field_types), _promote(spark, catalog_name, table,
                                                                                   field_types)
        return ([c[0] for c in columns] if not settings.schema else []), []
    if settings.schema_evolution:
        return add_columns(spark, catalog_name, table, field_types), _promote(spark, catalog_name, table, field_types)
    return [], []


def _promote(spark: Any, catalog_name: str, table: str, wanted: Mapping[str, Any]) -> list[str]:
    """Widen columns to the wider type a batch needs (Iceberg type strings or Spark types)."""
    current = {f.name: f.dataType for f in spark.table(f"{catalog_name}.{table}").schema.fields}
    changes = {}
    for name, want in wanted.items():
        if name not in current:
            continue
        try:
            target = want if isinstance(want, T.DataType) else spark_type(want)
        except Exception:  # noqa: BLE001 - not a primitive we can compare; nothing to promote
            continue
        promoted = widened(current[name], target)
        if promoted is not None:
            changes[name] = (current[name], promoted)
    return widen_columns(spark, catalog_name, table, changes)


def _rows_schema(fields: Sequence[T.StructField]) -> T.StructType:
    """A target's coerced rows: its columns (nullable: a dead letter has none) + op, order and provenance."""
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in fields] + [
        T.StructField(OP_COLUMN, T.StringType()), T.StructField(ORDER_COLUMN, T.LongType()),
        T.StructField(REASON, T.StringType()), T.StructField(RAW, T.StringType()),
        T.StructField(SOURCE_FILE, T.StringType()), T.StructField(SOURCE_OFFSET, T.LongType()),
        T.StructField(NOTES, T.MapType(T.StringType(), T.LongType())),
        T.StructField(WIDEN, T.MapType(T.StringType(), T.StringType()))])


def _coerce_target(spark: Any, catalog_name: str, settings: IngestSettings, target: str,
                   good: DataFrame) -> tuple[DataFrame, list[str]]:
    """Rows of one target coerced to its columns (persisted), widening columns first when values need it."""
    widened_columns: list[str] = []
    for _ in range(2):
        fields = spark.table(f"{catalog_name}.{target}").schema.fields
        keys = _table_keys(spark, catalog_name, settings, target)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in fields]
        out_schema = _rows_schema(fields)
        rows = spark.createDataFrame(
            good.where(F.col("target") == target).rdd.mapPartitions(
                _coerce_partition(columns, keys, {f.name for f in fields}, settings.schema_evolution)), out_schema)
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        if not settings.schema_evolution or widened_columns:
            return rows, widened_columns
        wanted: dict[str, T.DataType] = {}
        for name, types in rows.select(F.explode(WIDEN)).groupBy("key").agg(
                F.collect_set("value").alias("types")).collect():
            for t in map(T._parse_datatype_json_string, types):
                prior = wanted.get(name)
                if prior is None or (isinstance(t, T.DecimalType) and isinstance(prior, T.DecimalType)
                                     and t.precision > prior.precision):
                    wanted[name] = t
        promoted = _promote(spark, catalog_name, target, wanted) if wanted else []
        if not promoted:
            return rows, widened_columns
        rows.unpersist()
        widened_columns = promoted
    return rows, widened_columns


def ingest_files(spark: Any, catalog_name: str, pyiceberg_catalog: Any, settings: IngestSettings,
                 files: Sequence[str]) -> IngestResult:
    """Ingest one batch (these files, in this order) into its target tables, exactly once.

    Raises:
        TargetTableMissingError: a target table does not exist and the entry does not create it.
        SchemaDeclarationError: the entry's declared schema cannot create a missing table.
        EqualityDeleteTargetError: ``write_mode: equality_deletes`` names a target that cannot take it
            (format version 1, a non-Parquet write format, an unsupported partition transform).
        StagingBranchLostError: a target's staging branch vanished mid-batch (``write_batch``); the
            tables committed before it record the batch, so running it again skips them.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused a read or
            a write; what was committed records the batch, the rest is written when it runs again.
    """
    ledger = read_ledger(spark, catalog_name, settings)
    described = landing.describe(files)
    past = ledger_horizon(settings, ledger)
    recorded_parts = ledger.parts()
    unrecorded = [f for f in described if f.batch_part not in recorded_parts]
    expired = tuple(f.uri for f in horizon.split(unrecorded, past, settings.take_expired_files).set_aside)
    described = [f for f in described if f.uri not in expired]
    bid = landing.batch_id(described)
    uris = tuple(f.uri for f in described)
    if not described or ledger.batches.get(bid):
        return IngestResult(bid, uris, True, expired=expired)
    stamp = _Stamp(past.retention(), horizon.file_time(described))
    return replace(_ingest_new(spark, catalog_name, settings, described, bid, uris, stamp), expired=expired)


def _ingest_new(spark: Any, catalog_name: str, settings: IngestSettings, described: Sequence[landing.LandingFile],
                bid: str, uris: tuple[str, ...], stamp: "_Stamp") -> IngestResult:
    """A batch no table records yet (or only some of them): read, coerce and commit it."""
    templated = routing.is_template(settings.target)
    if not templated and not settings.auto_create and not table_exists(spark, catalog_name, settings.target):
        raise TargetTableMissingError(f"ingest {settings.landing}: target table {settings.target} does not exist "
                                      "and auto_create is off")
    lines = landing_lines.lines(spark, described)  # Spark's text reader; a line's position key orders its file
    stamp = replace(stamp, line_numbers=functools.partial(landing_lines.line_numbers, spark, described))
    if _native_eligible(spark, catalog_name, settings, templated):
        return _ingest_native(spark, catalog_name, settings, lines, native.sample_branches(described), bid, uris,
                              stamp)
    return _ingest_python(spark, catalog_name, settings, lines, bid, uris, templated, stamp)


def _ingest_python(spark: Any, catalog_name: str, settings: IngestSettings, lines: DataFrame, bid: str,
                   uris: tuple[str, ...], templated: bool, stamp: "_Stamp") -> IngestResult:
    """Lines the native reader cannot take (templated targets, evolving schemas, targets not known before
    reading): parsed by the Python rules, kept while the batch is written (read per target and for dead
    letters)."""
    home = _home_table(settings)
    parsed = spark.createDataFrame(lines.rdd.mapPartitions(_parse_records(settings.target, home)),
                                   PARSED_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _ingest_parsed(spark, catalog_name, settings, parsed, bid, uris, home, templated, stamp)
    finally:
        parsed.unpersist()


def _ingest_parsed(spark: Any, catalog_name: str, settings: IngestSettings, parsed: DataFrame, bid: str,
                   uris: tuple[str, ...], home: str, templated: bool, stamp: "_Stamp") -> IngestResult:
    good = parsed.where(F.col("reason").isNull() & (F.col("op") != TOMBSTONE))
    types: dict[str, dict[str, list[str]]] = {}
    order = F.col("file_index") * F.lit(ORDER_FILE_SHIFT) + F.col("source_offset")
    exploded = good.select("target", order.alias("order"), F.posexplode("field_types").alias("pos", "field")).select(
        "target", "order", "pos", F.col("field.name").alias("name"), F.col("field.type").alias("type"))
    triples = exploded.groupBy("target", "name", "type").agg(F.min("pos").alias("pos"),
                                                             F.min("order").alias("first")).collect()
    position: dict[tuple[str, str], Any] = {}
    for r in triples:
        position[(r.target, r.name)] = min(position.get((r.target, r.name), r.pos), r.pos)
    # columns in schema order; for a field seen with several types, the types in event order
    for r in sorted(triples, key=lambda r: (r.target, position[(r.target, r.name)], r.name, r.first)):
        types.setdefault(r.target, {}).setdefault(r.name, []).append(r.type)
    counts_by_target = {r.target: r["count"] for r in parsed.groupBy("target").count().collect()}
    tombstones = parsed.where(F.col("op") == TOMBSTONE).count()
    if not templated and settings.target not in types:
        types[settings.target] = {}
    targets = sorted(types)
    for target in targets:  # fail early, before any write, when a target is missing
        if not settings.auto_create and not table_exists(spark, catalog_name, target):
            raise TargetTableMissingError(f"ingest {settings.landing}: routed target table {target} does not "
                                          "exist and auto_create is off")
    plans: dict[str, DataFrame] = {}
    results: dict[str, TargetResult] = {}
    written_tables: list[str] = []
    dead_by_table: dict[str, DataFrame] = {}
    persisted = []
    for target in targets:
        merged = {name: merge_types(ts) for name, ts in types[target].items()}
        field_types = {name: t for name, t in merged.items() if t is not None}
        if not field_types and not settings.schema and not table_exists(spark, catalog_name, target):
            continue  # nothing valid to create it from: only dead letters this batch
        added_columns, promoted = _prepare_target(spark, catalog_name, settings, target, field_types)
        rows, value_promoted = _coerce_target(spark, catalog_name, settings, target, good)
        persisted.append(rows)
        plans[target] = rows
        dead_count = rows.where(F.col(REASON).isNotNull()).count()
        rule_counts = {rule: 0 for rule in RULE_COUNTS}
        for rule, n in rows.select(F.explode(NOTES)).groupBy("key").agg(F.sum("value")).collect():
            rule_counts[rule] = int(n)
        results[target] = TargetResult(target, False, None, {"dead_lettered": dead_count, **rule_counts},
                                       tuple(added_columns), tuple(promoted + value_promoted))
        dead_by_table[routing.dead_letter_table(target)] = _dead_letter_rows(rows, target)
        written_tables.append(target)
    # Events that failed parsing or routing.
    early_dead = parsed.where(F.col("reason").isNotNull()).select("raw", "reason", "source_file", "source_offset",
                                                                  "target")
    for target in counts_by_target:
        dl_table = home if target == home else routing.dead_letter_table(target)
        part = early_dead.where(F.col("target") == target)
        dead_by_table[dl_table] = dead_by_table[dl_table].unionByName(part) if dl_table in dead_by_table else part
    dead_counts = {t: df.count() for t, df in dead_by_table.items()}
    dl_tables = sorted(t for t, n in dead_counts.items() if n)
    if not written_tables and not dl_tables:  # the batch is still recorded: in the home table
        dl_tables = [home]
        dead_by_table.setdefault(home, early_dead)
    for dl_table in dl_tables:  # a target's dead letters include those of parsing and routing
        owner = dl_table[: -len("__dead_letters")]
        if owner in results:
            results[owner] = replace(results[owner], counts={**results[owner].counts,
                                                             "dead_lettered": dead_counts[dl_table]})
    try:
        writes = [_TargetWrite(target, plans[target].where(F.col(REASON).isNull()),
                               [f.name for f in spark.table(f"{catalog_name}.{target}").schema.fields],
                               _table_keys(spark, catalog_name, settings, target)) for target in written_tables]
        results = _commit_batch(spark, catalog_name, settings, bid, {t: dead_by_table[t] for t in dl_tables},
                                writes, results, stamp, _parsed_markers(parsed, settings))
    finally:
        for df in persisted:
            df.unpersist()
    return IngestResult(bid, uris, False, results, int(tombstones), int(sum(counts_by_target.values())))


@dataclass(frozen=True)
class _Stamp:
    """What a batch's commits add for the ledger's horizon: its files' newest time, and the retention that
    drops the entries past the horizon in the same commits."""

    retention: LedgerRetention | None = None
    file_time: str | None = None
    # landing batches: the dead letters' reader positions -> line numbers (``landing_lines.line_numbers``)
    line_numbers: Callable[[DataFrame], DataFrame] | None = None


@dataclass(frozen=True)
class _TargetWrite:
    """One target's part of a batch: the rows to write (no dead letter, no tombstone), the table's columns, its
    identifier columns, and its key range when the caller has it."""

    table: str
    rows: DataFrame
    columns: Sequence[str]
    keys: tuple[str, ...]
    bounds: KeyBounds | None = None


def _parsed_markers(parsed: DataFrame, settings: IngestSettings) -> dict[str, list[tuple[int, str]]]:
    """Per target the snapshot-epoch markers of a parsed batch (a handful of rows; see :mod:`snapshot_epoch`)."""
    if not settings.snapshot_deletes:
        return {}
    mark = snapshot_epoch.marker(F.col("raw"))
    order = F.col("file_index") * F.lit(ORDER_FILE_SHIFT) + F.col("source_offset")
    found = parsed.where(F.col("reason").isNull() & mark.isNotNull()).select("target", order, mark).collect()
    return snapshot_epoch.markers_by_target((r[0], r[1], r[2]) for r in found)


def _epoch_plans(spark: Any, catalog_name: str, settings: IngestSettings, bid: str, writes: Sequence["_TargetWrite"],
                 markers: Mapping[str, Sequence[tuple[int, str]]]) -> dict[str, snapshot_epoch.EpochPlan]:
    """Per keyed target the batch's snapshot epochs (only those with one open or starting)."""
    plans = {}
    for w in writes:
        if not settings.snapshot_deletes or not w.keys:
            continue
        prior = snapshot_epoch.open_epoch(spark, f"{catalog_name}.{w.table}", LANDING_PROPERTY, settings.landing)
        planned = snapshot_epoch.plan(prior, markers.get(w.table, ()), bid)
        if planned.active:
            plans[w.table] = planned
    return plans


def _marks_writes(spark: Any, catalog_name: str, writes: Sequence["_TargetWrite"],
                  plans: Mapping[str, snapshot_epoch.EpochPlan]
                  ) -> dict[str, tuple["_TargetWrite", snapshot_epoch.MarksWrite]]:
    """Per marks table (name within the catalog) its target's write and what the batch writes to it."""
    out = {}
    for w in writes:
        if w.table in plans:
            name = snapshot_epoch.marks_table(w.table)
            write = snapshot_epoch.marks_write(w.rows, w.keys, OP_COLUMN, ORDER_COLUMN, OP_DELETE, plans[w.table],
                                               table_exists(spark, catalog_name, name))
            if write is not None:
                out[name] = (w, write)
    return out


def _commit_batch(spark: Any, catalog_name: str, settings: IngestSettings, bid: str, dead: Mapping[str, DataFrame],
                  writes: Sequence[_TargetWrite], results: Mapping[str, TargetResult],
                  stamp: _Stamp, markers: Mapping[str, Sequence[tuple[int, str]]] | None = None
                  ) -> dict[str, TargetResult]:
    """Write one batch, whichever path read it: the dead-letter tables first, then each target's rows.

    Every commit records the batch id, the landing location and the full list of tables the batch writes
    (the ledger :func:`recorded_batches` reads, so a batch cut short is completed under the same id).
    Returns ``results`` with each written target's outcome (skipped, snapshot, write counts) merged in.
    A target whose Debezium snapshot completes in the batch loses the rows the snapshot lacked, and the
    marks of a snapshot still running are written first (:mod:`snapshot_epoch`: not part of the batch's
    tables, so the ledger's completeness is the targets' alone; a re-run skips them and sweeps from the
    marks as they were before the batch).
    """
    epochs = _epoch_plans(spark, catalog_name, settings, bid, writes, markers or {})
    stamped = {horizon.FILE_TIME_PROPERTY: stamp.file_time} if stamp.file_time else {}
    for name, (w, mw) in sorted(_marks_writes(spark, catalog_name, writes, epochs).items()):
        snapshot_epoch.ensure_marks_table(spark, f"{catalog_name}.{w.table}", w.keys)
        write_batch(spark, f"{catalog_name}.{name}", mw.rows.withColumn(OP_COLUMN, F.lit(OP_INSERT)), (), bid,
                    {snapshot_epoch.MARKS_OF_PROPERTY: settings.landing, **stamped}, ledger=True,
                    replace_all=mw.replace, retention=stamp.retention)
    props = {LANDING_PROPERTY: settings.landing,
             TARGETS_PROPERTY: json.dumps(sorted([*(w.table for w in writes), *dead])), **stamped}
    for dl_table in sorted(dead):
        dead_letters.ensure_table(spark, catalog_name, dl_table)
        rows = stamp.line_numbers(dead[dl_table]) if stamp.line_numbers else dead[dl_table]
        frame = dead_letters.frame(rows, bid).withColumn(OP_COLUMN, F.lit(OP_INSERT))
        write_batch(spark, f"{catalog_name}.{dl_table}", frame, (), bid, props, ledger=True,
                    retention=stamp.retention)
    out = dict(results)
    for w in writes:
        rows = w.rows.select(*[F.col(_quote(c)) for c in w.columns], OP_COLUMN, ORDER_COLUMN)
        epoch = epochs.get(w.table)
        bounds = w.bounds
        if epoch is not None and epoch.closed:
            full = f"{catalog_name}.{w.table}"
            held = snapshot_epoch.marks_before(spark, snapshot_epoch.marks_table(full), bid) if table_exists(
                spark, catalog_name, snapshot_epoch.marks_table(w.table)) else None
            rows = snapshot_epoch.with_sweeps(spark, full, held, rows, w.keys, OP_COLUMN, ORDER_COLUMN, OP_DELETE,
                                              epoch)
            bounds = None  # the sweep's deletes reach keys outside the batch's own range
        table_props = {**props, **(snapshot_epoch.epoch_properties(epoch) if epoch else {})}
        if settings.mode_for(w.table) == EQUALITY_DELETES:
            outcome = write_equality_delta(spark, f"{catalog_name}.{w.table}", rows, w.keys, bid, table_props,
                                           ledger=True, retention=stamp.retention)
        else:
            outcome = write_batch(spark, f"{catalog_name}.{w.table}", rows, w.keys, bid, table_props, ledger=True,
                                  bounds=bounds, retention=stamp.retention)
        prior = out[w.table]
        out[w.table] = TargetResult(w.table, outcome.skipped, outcome.snapshot_id, {**prior.counts, **outcome.counts},
                                    prior.added_columns, prior.widened_columns)
    return out


def _dead_letter_rows(rows: DataFrame, target: str) -> DataFrame:
    """A target's coerced rows that are dead letters, in the columns :func:`dead_letters.frame` takes."""
    return rows.where(F.col(REASON).isNotNull()).select(
        F.col(RAW).alias("raw"), F.col(REASON).alias("reason"), F.col(SOURCE_FILE).alias("source_file"),
        F.col(SOURCE_OFFSET).alias("source_offset"), F.lit(target).alias("target"))


def _table_keys(spark: Any, catalog_name: str, settings: IngestSettings, table: str) -> tuple[str, ...]:
    """A target's identifier columns: the configured ones, else the table's own identifier fields."""
    jschema = java_table(spark, f"{catalog_name}.{table}").schema()
    return settings.keys_for(table) or tuple(sorted(jschema.identifierFieldNames()))


def _native_eligible(spark: Any, catalog_name: str, settings: IngestSettings, templated: bool) -> bool:
    """Whether the batch can be read by Spark's JSON reader (:mod:`native`): a fixed target whose columns are
    known before reading (it exists, or is declared) and not evolved from the events."""
    if templated or settings.schema_evolution:
        return False
    return table_exists(spark, catalog_name, settings.target) or bool(settings.auto_create and settings.schema)


def _ingest_native(spark: Any, catalog_name: str, settings: IngestSettings, lines: DataFrame,
                   branches: Sequence[Any], bid: str, uris: tuple[str, ...], stamp: _Stamp) -> IngestResult:
    """One batch into a fixed target: native reading and typing, the Python rules only for routed lines.
    ``lines``: the batch as ``native.LINE_SCHEMA`` rows (landing lines or stream messages); ``branches``: the
    schema blocks sampled from its first lines."""
    target = settings.target
    added_columns, _ = _prepare_target(spark, catalog_name, settings, target, {})
    fields = spark.table(f"{catalog_name}.{target}").schema.fields
    keys = _table_keys(spark, catalog_name, settings, target)
    known = [f.name for f in fields]
    marking = settings.snapshot_deletes
    extra = [snapshot_epoch.marker(F.col("raw")).alias(snapshot_epoch.MARKER_COLUMN)] if marking else []
    classified = native.coerce_lines(lines, native.columns_of(T.StructType(fields)), keys, known,
                                     native.utc(spark), ORDER_FILE_SHIFT, branches, extra)
    classified = _checkpointed(classified)
    markers: dict[str, list[tuple[int, str]]] = {}
    if settings.snapshot_deletes:
        # every line: the native reason of a line left to the Python rules is not final
        found = classified.where(F.col(snapshot_epoch.MARKER_COLUMN).isNotNull()).select(
            ORDER_COLUMN, snapshot_epoch.MARKER_COLUMN).collect()
        markers = snapshot_epoch.markers_by_target((target, r[0], r[1]) for r in found)
    fast, routed = native.split(classified.drop(snapshot_epoch.MARKER_COLUMN))
    held = [classified]
    rows = fast
    if routed.count():  # no Python worker at all for a batch the native reading types whole (the common case)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in fields]
        slow = _checkpointed(spark.createDataFrame(  # once: the stats, dead letters and the MERGE all read it
            routed.rdd.mapPartitions(_python_partition(columns, keys, set(known), False)), _rows_schema(fields)))
        held.append(slow)
        rows = fast.unionByName(slow)
    try:
        rule_sums = [F.sum(F.coalesce(F.col(NOTES)[rule], F.lit(0))).alias(rule) for rule in RULE_COUNTS]
        stats = rows.agg(F.count(F.lit(1)).alias("events_read"),
                         F.sum((F.col(OP_COLUMN) == TOMBSTONE).cast("long")).alias("tombstones"),
                         F.sum(F.col(REASON).isNotNull().cast("long")).alias("dead_lettered"),
                         F.sum(F.coalesce(F.col(NOTES)[PYTHON_RULES], F.lit(0))).alias(PYTHON_RULES),
                         *rule_sums, *bounds_aggregates(keys, T.StructType(fields))).first()
        assert stats is not None
        dead_count = int(stats["dead_lettered"] or 0)
        counts = {"dead_lettered": dead_count, PYTHON_RULES: int(stats[PYTHON_RULES] or 0),
                  **{rule: int(stats[rule] or 0) for rule in RULE_COUNTS}}
        dead = {routing.dead_letter_table(target): _dead_letter_rows(rows, target)} if dead_count else {}
        good = rows.where(F.col(REASON).isNull() & (F.col(OP_COLUMN) != TOMBSTONE))
        write = _TargetWrite(target, good, known, keys, bounds_from(stats, keys, T.StructType(fields)))
        results = _commit_batch(spark, catalog_name, settings, bid, dead, [write], {
            target: TargetResult(target, False, None, counts, tuple(added_columns), ())}, stamp, markers)
    finally:
        for frame in held:
            _release(frame)
    return IngestResult(bid, uris, False, results, int(stats["tombstones"] or 0), int(stats["events_read"] or 0))


def _checkpointed(frame: DataFrame) -> DataFrame:
    """``frame`` computed once and cut from its plan (Spark's local checkpoint, in executors' memory and disk).

    Why not ``persist``: every later plan (the stats, the dead letters, the MERGE and its count join) would carry
    and re-analyse the whole JSON reading and typing again, and the landing reader's positions come from
    nondeterministic expressions (``landing_lines``), which a copy-on-write MERGE refuses in its source. A lost
    executor fails the batch instead of recomputing it: nothing is published, the next run ingests it again."""
    return frame.localCheckpoint(eager=True)


def _release(checkpointed: DataFrame) -> None:
    """Drop the blocks of a :func:`_checkpointed` frame now (Spark would drop them only once it is garbage)."""
    checkpointed._jdf.queryExecution().analyzed().rdd().unpersist(False)  # noqa: SLF001 - its LogicalRDD's blocks


def ingest_records(spark: Any, catalog_name: str, settings: IngestSettings, bid: str,
                   records: Sequence[tuple[str, bytes]]) -> IngestResult:
    """Ingest one stream batch (messages in source-position order, each ``(position, bytes)``) exactly once.

    Every message takes the path of a landing line: the same parsing, routing, coercion, dead letters,
    tombstones and per-key ordering (its index in the batch orders it, as a line's offset does); a dead
    letter names ``<source>#<position>``. ``settings.landing`` is the input's ledger name. The batch is stamped
    with its commit time, and the ledger's entries older than ``max_file_age`` before it are dropped.

    Raises:
        The errors of :func:`ingest_files`, for the same reasons and with the same recovery.
    """
    ledger = read_ledger(spark, catalog_name, settings)
    if ledger.batches.get(bid):
        return IngestResult(bid, (settings.landing,), True)
    committed_ms = horizon.now_ms()
    stamp = _Stamp(horizon.stream_horizon(settings.max_file_age_s, committed_ms, ledger.summaries,
                                          ledger.properties).retention(), str(committed_ms))
    templated = routing.is_template(settings.target)
    if not templated and not settings.auto_create and not table_exists(spark, catalog_name, settings.target):
        raise TargetTableMissingError(f"ingest {settings.landing}: target table {settings.target} does not exist "
                                      "and auto_create is off")
    texts = [data.decode("utf-8", errors="replace") for _, data in records]
    rows = [(0, f"{settings.landing}#{position}", index, text)
            for index, ((position, _), text) in enumerate(zip(records, texts, strict=True))]
    slices = max(min(len(rows) // 5000, int(spark.sparkContext.defaultParallelism)), 1)
    lines = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), native.LINE_SCHEMA)
    uris = (settings.landing,)
    if _native_eligible(spark, catalog_name, settings, templated):
        return _ingest_native(spark, catalog_name, settings, lines, native.sample_records(texts), bid, uris, stamp)
    return _ingest_python(spark, catalog_name, settings, lines, bid, uris, templated, stamp)
