"""What each kind of asset records: one typed set per kind, written and read through the same classes.

``SourceMetadata`` (a source partition's snapshot), ``ChangelogMetadata``, ``ReplicaMetadata`` and
``OpenSearchMetadata`` (a sink's batch, by its kind: :data:`SINK_SETS`), ``IngestMetadata`` (an ingest
run): each follows Dagster's ``NamespacedMetadataSet`` (``TableMetadataSet``, ``dagster_dbt``'s
``DbtMetadataSet``): typed fields, ``{**ChangelogMetadata(...)}`` into ``MaterializeResult(metadata=...)``,
``.extract(metadata)`` back. ``BatchMetadata`` has every set's fields: readers (the sensor, the checks,
``icecdc status``, the next batch) read any kind's metadata through it. docs/dagster-ui.md lists every key
with its meaning (tests/dagster_layer/test_asset_pages.py holds the UI's labels to that list).

Keys people read are written bare (``snapshot_id``, ``count_insert``): what every release wrote, what the
docs and users' saved views in the UI name. Bookkeeping only the product reads back (:data:`BOOKKEEPING`:
the line, the source table's identity, how ordinals were counted, an ingest batch's engine id) is written
under ``icecdc/`` (``icecdc/line``) and read under the bare key older releases wrote too.

Reading tolerates what older releases wrote: a key missing gives None, a value of another type is
dropped rather than failing the reader (a sensor tick or ``icecdc status`` never breaks on metadata),
and renamed keys are read under their old names (:meth:`current_key_by_legacy_key`).

Figures named by the engine or a sink (row statistics, a sink's outcome counts and details, an ingest run's
totals) fill the fields of the writer's set that carry their names (typed, 0 included where the set says
so); the others are shown beside the set (:meth:`with_figures`) and never read back here.
"""

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Self

from dagster import JsonMetadataValue, MarkdownMetadataValue, MetadataValue, TimestampMetadataValue
from dagster._core.definitions.metadata.metadata_set import NamespacedMetadataSet  # not in dagster's API
from pydantic import ValidationError

from icecdc_dagster.batch import CHANGE_TYPES, BatchInfo
from icecdc_dagster.sinks.base import Disagreement

if TYPE_CHECKING:
    from dagster import AssetKey, AssetMaterialization, AssetObservation, DagsterInstance

NONE = "none"  # what a snapshot id field shows when there is none (no parent, no checkpoint yet)
DISAGREEMENTS = "sink_disagreements"  # a sink's counts that contradict its batch's events (a figure)
ANCESTRY = "ancestry"  # ``ordered_by`` of a changelog batch on a line that counts ordinals (format v1)
# Engine figures that repeat a fact of the set under another name: shown once, under the set's key.
REPEATS = {"snapshots": "snapshots_in_batch", "export": "is_export", "insert_rows": "count_insert",
           "delete_rows": "count_delete", "update_before_rows": "count_update_before",
           "update_after_rows": "count_update_after"}
# Figures only the product's code reads (how the engine grouped carry-over candidates, how a MERGE's counts
# were taken): kept out of what people read (``docs/dagster-ui.md``).
INTERNAL = frozenset({"carry_over_groups_in_arrow", "carry_over_groups_by_lineage", "counted_by"})


# The product's own bookkeeping: what the sensor, the checks, ``icecdc status`` and the next batch read back
# and a person has no use for (which line a batch belongs to, the source table's identity, how ordinals
# were counted, an ingest batch's id as the engine stamps it into snapshot summaries). Written under the
# ``icecdc/`` namespace, apart from the facts people read; read under the bare key older releases wrote too.
BOOKKEEPING = frozenset({"line", "source_table_uuid", "ordered_by", "batch_id"})
NAMESPACE = "icecdc"


class _Facts(NamespacedMetadataSet):
    """What every set shares: keys bare (module docstring), except :data:`BOOKKEEPING` under ``icecdc/``;
    reading tolerant of what older releases wrote."""

    @classmethod
    def namespace(cls) -> str:
        return NAMESPACE

    @classmethod
    def _namespaced_key(cls, key: str) -> str:
        return f"{NAMESPACE}/{key}" if key in BOOKKEEPING else key

    @staticmethod
    def _strip_namespace_from_key(key: str) -> str:
        return key.removeprefix(f"{NAMESPACE}/")

    @classmethod
    def extract(cls, values: Mapping[str, Any]) -> Self:
        """The set's fields found in ``values`` (materialisation metadata, stored values or plain ones);
        a field whose key is missing, or whose value does not fit its type, is None."""
        legacy = {current: old for old, current in cls.current_key_by_legacy_key().items()}
        found: dict[str, Any] = {}
        for name in cls.model_fields:
            # Its key now, else the bare key an older release wrote it under, else a renamed key's old name.
            keys = (cls._namespaced_key(name), name, legacy.get(name))
            key = next((k for k in keys if k is not None and k in values), None)
            if key is not None:
                found[name] = cls._extract_value(field_name=name, value=values[key])
        while True:
            try:
                return cls(**found)
            except ValidationError as exc:
                wrong = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
                if not wrong & set(found):
                    raise
                found = {name: value for name, value in found.items() if name not in wrong}

    @classmethod
    def read(cls, event: "AssetMaterialization | AssetObservation | None") -> Self:
        """What a materialisation (or observation) recorded; the empty set for none."""
        return cls.extract(event.metadata) if event is not None else cls()

    @classmethod
    def latest(cls, instance: "DagsterInstance", asset_key: "AssetKey") -> Self:
        """What the asset's latest materialisation (of any partition) recorded; the empty set for none."""
        return cls.read(latest_materialization(instance, asset_key))

    def with_figures(self, figures: Mapping[str, Any]) -> dict[str, Any]:
        """The set as metadata, followed by figures named by the engine or a sink (shown, not read back
        here). A figure under a key of the set fills that field when the set leaves it unset (typed: a
        sink's counts are fields of its kind's set); otherwise the set's value stands and the figure is left
        out, so a reader never takes a figure for a fact. So is a figure that repeats a fact under the
        engine's name for it (:data:`REPEATS`), or that only the product's own code reads (:data:`INTERNAL`).
        A figure named ``*_snapshot_id`` is text, as the set's snapshot ids are."""
        fields = type(self).model_fields
        text = {key: str(value) if key.endswith("snapshot_id") and isinstance(value, int)
                and not isinstance(value, bool) else value for key, value in figures.items()}
        fills = {key: figure_value(value) for key, value in text.items()
                 if key in fields and getattr(self, key) is None and value is not None}
        filled = type(self).extract({**dict(self), **fills}) if fills else self
        shown = {key: value for key, value in text.items()
                 if key not in fields and key not in REPEATS and key not in INTERNAL}
        return {**filled, **{key: figure_value(value) for key, value in shown.items()}}


class _Bookkeeping(_Facts):
    """:data:`BOOKKEEPING` (every kind of batch may carry it)."""

    # The line the batch belongs to (its resync key; absent: the original line).
    line: str | None = None
    source_table_uuid: str | None = None  # the table the changelog batch was computed from
    ordered_by: str | None = None  # ANCESTRY, or absent (real sequence numbers)
    batch_id: str | None = None  # an ingest batch's id, as its snapshot summaries carry it


class SourceMetadata(_Bookkeeping):
    """``iceberg/<ns>/<table>``: each partition's snapshot; the newest also the table's current snapshot
    and how many the line added (plus the table's metadata, :mod:`assets.table_metadata`)."""

    snapshot_id: str | None = None
    current_snapshot_id: str | None = None
    new_snapshots: int | None = None


class _BatchFacts(_Bookkeeping):
    """Where a batch sits in the source table's history, its timing, and its events per change type.
    Snapshot ids are text: they exceed 2^53, and the UI reads numbers as doubles."""

    snapshot_id: str | None = None
    first_snapshot_id: str | None = None
    parent_snapshot_id: str | None = None  # NONE for a table's first snapshot
    snapshots_in_batch: int | None = None
    operation: str | None = None
    sequence_number: int | None = None
    is_export: bool | None = None
    commit_time: TimestampMetadataValue | None = None
    lag_commit_to_applied_s: float | None = None
    duration_s: float | None = None
    # The batch's events: all of them, and per change type (0 included).
    rows: int | None = None
    count_insert: int | None = None
    count_delete: int | None = None
    count_update_before: int | None = None
    count_update_after: int | None = None

    @classmethod
    def of_batch(cls, info: BatchInfo, parent_id: int | None, started_monotonic: float,
                 counts: Mapping[str, int], **fields: Any) -> Self:
        """A batch's position, timing and events per change type (``counts``), with ``fields`` of the
        asset's kind (``line``, ``sink``, ...)."""
        now_ms = int(time.time() * 1000)
        per_type = {event_count_key(t): int(counts.get(t, 0)) for t in CHANGE_TYPES}
        return cls(snapshot_id=str(info.snapshot_id), first_snapshot_id=str(info.first_snapshot_id),
                   parent_snapshot_id=str(parent_id) if parent_id is not None else NONE,
                   snapshots_in_batch=len(info.snapshot_ids) or 1, operation=info.operation,
                   sequence_number=info.sequence_number, is_export=info.is_export,
                   commit_time=MetadataValue.timestamp(info.committed_at_ms / 1000),
                   lag_commit_to_applied_s=round((now_ms - info.committed_at_ms) / 1000, 3),
                   duration_s=seconds_since(started_monotonic), rows=sum(counts.values()), **per_type, **fields)


class ChangelogMetadata(_BatchFacts):
    """``changelog/<ns>/<table>_changelog``: how the change rows were found and where they are stored."""

    batch_kind: str | None = None
    changelog_table: str | None = None
    changelog_snapshot_id: str | None = None
    # What the engine read (its figures, typed here): data files, delete files the snapshots added, rows read
    # (where counted), rows that cancelled out (copy-on-write carry-over), seconds planning.
    files_read: int | None = None
    delete_files_added: int | None = None
    rows_read: int | None = None
    carry_over_removed: int | None = None
    plan_s: float | None = None


class SinkMetadata(_BatchFacts):
    """What every sink's batch records: whether it was applied, the checkpoint the sink holds after it."""

    ALWAYS: ClassVar[tuple[str, ...]] = ()  # the sink's own counts, shown 0 when it counted none of them

    @classmethod
    def sink_counts(cls, counts: Mapping[str, int]) -> dict[str, int]:
        """A sink's own counts as ``sink_<name>`` figures, those of :attr:`ALWAYS` 0 where it counted none
        (an append-only replica counts ``appended`` instead: its keyed counts are not shown)."""
        always = {} if "appended" in counts else dict.fromkeys(cls.ALWAYS, 0)
        return sink_figures({**always, **counts})

    skipped_already_applied: bool | None = None
    checkpoint_snapshot_id: str | None = None  # what the sink holds after the batch; NONE: nothing yet
    joined_line_export: bool | None = None  # a sink added to the running line took its own export
    # The first batch of the line whose sink counts contradicted its events (``sink_disagreements``); carried
    # by every later batch of the sink on the line: the target has not equalled the source since.
    diverged_at_snapshot_id: str | None = None


class ReplicaMetadata(SinkMetadata):
    """``replica/...``: an Iceberg replica's batch; its MERGE's own counts (0 included) and its commit."""

    sink_inserted: int | None = None
    sink_updated: int | None = None
    sink_deleted: int | None = None
    sink_delete_missing: int | None = None
    sink_appended: int | None = None  # an append-only replica: rows appended (the keyed counts are absent)
    target_snapshot_id: str | None = None
    added_columns: JsonMetadataValue | None = None
    schema_changes: JsonMetadataValue | None = None

    ALWAYS: ClassVar[tuple[str, ...]] = ("inserted", "updated", "deleted", "delete_missing")


class OpenSearchMetadata(SinkMetadata):
    """``opensearch/<index>_opensearch``: the bulk's answers (0 included), the index it wrote."""

    sink_indexed: int | None = None
    sink_created: int | None = None
    sink_updated: int | None = None
    sink_deleted: int | None = None
    sink_delete_not_found: int | None = None
    sink_version_conflicts: int | None = None
    sink_failed: int | None = None
    sink_actions: int | None = None
    index: str | None = None
    index_version: str | None = None
    partitions: int | None = None  # Spark partitions that wrote bulks
    seconds: float | None = None  # the bulks' seconds
    reindexed: str | None = None  # why the batch built a new index version

    ALWAYS: ClassVar[tuple[str, ...]] = ("indexed", "created", "updated", "deleted", "delete_not_found",
                                         "version_conflicts", "failed", "actions")


class IngestMetadata(_Bookkeeping):
    """``ingest/<name>``: one run's landing files (or stream batch), what it wrote (0 included) and where."""

    duration_s: float | None = None
    skipped_already_committed: bool | None = None
    files: JsonMetadataValue | None = None
    expired: JsonMetadataValue | None = None
    targets: MarkdownMetadataValue | None = None
    events_read: int | None = None
    tombstones: int | None = None
    expired_files: int | None = None
    dead_lettered: int | None = None
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    delete_missing: int | None = None
    appended: int | None = None
    upserted: int | None = None
    delete_keys: int | None = None
    ignored_fields: int | None = None
    stringified: int | None = None
    nanos_truncated: int | None = None
    python_rules: int | None = None  # lines the native reader handed to the (slower) Python rules
    # A stream input's batch.
    ALWAYS: ClassVar[tuple[str, ...]] = ("events_read", "tombstones", "expired_files", "dead_lettered")
    input: str | None = None
    first_position: str | None = None
    last_position: str | None = None
    messages: int | None = None
    redelivered_skipped: int | None = None
    consumer_lag: int | None = None
    lag_pending: int | None = None
    lag_unacknowledged: int | None = None


class MaintenanceMetadata(_Facts):
    """``maintenance/<ns>/<table>_maintenance``: what one run did over every table it maintained (0 included:
    the Plots tab has no gaps); each table's own figures are shown beside, as ``<table>: <figure>``."""

    tables_maintained: int | None = None
    tables_compacted: int | None = None
    rewritten_data_files: int | None = None
    removed_delete_files: int | None = None
    deleted_batches: int | None = None  # changelog batches every sink applied, past the retention
    expired_snapshots: int | None = None
    skipped: str | None = None  # why nothing was maintained (the source does not exist yet)


class BatchMetadata(ChangelogMetadata, ReplicaMetadata, OpenSearchMetadata, IngestMetadata, SourceMetadata):
    """Every set's fields, for readers (the sensor, the checks, ``icecdc status``, the next batch): each
    kind of asset writes through its own set (:data:`SETS`); a reader reads any of them through this one."""

    @property
    def checkpoint(self) -> int | None:
        """The snapshot the sink held after the batch (None: none recorded, or no checkpoint yet)."""
        return _snapshot(self.checkpoint_snapshot_id)

    @property
    def counts_ordinals(self) -> bool:
        """A changelog batch of a line that counts its own ordinals (format v1: ``changelog.ordinals``)."""
        return self.ordered_by == ANCESTRY

    @property
    def ordinal_position(self) -> tuple[int, int] | None:
        """(last snapshot id, sequence number) of a batch that counts ordinals, else None."""
        snapshot = _snapshot(self.snapshot_id)
        if not self.counts_ordinals or snapshot is None or self.sequence_number is None:
            return None
        return snapshot, self.sequence_number


# Each kind of asset's set, as docs/dagster-ui.md lists them (a sink's by its kind's YAML key).
SINK_SETS: dict[str, type[SinkMetadata]] = {"iceberg": ReplicaMetadata, "opensearch": OpenSearchMetadata}
SETS: dict[str, type[_Facts]] = {"source": SourceMetadata, "changelog": ChangelogMetadata, "replica": ReplicaMetadata,
                                 "opensearch": OpenSearchMetadata, "ingest": IngestMetadata,
                                 "maintenance": MaintenanceMetadata}


def sink_set(kind: str) -> type[SinkMetadata]:
    """The set a sink of ``kind`` writes its batches through (a kind without one of its own: the common set)."""
    return SINK_SETS.get(kind, SinkMetadata)


def latest_materialization(instance: "DagsterInstance", asset_key: "AssetKey") -> "AssetMaterialization | None":
    """The asset's latest materialisation, of any partition (one indexed query); None when it has none."""
    records = instance.fetch_materializations(asset_key, limit=1).records
    return records[0].asset_materialization if records else None


def seconds_since(started_monotonic: float) -> float:
    return round(time.monotonic() - started_monotonic, 3)


def event_count_key(change_type: str) -> str:
    """The key of a batch's events of one change type (``count_insert``)."""
    return f"count_{change_type.lower()}"


def sink_figure_key(name: str) -> str:
    """The key of one of a sink's own outcome counts (``sink_inserted``)."""
    return f"sink_{name}"


def sink_figures(counts: Mapping[str, int]) -> dict[str, int]:
    """A sink's own outcome counts (inserted, updated, actions, ...), shown as ``sink_<name>`` beside the
    events it was given (``count_*``)."""
    return {sink_figure_key(name): value for name, value in counts.items()}


def disagreement_figure(disagreement: Disagreement) -> dict[str, Any]:
    """One disagreement in the metadata's own names: which ``sink_*`` count, against which ``count_*``."""
    events = " + ".join(event_count_key(t) for t in disagreement.change_types) or "none (0)"
    return {"count": sink_figure_key(disagreement.count), "found": disagreement.found, "events": events,
            "expected": disagreement.expected, "difference": disagreement.difference, "cause": disagreement.cause}


def disagreement_figures(found: Sequence[Disagreement]) -> dict[str, Any]:
    """``sink_disagreements`` of a batch whose sink counts contradict its events; nothing when they agree."""
    return {DISAGREEMENTS: [disagreement_figure(d) for d in found]} if found else {}


def figure_value(value: Any) -> Any:
    """A figure as Dagster stores it: scalars as they are (None as NONE), datetimes as timestamps,
    mappings and sequences as JSON, anything else as its text."""
    if isinstance(value, bool | int | float | str | MetadataValue) or value is None:
        return value if value is not None else NONE
    if isinstance(value, datetime):
        return MetadataValue.timestamp(value.replace(tzinfo=value.tzinfo or UTC))
    if isinstance(value, dict):
        return MetadataValue.json({str(k): v for k, v in value.items()})
    if isinstance(value, list | tuple):
        return MetadataValue.json(list(value))
    return str(value)


def _snapshot(value: str | None) -> int | None:
    try:
        return int(value) if value and value != NONE else None
    except ValueError:  # not a snapshot id: as good as none
        return None


__all__ = ["ANCESTRY", "BOOKKEEPING", "DISAGREEMENTS", "INTERNAL", "NONE", "REPEATS", "SETS", "SINK_SETS",
           "BatchMetadata", "ChangelogMetadata", "IngestMetadata", "MaintenanceMetadata", "OpenSearchMetadata",
           "ReplicaMetadata", "SinkMetadata", "SourceMetadata", "disagreement_figure", "disagreement_figures",
           "event_count_key",
           "figure_value", "latest_materialization", "seconds_since", "sink_figure_key", "sink_figures", "sink_set"]
