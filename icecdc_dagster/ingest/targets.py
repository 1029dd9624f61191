"""What rows each target gets: the target created or evolved for the batch (``auto_create``,
``schema_evolution``), and each event coerced by the exact Python rules to the target's columns, or set aside
as a dead letter with its reason. The coercion runs in executors."""

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.errors import TargetTableMissingError
from icecdc_dagster.ingest.coercion import IGNORED_FIELDS, STRINGIFIED, CoercionError, coerce
from icecdc_dagster.ingest.columns import NOTES, RAW, REASON, SOURCE_FILE, SOURCE_OFFSET, TOMBSTONE, WIDEN
from icecdc_dagster.ingest.contract import IngestSettings
from icecdc_dagster.ingest.debezium import DELETE, INSERT, NANOS_TRUNCATED, EventError, parse_line
from icecdc_dagster.ingest.line_parsing import ORDER_FILE_SHIFT
from icecdc_dagster.ingest.schema_inference import spark_type, widened
from icecdc_dagster.writer import (
    OP_COLUMN,
    OP_DELETE,
    OP_INSERT,
    OP_UPSERT,
    ORDER_COLUMN,
    add_columns,
    create_table,
    declared_columns,
    ensure_namespace,
    java_table,
    table_exists,
    widen_columns,
)

if TYPE_CHECKING:
    from pyspark.sql import Row


# Declared coercion rules whose applications every run counts (docs/ingestion.md).
RULE_COUNTS = (IGNORED_FIELDS, STRINGIFIED, NANOS_TRUNCATED)
# Lines the native reader routed to the Python rules (a native-path batch counts them: they cost the most).
PYTHON_RULES = "python_rules"


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


def python_partition(columns: list[tuple[str, str, bool]], keys: tuple[str, ...], known: set[str],
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


def prepare_target(spark: Any, catalog_name: str, settings: IngestSettings, table: str,
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


def rows_schema(fields: Sequence[T.StructField]) -> T.StructType:
    """A target's coerced rows: its columns (nullable: a dead letter has none) + op, order and provenance."""
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in fields] + [
        T.StructField(OP_COLUMN, T.StringType()), T.StructField(ORDER_COLUMN, T.LongType()),
        T.StructField(REASON, T.StringType()), T.StructField(RAW, T.StringType()),
        T.StructField(SOURCE_FILE, T.StringType()), T.StructField(SOURCE_OFFSET, T.LongType()),
        T.StructField(NOTES, T.MapType(T.StringType(), T.LongType())),
        T.StructField(WIDEN, T.MapType(T.StringType(), T.StringType()))])


def coerce_target(spark: Any, catalog_name: str, settings: IngestSettings, target: str,
                   good: DataFrame) -> tuple[DataFrame, list[str]]:
    """Rows of one target coerced to its columns (persisted), widening columns first when values need it."""
    widened_columns: list[str] = []
    for _ in range(2):
        fields = spark.table(f"{catalog_name}.{target}").schema.fields
        keys = table_keys(spark, catalog_name, settings, target)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in fields]
        out_schema = rows_schema(fields)
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


def dead_letter_rows(rows: DataFrame, target: str) -> DataFrame:
    """A target's coerced rows that are dead letters, in the columns :func:`dead_letters.frame` takes."""
    return rows.where(F.col(REASON).isNotNull()).select(
        F.col(RAW).alias("raw"), F.col(REASON).alias("reason"), F.col(SOURCE_FILE).alias("source_file"),
        F.col(SOURCE_OFFSET).alias("source_offset"), F.lit(target).alias("target"))


def table_keys(spark: Any, catalog_name: str, settings: IngestSettings, table: str) -> tuple[str, ...]:
    """A target's identifier columns: the configured ones, else the table's own identifier fields."""
    jschema = java_table(spark, f"{catalog_name}.{table}").schema()
    return settings.keys_for(table) or tuple(sorted(jschema.identifierFieldNames()))
