"""What one ``ingest:`` entry asks for (targets, keys, modes, the ledger's horizon), and what a batch did."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icecdc_dagster.ingest import horizon
from icecdc_dagster.writer import MERGE


@dataclass(frozen=True)
class IngestSettings:
    """One ``ingest:`` entry. ``target`` is a table name or a template over envelope fields."""

    landing: str
    target: str
    identifier_columns: tuple[str, ...] | Mapping[str, tuple[str, ...]] = ()
    auto_create: bool = False
    schema: Mapping[str, Any] | None = None
    schema_evolution: bool = False
    files_per_batch: int = 1
    max_file_age_s: float = horizon.DEFAULT_MAX_FILE_AGE_S  # the ledger's horizon (``ingest.horizon``)
    take_expired_files: bool = False                        # ingest files past the horizon anyway
    write_mode: str | Mapping[str, str] = MERGE  # merge | equality_deletes; a mapping keys routed tables
    snapshot_deletes: bool = True  # a completed Debezium snapshot deletes the rows it lacks (snapshot_epoch)

    def keys_for(self, table: str) -> tuple[str, ...]:
        """Identifier columns of one target (a mapping keys routed tables by full or short name)."""
        if isinstance(self.identifier_columns, Mapping):
            cols = self.identifier_columns.get(table) or self.identifier_columns.get(table.rsplit(".", 1)[-1]) or ()
            return tuple(cols)
        return tuple(self.identifier_columns)

    def mode_for(self, table: str) -> str:
        """Write mode of one target (a mapping keys routed tables by full or short name; default merge)."""
        if isinstance(self.write_mode, Mapping):
            return str(self.write_mode.get(table) or self.write_mode.get(table.rsplit(".", 1)[-1]) or MERGE)
        return str(self.write_mode)


@dataclass(frozen=True)
class TargetResult:
    table: str
    skipped: bool
    snapshot_id: int | None
    counts: dict[str, int] = field(default_factory=dict)
    added_columns: tuple[str, ...] = ()
    widened_columns: tuple[str, ...] = ()  # "name: old -> new" promotions made for this batch


@dataclass(frozen=True)
class IngestResult:
    batch_id: str
    files: tuple[str, ...]
    skipped: bool
    targets: dict[str, TargetResult] = field(default_factory=dict)
    tombstones: int = 0
    events_read: int = 0  # every line of the batch: events, tombstones and dead letters
    expired: tuple[str, ...] = ()  # files past the ledger's horizon no batch records: set aside, not written

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {"events_read": self.events_read, "tombstones": self.tombstones,
                               "expired_files": len(self.expired)}
        for target in self.targets.values():
            for key, value in target.counts.items():
                out[key] = out.get(key, 0) + value
        return out
