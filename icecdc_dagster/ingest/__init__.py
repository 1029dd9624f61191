"""Debezium change events from a landing location into Iceberg tables (no Dagster imports)."""

from icecdc_dagster.ingest.ingester import (
                                            IngestResult,
                                            IngestSettings,
                                            TargetResult,
                                            committed_batches,
                                            expired_files,
                                            ingest_files,
                                            pending_files,
)

__all__ = ["IngestResult", "IngestSettings", "TargetResult", "committed_batches", "expired_files", "ingest_files",
           "pending_files"]
