"""The one Iceberg writer both feeders use: collapse per key, one MERGE per batch, exactly-once commits."""

from icecdc_dagster.writer.exactly_once import BATCH_ID_PROPERTY, committed_batch_ids, committed_summaries
from icecdc_dagster.writer.merge import (
                                         OP_COLUMN,
                                         OP_DELETE,
                                         OP_INSERT,
                                         OP_UPSERT,
                                         ORDER_COLUMN,
                                         WriteOutcome,
                                         write_batch,
)

__all__ = ["BATCH_ID_PROPERTY", "OP_COLUMN", "OP_DELETE", "OP_INSERT", "OP_UPSERT", "ORDER_COLUMN", "WriteOutcome",
           "committed_batch_ids", "committed_summaries", "write_batch"]
