"""The one Iceberg writer both feeders use: collapse per key, one MERGE per batch, exactly-once commits."""

from icecdc_dagster.writer.auto_create import (
                                         add_columns,
                                         create_table,
                                         declared_columns,
                                         ensure_namespace,
                                         namespace_exists,
                                         widen_columns,
)
from icecdc_dagster.writer.equality_deletes import EQUALITY_DELETES, MERGE, write_equality_delta
from icecdc_dagster.writer.exactly_once import (
                                         BATCH_ID_PROPERTY,
                                         LAST_BATCH_PROPERTY,
                                         TARGET_SNAPSHOT_KEY,
                                         LedgerRetention,
                                         committed_batch_ids,
                                         committed_summaries,
                                         java_table,
                                         last_batch,
                                         last_batch_in,
                                         ledger_dropped_upto,
                                         ledger_entries,
                                         main_ancestors,
                                         recorded_summaries,
                                         table_properties,
)
from icecdc_dagster.writer.field_ids import (
                                         FIELD_MAP_PROPERTY,
                                         Evolution,
                                         SourceSchemas,
                                         align_by_name,
                                         columns_by_field_id,
                                         encode_mapping,
                                         fields_by_id,
                                         follow_source_schema,
                                         infer_mapping,
                                         load_mapping,
                                         schema_of,
)
from icecdc_dagster.writer.file_statistics import column_ranges
from icecdc_dagster.writer.merge import (
                                         OP_COLUMN,
                                         OP_DELETE,
                                         OP_INSERT,
                                         OP_UPSERT,
                                         ORDER_COLUMN,
                                         KeyBounds,
                                         WriteOutcome,
                                         bounds_aggregates,
                                         bounds_from,
                                         bounds_of_ranges,
                                         observation_values,
                                         write_batch,
)
from icecdc_dagster.writer.tables import (
    MANIFEST_MERGE_PROPERTY,
    MERGED_MANIFEST_COUNT,
    copy_table,
    drop_table,
    set_identifier_fields,
    table_exists,
)
from icecdc_dagster.writer.type_ddl import split_top

__all__ = [
    "BATCH_ID_PROPERTY", "EQUALITY_DELETES", "Evolution", "FIELD_MAP_PROPERTY", "KeyBounds", "LAST_BATCH_PROPERTY",
    "MANIFEST_MERGE_PROPERTY", "MERGED_MANIFEST_COUNT",
    "LedgerRetention", "MERGE", "OP_COLUMN", "OP_DELETE", "OP_INSERT", "OP_UPSERT", "ORDER_COLUMN", "SourceSchemas",
    "TARGET_SNAPSHOT_KEY", "WriteOutcome", "add_columns", "align_by_name", "bounds_aggregates", "bounds_from",
    "bounds_of_ranges",
    "column_ranges", "columns_by_field_id", "committed_batch_ids", "committed_summaries", "copy_table", "create_table",
    "declared_columns", "drop_table", "encode_mapping", "ensure_namespace", "fields_by_id", "follow_source_schema",
    "infer_mapping", "java_table", "last_batch", "last_batch_in", "ledger_dropped_upto", "ledger_entries",
    "load_mapping", "main_ancestors", "namespace_exists", "observation_values", "recorded_summaries", "schema_of",
    "set_identifier_fields", "split_top", "table_exists", "table_properties", "widen_columns", "write_batch",
    "write_equality_delta",
]
