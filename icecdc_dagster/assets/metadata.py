"""Materialisation metadata of a batch: what an analyst wants to see in the UI."""

import time
from datetime import UTC, datetime
from typing import Any

from dagster import MetadataValue

from icecdc_dagster.batch import CHANGE_TYPES, BatchInfo


def batch_metadata(info: BatchInfo, parent_id: int | None, started_monotonic: float,
                   counts: dict[str, int], extra: dict[str, Any]) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    metadata: dict[str, Any] = {
        "snapshot_id": MetadataValue.text(str(info.snapshot_id)),
        "first_snapshot_id": MetadataValue.text(str(info.first_snapshot_id)),
        "parent_snapshot_id": MetadataValue.text(str(parent_id) if parent_id is not None else "none"),
        "snapshots_in_batch": len(info.snapshot_ids) or 1,
        "operation": info.operation,
        "sequence_number": info.sequence_number,
        "is_export": info.is_export,
        "commit_time": MetadataValue.timestamp(info.committed_at_ms / 1000),
        "lag_commit_to_applied_s": MetadataValue.float(round((now_ms - info.committed_at_ms) / 1000, 3)),
        "duration_s": MetadataValue.float(round(time.monotonic() - started_monotonic, 3)),
        "rows": sum(counts.values()),
    }
    for change_type in CHANGE_TYPES:
        metadata[f"count_{change_type.lower()}"] = int(counts.get(change_type, 0))
    for key, value in extra.items():
        metadata[key] = _metadata_value(value)
    return metadata


def _metadata_value(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value if value is not None else "none"
    if isinstance(value, datetime):
        return MetadataValue.timestamp(value.replace(tzinfo=value.tzinfo or UTC))
    if isinstance(value, dict):
        return MetadataValue.json({str(k): v for k, v in value.items()})
    if isinstance(value, list | tuple):
        return MetadataValue.json(list(value))
    return str(value)
