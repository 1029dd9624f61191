"""What a landing location (or stream input) has ingested: the ledger is the targets' own history.

Every commit records the batch id, the input's name and the full list of tables the batch writes, so a batch
committed to only some of its tables is completed under the same id, and one committed to all is skipped.
The ledger survives snapshot expiry (``writer.recorded_summaries``) and forgets what lies past its horizon
(``ingest.horizon``).
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icecdc_dagster.ingest import horizon, landing, routing
from icecdc_dagster.ingest.contract import IngestSettings
from icecdc_dagster.writer import (
    BATCH_ID_PROPERTY,
    java_table,
    namespace_exists,
    recorded_summaries,
    table_exists,
    table_properties,
)
from icecdc_dagster.writer.metadata_reads import recorded_in_metadata

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

LANDING_PROPERTY = "icecdc.landing"
TARGETS_PROPERTY = "icecdc.batch-targets"


def home_table(settings: IngestSettings) -> str:
    """Where events without a target go (and where an all-tombstone batch is recorded)."""
    if routing.is_template(settings.target):
        return routing.unrouted_dead_letter_table(settings.target)
    return routing.dead_letter_table(settings.target)


def _ledger_tables(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    if routing.is_template(settings.target):
        namespace = routing.namespace_of(settings.target)
        if not namespace_exists(spark, catalog_name, namespace):
            return []  # a fresh catalog: nothing ingested yet
        rows = spark.sql(f"SHOW TABLES IN {catalog_name}.{namespace}").collect()
        return [f"{namespace}.{r.tableName}" for r in rows]
    return [t for t in (settings.target, routing.dead_letter_table(settings.target))
            if table_exists(spark, catalog_name, t)]


@dataclass(frozen=True)
class Ledger:
    """What the targets of a landing location record: batch id -> committed to every table it writes, the
    recorded summaries of this landing, and the ledger tables' properties (for the horizon)."""

    batches: dict[str, bool]
    summaries: list[dict[str, str]]
    properties: list[dict[str, str]]

    def parts(self) -> set[str]:
        """Every ``<uri>#<start>-<end>`` part of a recorded batch (complete or not)."""
        return {part for bid in self.batches for part in bid.split(";")}


def read_ledger(spark: Any, catalog_name: str, settings: IngestSettings) -> Ledger:
    return _ledger(settings, ((table, table_properties(java_table(spark, f"{catalog_name}.{table}")),
                               recorded_summaries(spark, f"{catalog_name}.{table}"))  # survives snapshot expiry
                              for table in _ledger_tables(spark, catalog_name, settings)))


def read_ledger_from_metadata(catalog: "Catalog", settings: IngestSettings) -> Ledger:
    """:func:`read_ledger` from the tables' metadata by pyiceberg: no SparkSession (``icecdc status``)."""
    if routing.is_template(settings.target):
        namespace = routing.namespace_of(settings.target)
        names = ([".".join(ident[-2:]) for ident in catalog.list_tables(namespace)]
                 if catalog.namespace_exists(namespace) else [])
    else:
        names = [t for t in (settings.target, routing.dead_letter_table(settings.target)) if catalog.table_exists(t)]
    tables = [(name, catalog.load_table(name)) for name in names]
    return _ledger(settings, ((name, dict(t.properties), recorded_in_metadata(t)) for name, t in tables))


def _ledger(settings: IngestSettings,
            tables: Iterable[tuple[str, dict[str, str], Iterable[dict[str, str]]]]) -> Ledger:
    """The ledger of ``settings.landing`` from each ledger table's (name, properties, recorded summaries)."""
    seen: dict[str, set[str]] = {}
    wanted: dict[str, set[str]] = {}
    summaries: list[dict[str, str]] = []
    properties: list[dict[str, str]] = []
    for table, table_props, recorded in tables:
        properties.append(table_props)
        for summary in recorded:
            if summary.get(LANDING_PROPERTY) == settings.landing and BATCH_ID_PROPERTY in summary:
                bid = summary[BATCH_ID_PROPERTY]
                seen.setdefault(bid, set()).add(table)
                wanted[bid] = set(json.loads(summary.get(TARGETS_PROPERTY, "[]")))
                summaries.append(summary)
    return Ledger({bid: wanted[bid] <= tables for bid, tables in seen.items()}, summaries, properties)


def recorded_batches(spark: Any, catalog_name: str, settings: IngestSettings) -> dict[str, bool]:
    """Batch id -> True when committed to every table it writes, False when only to some of them
    (a crash between two commits: re-ingesting it with the SAME id completes it, nothing twice).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog or a target's metadata
            cannot be read (a service away: retried by the line as an unclassified error).
    """
    return read_ledger(spark, catalog_name, settings).batches


def committed_batches(spark: Any, catalog_name: str, settings: IngestSettings) -> set[str]:
    """Batch ids of this landing location committed to every table they write.

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog or a target's metadata
            cannot be read (a service away: retried by the line as an unclassified error).
    """
    return {bid for bid, complete in recorded_batches(spark, catalog_name, settings).items() if complete}


def ledger_horizon(settings: IngestSettings, ledger: Ledger,
                   listed: Sequence[landing.LandingFile] | None = None) -> horizon.Horizon:
    """The horizon of this landing location now (``ingest.horizon``)."""
    files = landing.list_files(settings.landing) if listed is None else listed
    return horizon.horizon(settings.max_file_age_s, files, ledger.summaries, ledger.properties)


def _unrecorded(spark: Any, catalog_name: str, settings: IngestSettings) -> horizon.Split:
    return _split(read_ledger(spark, catalog_name, settings), settings)


def _split(ledger: Ledger, settings: IngestSettings) -> horizon.Split:
    """Landing files not fully committed: recorded-but-partial ones are fresh (completed under their id)."""
    listed = landing.list_files(settings.landing)
    done_parts = {part for bid, complete in ledger.batches.items() if complete for part in bid.split(";")}
    recorded_parts = ledger.parts()
    waiting = [f for f in listed if f.batch_part not in done_parts]
    unrecorded = horizon.split([f for f in waiting if f.batch_part not in recorded_parts],
                               ledger_horizon(settings, ledger, listed), settings.take_expired_files)
    aside = {f.uri for f in unrecorded.set_aside}
    return horizon.Split([f for f in waiting if f.uri not in aside], unrecorded.expired, unrecorded.forgotten)


def pending_files(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    """Landing files in name order whose batch is not yet fully committed (files past the horizon set aside).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog or a target's metadata
            cannot be read (a service away: retried by the line as an unclassified error).
    """
    return [f.uri for f in _unrecorded(spark, catalog_name, settings).fresh]


def expired_files(spark: Any, catalog_name: str, settings: IngestSettings) -> list[str]:
    """Landing files past the ledger's horizon that were never ingested (the ledger vouches for it):
    neither ingested nor forgotten silently (``ingest.horizon``).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the catalog or a target's metadata
            cannot be read (a service away: retried by the line as an unclassified error).
    """
    return [f.uri for f in _unrecorded(spark, catalog_name, settings).expired]


def expired_files_in_metadata(catalog: "Catalog", settings: IngestSettings) -> list[str]:
    """:func:`expired_files` from the ledger tables' metadata (pyiceberg, no Spark: ``icecdc status``).

    Raises:
        pyiceberg.exceptions.NoSuchTableError: a ledger table was dropped while it was being read.
    """
    return [f.uri for f in _split(read_ledger_from_metadata(catalog, settings), settings).expired]
