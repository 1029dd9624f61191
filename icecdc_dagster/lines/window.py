"""Where a table's line stands against its table: the window of snapshots still pending when the line
follows the table, else the whole line, read once (what the sensor, the ``line_follows_table`` check,
``icecdc status`` and the maintenance asset all decide the same way: :func:`line_view`)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import AssetKey, AssetRecordsFilter

from icecdc_dagster import changelog
from icecdc_dagster.batch import line_epoch
from icecdc_dagster.errors import SnapshotNotFoundError
from icecdc_dagster.lines.batch_metadata import BatchMetadata
from icecdc_dagster.lines.line import Line, done_in_every_asset, materialised_keys
from icecdc_dagster.steps import lifecycle

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table


def discover_new_keys(table: "Table", newest_known: str | None) -> list[str]:
    """Snapshot ids after the newest known key along the current ancestry (the bootstrap if none).
    Raises a ``LineDivergedError`` when the newest key is not in that ancestry (see ``diagnose``)."""
    current = table.current_snapshot()
    if current is None:
        return []
    if newest_known is None:
        return [str(current.snapshot_id)]
    return [str(sid) for sid in changelog.ancestry_ids(table, lifecycle.snapshot_id_of(newest_known))]


def recorded_table_uuid(instance: "DagsterInstance", table_line: Line, active: list[str]) -> str | None:
    """The source table uuid recorded by the line's latest changelog batch (the line's first asset), if
    it is on the active line."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=table_line.first_asset),
                                              limit=1).records
    if not records or records[0].partition_key not in set(active):
        return None
    return BatchMetadata.read(records[0].asset_materialization).source_table_uuid


def diagnose(instance: "DagsterInstance", table_line: Line, source_table: "Table", known: list[str],
             config_path: str | None, done: set[str] | None = None) -> lifecycle.LineProblem | None:
    """Why the line cannot continue (rollback, expiry, recreation), or None. ``done``: the active
    keys done in every asset, when the caller already has them."""
    active = lifecycle.active_keys(known)
    # Materialisation records, not Dagster's cached partition status (stale under concurrent writers).
    if done is None:
        done = done_in_every_asset(instance, table_line, active)
    return lifecycle.diagnose(source_table, table_line.line_id, known, done,
                              recorded_table_uuid(instance, table_line, active), config_path)


@dataclass(frozen=True)
class TableWindow:
    keys: list[str]   # the snapshots that can still be pending, in commit order (known or new)
    line: str | None  # the active line's token (its resync key), None for the original line
    applied: int      # the newest snapshot every asset has applied (the window starts after it)
    # Sinks added to the running line (never materialised) and the key the others applied last.
    joining: tuple[AssetKey, ...] = ()
    applied_key: str | None = None
    anchors: tuple[tuple[AssetKey, int], ...] = ()  # each asset's latest materialised snapshot

    def done(self, instance: "DagsterInstance", assets: tuple[AssetKey, ...]) -> set[str]:
        """The window's keys done in every one of ``assets``. The line runs in order, so an asset has
        applied every key up to its latest one even without a materialisation of each (a sink that
        joined the line at its export has none before it)."""
        position = {str(sid): i for i, sid in enumerate(self.keys)}
        latest = dict(self.anchors)
        done = set(self.keys)
        for asset_key in assets:
            reached = set(self.keys[:position.get(str(latest.get(asset_key)), -1) + 1])
            rest = [key for key in done if key not in reached]
            done = (done & reached) | materialised_keys(instance, asset_key, rest)
        return done


@dataclass(frozen=True)
class WholeLine:
    """Every key of the line, read when its window cannot tell: what the line is diagnosed on."""

    known: list[str]

    @property
    def active(self) -> list[str]:
        """The keys of the active line (those before the latest resync are superseded)."""
        return lifecycle.active_keys(self.known)

    @property
    def token(self) -> str | None:
        """The active line's resync key, None for the original line."""
        return lifecycle.line_token(self.known)

    @property
    def superseded(self) -> int:
        return len(self.known) - len(self.active)


def line_view(instance: "DagsterInstance", table_line: Line, source_table: "Table") -> TableWindow | WholeLine:
    """The window when the line follows the table (metadata and indexed queries only, whatever the
    history: :func:`table_window`); otherwise every key of the line, read once, for the caller to
    diagnose (a resync without a batch yet, a rolled back, expired or recreated table)."""
    window = table_window(instance, table_line, source_table)
    if window is not None:
        return window
    return WholeLine(list(instance.get_dynamic_partitions(table_line.partitions_name)))


def ancestry_window(instance: "DagsterInstance", table_line: Line, source_table: "Table") -> list[str] | None:
    """The snapshots that can still be pending, in commit order: the table's ancestry after the oldest
    of the line's assets' latest materialisations (metadata and indexed queries only, whatever the
    history).

    None - the caller then diagnoses the whole line - when an asset has never been materialised, when
    a latest key left the ancestry (rollback, expiry, a recreated table), or when a resync started a
    new line that the latest materialisations do not all belong to yet.
    """
    window = table_window(instance, table_line, source_table)
    return window.keys if window is not None else None


def table_window(instance: "DagsterInstance", table_line: Line, source_table: "Table") -> TableWindow | None:
    """:func:`ancestry_window`, with the active line's token: the line every asset's latest batch
    recorded (no later resync exists when there is a window).

    Assets whose latest batches recorded different lines (a resync whose sink step failed: the changelog
    is on the new line, the sink still on the old one) give None: the window of the older key would
    hold the plain ids of the snapshots the resync partition covers.

    A sink never materialised (added to the pipeline file while the line runs) does not hold the
    window back: it is named in ``joining`` and takes its own export with the next batch.
    """
    anchors: set[int] = set()
    lines: set[str | None] = set()
    joining: list[AssetKey] = []
    keys: dict[int, str] = {}
    latest: dict[AssetKey, int] = {}
    for asset_key in table_line.asset_keys:
        records = instance.fetch_materializations(asset_key, limit=1).records
        if not records or records[0].partition_key is None:
            if asset_key in table_line.joinable:
                joining.append(asset_key)
                continue
            return None
        anchors.add(lifecycle.snapshot_id_of(records[0].partition_key))
        keys[lifecycle.snapshot_id_of(records[0].partition_key)] = records[0].partition_key
        latest[asset_key] = lifecycle.snapshot_id_of(records[0].partition_key)
        lines.add(BatchMetadata.read(records[0].asset_materialization).line)
    if len(lines) > 1:
        return None
    current_line = lines.pop()
    epoch = line_epoch(current_line)
    windows: dict[int, list[str]] = {}
    for anchor in anchors:
        try:
            windows[anchor] = [str(sid) for sid in changelog.ancestry_ids(source_table, anchor)]
        except (SnapshotNotFoundError, ValueError):
            return None
    applied = max(windows, key=lambda anchor: len(windows[anchor]))
    window = windows[applied]
    # A resync adds "<snapshot>@resync<n>" at the table's current snapshot: the anchors or the window.
    next_resync = [f"{sid}{lifecycle.RESYNC_MARK}{epoch + 1}" for sid in [*anchors, *window]]
    if instance.get_existing_dynamic_partitions(table_line.partitions_name, next_resync):
        return None
    return TableWindow(window, current_line, applied, tuple(joining), keys[applied], tuple(latest.items()))
