"""What a batch's materialisation records (changelog, replica, OpenSearch, ingest) and what a source
observation records about its snapshot: one typed set, written and read through the same class.

The set follows Dagster's ``NamespacedMetadataSet`` (``TableMetadataSet``, ``dagster_dbt``'s
``DbtMetadataSet``): typed fields, ``{**BatchMetadata(...)}`` into ``MaterializeResult(metadata=...)``,
``BatchMetadata.extract(metadata)`` back. One difference: its keys are written bare (``snapshot_id``,
``line``, ``count_insert``), not ``icecdc/snapshot_id``. They are what every release wrote, what the docs,
the tests and users' saved views in the UI name; the namespace names the set, not its keys.

Reading tolerates what older releases wrote: a key missing gives None, a value of another type is
dropped rather than failing the reader (a sensor tick or ``icecdc status`` never breaks on metadata),
and renamed keys are read under their old names (:meth:`BatchMetadata.current_key_by_legacy_key`).

Figures named by the engine or a sink (row statistics, a sink's outcome counts and details, an ingest
run's totals) are shown beside the set (:meth:`BatchMetadata.with_figures`) and never read back here.
"""

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

from dagster import JsonMetadataValue, MetadataValue, TimestampMetadataValue
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


class BatchMetadata(NamespacedMetadataSet):
    """The facts of one batch. Every field is optional: each kind of asset records its own subset."""

    # Where the batch sits in the source table's history. Snapshot ids are text: they exceed 2^53, and
    # the UI reads numbers as doubles.
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
    # The batch's events: all of them, and per change type.
    rows: int | None = None
    count_insert: int | None = None
    count_delete: int | None = None
    count_update_before: int | None = None
    count_update_after: int | None = None
    # The line the batch belongs to (its resync key; absent: the original line) and, for changelog
    # batches, the table it was computed from and how its ordinals were counted.
    line: str | None = None
    source_table_uuid: str | None = None
    ordered_by: str | None = None  # ANCESTRY, or absent (real sequence numbers)
    # Changelog batches: how the change rows were found and where they are stored.
    batch_kind: str | None = None
    changelog_table: str | None = None
    changelog_snapshot_id: str | None = None
    # Sink batches.
    sink: str | None = None
    skipped_already_applied: bool | None = None
    checkpoint_snapshot_id: str | None = None  # what the sink holds after the batch; NONE: nothing yet
    joined_line_export: bool | None = None  # a sink added to the running line took its own export
    # The first batch of the line whose sink counts contradicted its events (``sink_disagreements``); carried
    # by every later batch of the sink on the line: the target has not equalled the source since.
    diverged_at_snapshot_id: str | None = None
    # Ingest batches (and each commit to an ingest's target table).
    batch_id: str | None = None
    skipped_already_committed: bool | None = None
    files: JsonMetadataValue | None = None
    expired: JsonMetadataValue | None = None
    targets: JsonMetadataValue | None = None
    input: str | None = None
    first_position: str | None = None
    last_position: str | None = None
    messages: int | None = None
    redelivered_skipped: int | None = None
    consumer_lag: int | None = None
    lag_pending: int | None = None
    lag_unacknowledged: int | None = None
    # Source observations: the newest one carries the table's current snapshot and how many are new.
    current_snapshot_id: str | None = None
    new_snapshots: int | None = None

    @classmethod
    def namespace(cls) -> str:
        return "icecdc"

    @classmethod
    def _namespaced_key(cls, key: str) -> str:
        return key  # bare keys: see the module docstring

    @staticmethod
    def _strip_namespace_from_key(key: str) -> str:
        return key

    @classmethod
    def extract(cls, values: Mapping[str, Any]) -> Self:
        """The set's fields found in ``values`` (materialisation metadata, stored values or plain ones);
        a field whose key is missing, or whose value does not fit its type, is None."""
        legacy = {current: old for old, current in cls.current_key_by_legacy_key().items()}
        found: dict[str, Any] = {}
        for name in cls.model_fields:
            key = name if name in values else legacy.get(name)
            if key is not None and key in values:
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

    def with_figures(self, figures: Mapping[str, Any]) -> dict[str, Any]:
        """The set as metadata, followed by figures named by the engine or a sink (shown, not read back
        here). The set's keys are its own: a figure under one of them is left out, set or not, so a
        reader never takes a figure for a fact; so is a figure that repeats a fact under the engine's
        name for it (:data:`REPEATS`), or that only the product's own code reads (:data:`INTERNAL`).
        A figure named ``*_snapshot_id`` is text, as the set's snapshot ids are."""
        fields = type(self).model_fields
        shown = {key: value for key, value in figures.items()
                 if key not in fields and key not in REPEATS and key not in INTERNAL}
        return {**self, **{key: figure_value(str(value) if key.endswith("snapshot_id") and isinstance(value, int)
                                             and not isinstance(value, bool) else value)
                           for key, value in shown.items()}}

    # Typed readings of the fields a reader compares.

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


__all__ = ["ANCESTRY", "DISAGREEMENTS", "INTERNAL", "NONE", "REPEATS", "BatchMetadata", "disagreement_figure",
           "disagreement_figures", "event_count_key", "figure_value", "latest_materialization", "seconds_since",
           "sink_figure_key", "sink_figures"]
