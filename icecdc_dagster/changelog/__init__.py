"""Changelog engine: row-level changes of Iceberg snapshots (copy-on-write and merge-on-read, v2/v3).

Pure PySpark + pyiceberg metadata; no Dagster imports.
"""

from icecdc_dagster.changelog.engine import (
    ChangeSet,
    change_order,
    changes,
    check_keys,
    check_supported,
    data_columns,
    detect_updates,
    export,
    net_changes,
    net_changes_without_keys,
    remove_carry_over,
    uses_row_lineage,
    validate_identifier_columns,
)
from icecdc_dagster.changelog.events import canonical_string, document_id, to_events
from icecdc_dagster.changelog.key_checks import deferred_key_checks
from icecdc_dagster.changelog.ordinals import OrdinalAnchor
from icecdc_dagster.changelog.plan import (
    DeleteFileInfo,
    SnapshotPlan,
    accepted_predecessors,
    ancestry_ids,
    parent_of,
    plan_snapshot,
    snapshots_after,
)
from icecdc_dagster.changelog.read import staged_scan_count, staged_scans
from icecdc_dagster.changelog.row_count import exact_row_count, row_count

__all__ = [
    "ChangeSet", "DeleteFileInfo", "OrdinalAnchor", "SnapshotPlan", "accepted_predecessors", "ancestry_ids",
    "canonical_string",
    "change_order", "changes", "check_keys", "check_supported", "data_columns", "deferred_key_checks",
    "detect_updates", "document_id",
    "exact_row_count", "export", "net_changes", "net_changes_without_keys", "parent_of", "plan_snapshot",
    "remove_carry_over", "row_count",
    "snapshots_after", "staged_scan_count", "staged_scans", "to_events", "uses_row_lineage",
    "validate_identifier_columns",
]
