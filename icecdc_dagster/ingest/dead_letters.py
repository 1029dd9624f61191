"""Dead-letter tables: every event that cannot be written lands in ``<target>__dead_letters`` with its reason."""

from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.writer import ensure_namespace

DEAD_LETTER_DDL = ("raw string, reason string, source_file string, source_offset bigint, target string, "
                   "batch_id string, dead_lettered_at timestamp")
DEAD_LETTER_COLUMNS = ("raw", "reason", "source_file", "source_offset", "target", "batch_id", "dead_lettered_at")


def ensure_table(spark: Any, catalog_name: str, table: str) -> None:
    ensure_namespace(spark, catalog_name, table)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {catalog_name}.{table} ({DEAD_LETTER_DDL}) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")


def schema() -> "Schema":
    """The schema :func:`ensure_table` creates (Spark's DDL: every column optional, ``timestamp`` with
    zone), known without reading the table."""
    types = {"string": StringType(), "bigint": LongType(), "timestamp": TimestamptzType()}
    columns = [column.split() for column in DEAD_LETTER_DDL.split(",")]
    return Schema(*[NestedField(field_id=i, name=name, field_type=types[kind], required=False)
                    for i, (name, kind) in enumerate(columns, 1)])


def frame(rows: DataFrame, batch_id: str) -> DataFrame:
    """Dead-letter rows from columns raw/reason/source_file/source_offset/target."""
    return (rows.withColumn("batch_id", F.lit(batch_id)).withColumn("dead_lettered_at", F.current_timestamp())
            .select(*DEAD_LETTER_COLUMNS))
