"""A replica compared with its source at the replica checkpoint: count, and a Bernoulli sample of
source rows (no sort of the table) looked up in the replica."""

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession

from icecdc_dagster.changelog import row_count
from icecdc_dagster.column_names import column
from icecdc_dagster.sinks.kind import Comparison

if TYPE_CHECKING:
    from pyiceberg.table import Table


def compare_replica(spark: SparkSession, replica: str, source_rows: DataFrame, source_count: int,
                    sample_size: int, replica_table: "Table") -> Comparison:
    """``replica_table``: the replica's pyiceberg table, whose metadata counts its rows where that is exact."""
    target = spark.table(replica)
    fraction = min(1.0, 5.0 * sample_size / max(source_count, 1))
    sample = source_rows.sample(fraction=fraction, seed=7).limit(sample_size).cache()
    missing = sample.exceptAll(target.select(*[column(c) for c in source_rows.columns])).limit(5).collect()
    sampled = sample.count()
    sample.unpersist()
    return Comparison(row_count(replica_table, target), [str(row.asDict()) for row in missing], sampled)
