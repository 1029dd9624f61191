"""The sink's checkpoint lives in the target index's mapping ``_meta``.

Keeping it on the index itself means the checkpoint and the documents can
only disappear together: a deleted or recreated index reads as "no
checkpoint", so the export is applied again instead of claiming data that is
gone. Layout: ``_meta.icecdc.checkpoints[<sink name>] = {snapshot_id,
sequence_number, table, applied_at_ms, line}`` (``line``: the resync key, absent for the original
line) (ids as strings: they are 64-bit).
``_meta`` is replaced as a whole by put_mapping, so other keys are read first
and written back.

Behind the alias (:mod:`.versions`) each index version holds its own checkpoint: the one the
alias names is the sink's; a version being built carries the checkpoint of the snapshot it was
built to, and becomes the sink's the moment the alias moves to it.
"""

import time
from typing import Any

from icecdc_dagster.batch import BatchInfo, Checkpoint
from icecdc_dagster.errors import CheckpointError

META_KEY = "icecdc"
VERSION_KEY = "index_version"  # what the index version was built for (see versions.py)


def index_mappings(client: Any, index: str) -> dict[str, Any] | None:
    """The index's ``mappings`` (properties and ``_meta``), or None when the index does not exist."""
    from opensearchpy.exceptions import NotFoundError  # opensearch-py: ~1.2 s, its sink only

    try:
        response = client.indices.get_mapping(index=index)
    except NotFoundError:
        return None
    # An alias resolves to its one concrete index.
    if len(response) != 1:
        raise CheckpointError(f"index {index} resolves to {sorted(response)}; the sink needs exactly one index")
    return next(iter(response.values())).get("mappings", {})


def read_checkpoint(client: Any, index: str, sink_name: str) -> Checkpoint | None:
    mappings = index_mappings(client, index)
    return None if mappings is None else checkpoint_in(mappings, index, sink_name)


def checkpoint_in(mappings: dict[str, Any], index: str, sink_name: str) -> Checkpoint | None:
    """The sink's checkpoint in an index's ``mappings`` (as get_mapping returns them)."""
    entry = ((mappings.get("_meta") or {}).get(META_KEY) or {}).get("checkpoints", {}).get(sink_name)
    if entry is None:
        return None
    try:
        return Checkpoint(int(entry["snapshot_id"]), int(entry["sequence_number"]), entry.get("line"))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{sink_name}: unreadable checkpoint in _meta of index {index}: {entry!r}") from exc


def write_checkpoint(client: Any, index: str, sink_name: str, batch: BatchInfo,
                     schema: dict[str, Any] | None = None) -> Checkpoint:
    """Advance the checkpoint; ``schema``: the field map the version's documents now follow
    (recorded with it in one put_mapping, see :mod:`.versions`)."""
    mappings = index_mappings(client, index)
    if mappings is None:
        raise CheckpointError(f"{sink_name}: index {index} disappeared before snapshot {batch.snapshot_id} "
                              f"of {batch.table_name} could be checkpointed")
    meta = dict(mappings.get("_meta") or {})
    ours = dict(meta.get(META_KEY) or {})
    checkpoints = dict(ours.get("checkpoints") or {})
    checkpoints[sink_name] = {
        "snapshot_id": str(batch.snapshot_id),
        "sequence_number": str(batch.sequence_number),
        "table": batch.table_name,
        "applied_at_ms": int(time.time() * 1000),
    }
    if batch.line is not None:
        checkpoints[sink_name]["line"] = batch.line
    ours["checkpoints"] = checkpoints
    if schema is not None:
        ours[VERSION_KEY] = {**(ours.get(VERSION_KEY) or {}), "schema": schema}
    meta[META_KEY] = ours
    client.indices.put_mapping(index=index, body={"_meta": meta})
    return batch.checkpoint
