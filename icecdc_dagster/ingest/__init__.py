"""Debezium change events from a landing location or a stream input into Iceberg tables (no Dagster imports).

The entry is :func:`ingest_files` / :func:`ingest_records` (:mod:`.ingester`); each concern of a batch is one
module: what an entry asks for (:mod:`.contract`), what has been ingested (:mod:`.ledger`), what each line says
(:mod:`.line_parsing`), what rows each target gets (:mod:`.targets`), snapshot epochs (:mod:`.epoch_marks`,
:mod:`.snapshot_epoch`) and the commit (:mod:`.commit`).
"""

from icecdc_dagster.ingest.contract import IngestResult, IngestSettings, TargetResult
from icecdc_dagster.ingest.ingester import ingest_files, ingest_records
from icecdc_dagster.ingest.ledger import committed_batches, expired_files, pending_files, recorded_batches

__all__ = ["IngestResult", "IngestSettings", "TargetResult", "committed_batches", "expired_files", "ingest_files",
           "ingest_records", "pending_files", "recorded_batches"]
