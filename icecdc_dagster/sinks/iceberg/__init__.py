"""Iceberg replica sink: each changelog batch of a source table MERGEd into a downstream table."""

from icecdc_dagster.sinks.iceberg.sink import (
                                               LINE_PROPERTY,
                                               SOURCE_ROW_ID,
                                               SOURCE_SEQUENCE_PROPERTY,
                                               SOURCE_SNAPSHOT_PROPERTY,
                                               SOURCE_TABLE_PROPERTY,
                                               IcebergReplicaSink,
)

__all__ = ["LINE_PROPERTY", "SOURCE_ROW_ID", "SOURCE_SEQUENCE_PROPERTY", "SOURCE_SNAPSHOT_PROPERTY",
           "SOURCE_TABLE_PROPERTY", "IcebergReplicaSink"]
