"""CDC events -> (document id, action, version, JSON source), computed in Spark.

The JSON is rendered by Spark's ``to_json`` in the JVM, so executors only
forward strings: temporal values become ISO-8601 (timestamptz in UTC with
offset ``Z``), decimals full-precision strings, binary base64, structs objects,
lists arrays, maps objects. NaN and infinities (not JSON) become null. Null
fields are written as explicit nulls so a document always carries every
column of its row.
"""

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster import batch as b
from icecdc_dagster.changelog.events import ICEBERG_SNAPSHOT_OPERATION
from icecdc_dagster.column_names import column

ID, ACTION, VERSION, SOURCE = "_os_id", "_os_action", "_os_version", "_os_source"
# iceberg_operation is the row's change (INSERT / UPDATE_AFTER / DELETE); see changelog.events.
ICEBERG_METADATA_COLUMNS = (b.ICEBERG_OPERATION, ICEBERG_SNAPSHOT_OPERATION, b.ICEBERG_TABLE_NAME,
                            b.ICEBERG_SNAPSHOT_ID)
# Columns that describe the change, not the row; never part of a document.
RESERVED_COLUMNS = frozenset(
    (*b.CHANGE_COLUMNS, *b.EVENT_COLUMNS, ICEBERG_SNAPSHOT_OPERATION, b.ROW_ID, b.LAST_UPDATED_SEQUENCE_NUMBER,
     "_file", "_pos", "_spec_id", "_partition", "_deleted"))
JSON_OPTIONS = {
    "timeZone": "UTC",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
    "ignoreNullFields": "false",
}


def document_columns(events: DataFrame, include_iceberg_metadata: bool = False) -> list[str]:
    """The source table's columns in ``events`` (plus iceberg_* metadata when asked)."""
    keep = [c for c in events.columns if c not in RESERVED_COLUMNS]
    if include_iceberg_metadata:
        keep += [c for c in ICEBERG_METADATA_COLUMNS if c in events.columns]
    return keep


def _needs_conversion(data_type: T.DataType) -> bool:
    if isinstance(data_type, (T.DecimalType, T.BinaryType, T.FloatType, T.DoubleType)):
        return True
    if isinstance(data_type, T.StructType):
        return any(_needs_conversion(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _needs_conversion(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _needs_conversion(data_type.keyType) or _needs_conversion(data_type.valueType)
    return False


def json_ready(column: Column, data_type: T.DataType) -> Column:
    """``column`` with every value turned into what the JSON document should hold."""
    if not _needs_conversion(data_type):
        return column
    if isinstance(data_type, T.DecimalType):
        return column.cast("string")
    if isinstance(data_type, T.BinaryType):
        return F.base64(column)
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        finite = ~F.isnan(column) & (F.abs(column) != F.lit(float("inf")))
        return F.when(finite, column)
    if isinstance(data_type, T.StructType):
        fields = [json_ready(column.getField(f.name), f.dataType).alias(f.name) for f in data_type.fields]
        return F.when(column.isNotNull(), F.struct(*fields))
    if isinstance(data_type, T.ArrayType):
        return F.transform(column, lambda x: json_ready(x, data_type.elementType))
    if isinstance(data_type, T.MapType):
        converted = column
        if _needs_conversion(data_type.keyType):
            converted = F.transform_keys(converted, lambda k, _v: json_ready(k, data_type.keyType))
        if _needs_conversion(data_type.valueType):
            converted = F.transform_values(converted, lambda _k, v: json_ready(v, data_type.valueType))
        return converted
    return column


def with_generated_ids(events: DataFrame, columns: list[str]) -> DataFrame:
    """Fill a null ``document_id`` (append-only table without key) with an id derived from the row.

    ``<snapshot>-<sha256 of the row>-<n>``, n numbering identical rows of one
    snapshot: the same batch always yields the same ids, so a rerun after a
    failure overwrites instead of duplicating.
    """
    types = {f.name: f.dataType for f in events.schema.fields}
    content = F.sha2(F.to_json(F.struct(*[json_ready(column(c), types[c]).alias(c) for c in columns]),
                               JSON_OPTIONS), 256)
    digest = F.when(F.col(b.DOCUMENT_ID).isNull(),
                    F.concat_ws("-", F.col(b.COMMIT_SNAPSHOT_ID).cast("string"), content))
    group = F.coalesce(digest, F.col(b.DOCUMENT_ID))
    occurrence = F.row_number().over(Window.partitionBy(group).orderBy(group))
    generated = F.concat_ws("-", F.lit("g"), digest, occurrence.cast("string"))
    return events.withColumn(b.DOCUMENT_ID, F.coalesce(F.col(b.DOCUMENT_ID), generated))


def bulk_rows(events: DataFrame, include_iceberg_metadata: bool = False) -> DataFrame:
    """One row per bulk action: id, INDEX/DELETE, external version, JSON source (null for DELETE)."""
    columns = document_columns(events, include_iceberg_metadata)
    types = {f.name: f.dataType for f in events.schema.fields}
    document = F.struct(*[json_ready(column(c), types[c]).alias(c) for c in columns])
    return events.select(
        F.col(b.DOCUMENT_ID).cast("string").alias(ID),
        F.col(b.BULK_ACTION).alias(ACTION),
        F.col(b.COMMIT_SEQUENCE_NUMBER).cast("long").alias(VERSION),
        F.when(F.col(b.BULK_ACTION) == F.lit(b.INDEX_ACTION), F.to_json(document, JSON_OPTIONS)).alias(SOURCE),
    )
