"""Bulk actions and how their per-item results count; pure functions, no I/O.

A version conflict means the index already holds this version or a newer one
of the document (a replayed or stale batch): it counts as already applied.
A DELETE of a missing document is applied too (the tombstone still records
its version).
"""

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from icecdc_dagster.batch import DELETE_ACTION, INDEX_ACTION
from icecdc_dagster.errors import SinkWriteError

RETRYABLE_STATUS = frozenset((429, 500, 502, 503, 504))
INDEXED, DELETED, DELETE_NOT_FOUND, VERSION_CONFLICT, FAILED, RETRY = (
    "indexed", "deleted", "delete_not_found", "version_conflicts", "failed", "retry")
CREATED, UPDATED = "created", "updated"  # how each INDEXED action was answered (a new document, or a newer version)
COUNT_KEYS = (INDEXED, CREATED, UPDATED, DELETED, DELETE_NOT_FOUND, VERSION_CONFLICT, FAILED)


class MissingDocumentIdError(SinkWriteError, ValueError):
    """A DELETE event without document_id cannot name the document to delete."""


@lru_cache(maxsize=16)
def _quoted(index: str) -> str:
    return json.dumps(index)


def _check(index: str, doc_id: str | None, action: str, version: int | None) -> str:
    """The bulk operation of an event ("index" or "delete"), or the reason it cannot be sent."""
    if doc_id is not None and version is None:
        raise ValueError(f"{action} event for document {doc_id!r} of index {index} has no _commit_sequence_number "
                         f"to use as its external version")
    if action == DELETE_ACTION:
        if doc_id is None:
            raise MissingDocumentIdError(f"DELETE event without document_id for index {index}")
        return "delete"
    if action != INDEX_ACTION:
        raise ValueError(f"unknown bulk_action {action!r} for document {doc_id!r} of index {index}")
    return "index"


def bulk_action(index: str, doc_id: str | None, action: str, version: int | None, source: str | None) -> dict[str, Any]:
    """The opensearch-py action for one event; ``source`` is the document as a JSON string."""
    op = _check(index, doc_id, action, version)
    if op == "delete":
        return {"_op_type": "delete", "_index": index, "_id": doc_id,
                "_version": version, "_version_type": "external"}
    act: dict[str, Any] = {"_op_type": "index", "_index": index, "_source": source}
    if doc_id is not None:
        act.update(_id=doc_id, _version=version, _version_type="external")
    return act


def bulk_lines(index: str, doc_id: str | None, action: str, version: int | None, source: str | None) -> tuple[str, str]:
    """(operation, NDJSON text) of one event: what :func:`bulk_action` becomes on the wire (its action
    line, and the document for an INDEX), rendered directly: the per-document cost of the executor."""
    op = _check(index, doc_id, action, version)
    if doc_id is None:
        meta = f'{{"index":{{"_index":{_quoted(index)}}}}}\n'
    else:
        meta = (f'{{"{op}":{{"_index":{_quoted(index)},"_id":{json.dumps(doc_id)},"version":{int(version or 0)},'
                f'"version_type":"external"}}}}\n')
    return op, meta if op == "delete" else f"{meta}{source}\n"


def classify(ok: bool, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(outcome, item info) of one item of a bulk response (``ok``: its status is 2xx)."""
    op, info = next(iter(item.items()))
    status = info.get("status", 500)
    if ok:
        return (DELETED if op == "delete" else INDEXED), info
    error = info.get("error") or {}
    error_type = error.get("type") if isinstance(error, dict) else None
    if status == 409 and error_type == "version_conflict_engine_exception":
        return VERSION_CONFLICT, info
    if op == "delete" and status == 404 and not error:
        return DELETE_NOT_FOUND, info
    if status in RETRYABLE_STATUS:
        return RETRY, info
    return FAILED, info


def indexed_as(info: dict[str, Any]) -> str:
    """CREATED or UPDATED: what an INDEXED item's ``result`` says it did (what the counts check compares)."""
    return CREATED if info.get("result") == "created" else UPDATED


def failure_reason(op: str, info: dict[str, Any]) -> str:
    error = info.get("error")
    if isinstance(error, dict):
        text = f"{error.get('type')}: {error.get('reason')}"
        cause = error.get("caused_by")
        if isinstance(cause, dict) and cause.get("reason"):
            text += f" (caused by {cause.get('type')}: {cause.get('reason')})"
    else:
        text = str(error or info.get("result"))
    return f"{op} _id={info.get('_id')} status={info.get('status')}: {text}"


@dataclass
class WriteSummary:
    """What the bulk writes of a batch (or one Spark partition) did."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_KEYS, 0))
    actions: int = 0
    reasons: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    partitions: int = 0

    @property
    def ok(self) -> bool:
        return not self.fatal and self.counts[FAILED] == 0

    def add_failure(self, reason: str, limit: int) -> None:
        self.counts[FAILED] += 1
        if len(self.reasons) < limit:
            self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "actions": self.actions, "reasons": self.reasons, "fatal": self.fatal,
                "partitions": self.partitions}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WriteSummary":
        return cls(counts={key: int(data["counts"].get(key, 0)) for key in COUNT_KEYS}, actions=int(data["actions"]),
                   reasons=list(data["reasons"]), fatal=list(data["fatal"]), partitions=int(data["partitions"]))

    def merge(self, other: "WriteSummary", limit: int) -> None:
        for key in COUNT_KEYS:
            self.counts[key] += other.counts.get(key, 0)
        self.actions += other.actions
        self.reasons.extend(other.reasons[: max(limit - len(self.reasons), 0)])
        self.fatal.extend(other.fatal)
        self.partitions += other.partitions
