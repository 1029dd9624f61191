"""CDC events for sinks: change rows + Iceberg position, document id and bulk action.

``document_id`` is built from the identifier column values, each as a canonical string, so every
sink derives the same id from the same key:

- strings as they are; integers and booleans as Spark casts them (``42``, ``true``);
- decimals plain with their full scale (``12.50``, never exponent notation);
- floats/doubles as Spark casts them to string;
- dates ``yyyy-MM-dd``;
- timestamps with zone: ISO-8601 in UTC with microseconds, ``2024-01-31T10:00:00.000000Z``
  (whatever the session time zone); timestamps without zone: the same without ``Z``;
- binary: base64 (standard alphabet, padded).

One identifier column: the id is its canonical string, unchanged. Several: each part is escaped
(``\\`` becomes ``\\\\``, ``|`` becomes ``\\|``; a null part is ``\\N``) and the parts are joined with
``|`` in identifier column order. Splitting on the unescaped ``|`` gives the parts back, so two
different keys never share an id: ("a|b", "c") is ``a\\|b|c`` and ("a", "b|c") is ``a|b\\|c``.

Without identifier columns it is ``str(_row_id)`` when the table has v3 row lineage, else null
(append-only documents whose ids the sink generates).

``iceberg_operation`` is the row's change as the source RFC defines it: INSERT, UPDATE_AFTER or
DELETE (UPDATE_BEFORE rows never become events). ``iceberg_snapshot_operation`` keeps the Iceberg
snapshot operation of the batch (append, overwrite, delete, replace).
"""

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.batch import (
    BULK_ACTION,
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    COMMIT_SEQUENCE_NUMBER,
    COMMIT_SNAPSHOT_ID,
    DELETE,
    DELETE_ACTION,
    DOCUMENT_ID,
    ICEBERG_OPERATION,
    ICEBERG_SNAPSHOT_ID,
    ICEBERG_TABLE_NAME,
    INDEX_ACTION,
    INSERT,
    ROW_ID,
    UPDATE_AFTER,
    UPDATE_BEFORE,
)
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import IdentifierColumnError

ICEBERG_SNAPSHOT_OPERATION = "iceberg_snapshot_operation"
KEY_SEPARATOR = "|"
ESCAPE = "\\"
NULL_PART = ESCAPE + "N"
UTC_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"


def canonical_string(value: Column, dtype: T.DataType) -> Column:
    """The documented canonical string form of one key value.

    Raises:
        Nothing of its own: it builds a column expression; an unsupported type is rendered by Spark's cast.
    """
    if isinstance(dtype, T.DecimalType):
        # Spark casts decimals to a plain string with the column's full scale (12.50, 0.00000010).
        return value.cast("string")
    if isinstance(dtype, T.TimestampType):
        utc = F.to_utc_timestamp(value, F.current_timezone())
        return F.concat(F.date_format(utc, UTC_FORMAT), F.lit("Z"))
    if isinstance(dtype, T.TimestampNTZType):
        return F.date_format(value, UTC_FORMAT)
    if isinstance(dtype, T.DateType):
        return F.date_format(value, "yyyy-MM-dd")
    if isinstance(dtype, T.BinaryType):
        return F.base64(value)
    if isinstance(dtype, T.BooleanType):
        return F.when(value, F.lit("true")).when(~value, F.lit("false"))
    return value.cast("string")


def escaped_part(part: Column) -> Column:
    """One part of a composite id: ``\\`` and ``|`` escaped with ``\\``, null as ``\\N``."""
    escaped = F.replace(F.replace(part, F.lit(ESCAPE), F.lit(ESCAPE + ESCAPE)),
                        F.lit(KEY_SEPARATOR), F.lit(ESCAPE + KEY_SEPARATOR))
    return F.coalesce(escaped, F.lit(NULL_PART))


def document_id(rows: DataFrame, identifier_columns: Sequence[str], use_row_id: bool) -> Column:
    """A change row's document id: its identifier columns' canonical strings, or its v3 row id.

    Raises:
        IdentifierColumnError: no identifier column and no row id to build the id from.
    """
    if identifier_columns:
        missing = [c for c in identifier_columns if c not in rows.columns]
        if missing:
            raise IdentifierColumnError(f"identifier column(s) {missing} are not in the change rows "
                                        f"(columns: {rows.columns})")
        parts = [canonical_string(column(c), rows.schema[c].dataType) for c in identifier_columns]
        if len(parts) == 1:
            return parts[0]
        return F.concat_ws(KEY_SEPARATOR, *[escaped_part(p) for p in parts])
    if use_row_id:
        if ROW_ID not in rows.columns:
            raise IdentifierColumnError(f"use_row_id is set but the change rows have no {ROW_ID} column")
        return F.col(ROW_ID).cast("string")
    return F.lit(None).cast("string")


def to_events(rows: DataFrame, table_name: str, identifier_columns: Sequence[str], operation: str | None,
              snapshot_id: int, use_row_id: bool, unique_ids: bool = False) -> DataFrame:
    """Change rows -> CDC events. UPDATE_BEFORE rows are dropped (the after image replaces the
    document); at most one event per document id: the latest (sequence, ordinal, after image) wins.

    ``operation``: the snapshot operation of the batch (``iceberg_snapshot_operation``);
    ``snapshot_id``: the batch's snapshot, for rows that carry no ``_commit_snapshot_id``.
    ``unique_ids``: the rows hold each document id once already (an export whose keys
    :func:`~icecdc_dagster.changelog.engine.export` checked, or ``_row_id``s): no ranking, whose shuffle
    and per-key sort of every row would be the largest cost, and memory, of an export's events.

    Raises:
        IdentifierColumnError: as :func:`document_id`.
        Nothing of its own else of its own: a lazy plan; Spark's errors surface when it is evaluated.
    """
    op = operation if isinstance(operation, Column) else F.lit(operation)
    events = (rows.where(F.col(CHANGE_TYPE) != UPDATE_BEFORE)
              .withColumn(ICEBERG_OPERATION, F.col(CHANGE_TYPE))
              .withColumn(ICEBERG_SNAPSHOT_OPERATION, op.cast("string"))
              .withColumn(ICEBERG_TABLE_NAME, F.lit(table_name))
              # The snapshot that produced the row (seed 000); in a net range, not the range's last one.
              .withColumn(ICEBERG_SNAPSHOT_ID, F.coalesce(F.col(COMMIT_SNAPSHOT_ID), F.lit(int(snapshot_id)))
                          .cast("long"))
              .withColumn(DOCUMENT_ID, document_id(rows, tuple(identifier_columns), use_row_id))
              .withColumn(BULK_ACTION, F.when(F.col(CHANGE_TYPE).isin(INSERT, UPDATE_AFTER), F.lit(INDEX_ACTION))
                          .when(F.col(CHANGE_TYPE) == DELETE, F.lit(DELETE_ACTION))))
    if unique_ids or (not identifier_columns and not use_row_id):
        return events
    phase = F.when(F.col(CHANGE_TYPE) == DELETE, 0).otherwise(1)
    latest = Window.partitionBy(DOCUMENT_ID).orderBy(F.col(COMMIT_SEQUENCE_NUMBER).desc(),
                                                     F.col(CHANGE_ORDINAL).desc(), phase.desc())
    rank = "__icecdc_event_rank"
    return events.withColumn(rank, F.row_number().over(latest)).where(F.col(rank) == 1).drop(rank)
