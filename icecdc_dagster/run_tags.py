"""Every run tag icecdc writes or reads, in one place.

The runs page shows a run's user tags; Dagster hides tags whose key starts with ``.dagster/`` (its
``HIDDEN_TAG_PREFIX``: GraphQL leaves them out of ``tags``, so the UI never lists them) and still
stores them, so every query by tag and every reader of ``run.tags`` finds them. So:

- shown: what a user scans the runs page for - the line and the batch's snapshots (``icecdc/table``
  is also the run queue's one-run-per-line key in ``dagster.yaml``: never rename it), for an ingest run
  the entry (``icecdc/ingest``) and its landing files or stream positions (``icecdc/batch``), the command that
  launched a run outside the daemon (``icecdc/launched_by``: a sensor's run has Dagster's own
  ``dagster/sensor_name``, which the UI's "Launched by" shows), and, on a failed run, why (failure
  kind, class and message; ``icecdc/failed_over`` when its worker died);
- hidden: worker bookkeeping that crash recovery reads - the holder of the run (host, pid, process
  start, boot id, since, role), its heartbeat, and the warm launcher's host, pid and session; and an
  ingest run's line (``ingest:<name>``, not a table: the run queue's and the line lock's key) and its
  first and last keys, which the retry policy, failover and the line's frontier read.

A table line's run is found by ``icecdc/table``, an ingest line's by its hidden line key (and, for runs
of a release that wrote ``icecdc/table: ingest:<name>``, by that): :func:`line_filters`, :func:`line_of`.

Runs launched by a release before the hidden keys carry the bookkeeping under ``icecdc/...``
(:data:`LEGACY`). A run in flight across the upgrade must still be judged by failover and run
monitoring, so readers go through :func:`read` / :func:`has`, which fall back to the old key; writers
write only the new keys.
"""

from collections.abc import Mapping

HIDDEN_PREFIX = ".dagster/"  # dagster._core.storage.tags.HIDDEN_TAG_PREFIX (not imported: no Dagster here)

# Shown on the runs page.
TABLE_TAG = "icecdc/table"
FIRST_SNAPSHOT_TAG = "icecdc/first_snapshot"
LAST_SNAPSHOT_TAG = "icecdc/last_snapshot"
INGEST_TAG = "icecdc/ingest"                  # an ingest run's entry (its name)
BATCH_TAG = "icecdc/batch"                    # an ingest run's landing files or stream positions: first..last
LAUNCHED_BY_TAG = "icecdc/launched_by"        # the command that made the run in process (icecdc sync, resync)
FAILED_OVER_TAG = "icecdc/failed_over"
FAILURE_KIND_TAG = "icecdc/failure_kind"      # transient | terminal | unclassified
FAILURE_CLASS_TAG = "icecdc/failure_class"    # the exception's class name
FAILURE_MESSAGE_TAG = "icecdc/failure"        # its message (cut to retry.MESSAGE_CHARS)

# Hidden: the process that executes the run (``lease.holder``) and its heartbeat.
_BOOKKEEPING = HIDDEN_PREFIX + "icecdc/"
WORKER_HOST_TAG = _BOOKKEEPING + "worker_host"
WORKER_PID_TAG = _BOOKKEEPING + "worker_pid"
WORKER_PID_START_TAG = _BOOKKEEPING + "worker_pid_start"
WORKER_BOOT_TAG = _BOOKKEEPING + "worker_boot_id"
WORKER_SINCE_TAG = _BOOKKEEPING + "worker_since"
WORKER_ROLE_TAG = _BOOKKEEPING + "worker_role"
WORKER_HEARTBEAT_TAG = _BOOKKEEPING + "worker_heartbeat"
# Hidden: the warm launcher (daemon) that accepted the run; its session tells this daemon's runs apart.
LAUNCHER_HOST_TAG = _BOOKKEEPING + "warm_launcher_host"
LAUNCHER_PID_TAG = _BOOKKEEPING + "warm_launcher_pid"
LAUNCHER_SESSION_TAG = _BOOKKEEPING + "warm_launcher_session"

# Hidden: an ingest run's line and keys (a table run's are its shown TABLE_TAG and *_SNAPSHOT_TAG).
LINE_TAG = _BOOKKEEPING + "line"
FIRST_KEY_TAG = _BOOKKEEPING + "first_key"
LAST_KEY_TAG = _BOOKKEEPING + "last_key"
INGEST_LINE_PREFIX = "ingest:"  # an ingest line's id: ingest:<name> (assets.naming.ingest_line_id)

# The keys the previous release wrote the bookkeeping under (read, never written).
LEGACY = {key: "icecdc/" + key.removeprefix(_BOOKKEEPING) for key in (
    WORKER_HOST_TAG, WORKER_PID_TAG, WORKER_PID_START_TAG, WORKER_BOOT_TAG, WORKER_SINCE_TAG, WORKER_ROLE_TAG,
    WORKER_HEARTBEAT_TAG, LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG)}

SHOWN = (TABLE_TAG, FIRST_SNAPSHOT_TAG, LAST_SNAPSHOT_TAG, INGEST_TAG, BATCH_TAG, LAUNCHED_BY_TAG, FAILED_OVER_TAG,
         FAILURE_KIND_TAG, FAILURE_CLASS_TAG, FAILURE_MESSAGE_TAG)


def read(tags: Mapping[str, str], key: str, default: str | None = None) -> str | None:
    """The run's value of ``key``, or of the key the previous release wrote it under."""
    value = tags.get(key)
    if value is None and key in LEGACY:
        value = tags.get(LEGACY[key])
    return default if value is None else value


def has(tags: Mapping[str, str], key: str) -> bool:
    return read(tags, key) is not None


def is_ingest_line(line_id: str) -> bool:
    return line_id.startswith(INGEST_LINE_PREFIX)


def line_tags(line_id: str, first_key: str, last_key: str) -> dict[str, str]:
    """What a run of ``line_id`` applying keys ``first_key``..``last_key`` carries: a table line's shown
    table and snapshots; an ingest line's entry and batch shown, its line and keys hidden."""
    if not is_ingest_line(line_id):
        return {TABLE_TAG: line_id, FIRST_SNAPSHOT_TAG: first_key, LAST_SNAPSHOT_TAG: last_key}
    batch = first_key if first_key == last_key else f"{first_key}..{last_key}"
    return {INGEST_TAG: line_id.removeprefix(INGEST_LINE_PREFIX), BATCH_TAG: batch, LINE_TAG: line_id,
            FIRST_KEY_TAG: first_key, LAST_KEY_TAG: last_key}


def line_of(tags: Mapping[str, str]) -> str | None:
    """The line a run belongs to (None: not a line's run)."""
    return tags.get(LINE_TAG) or tags.get(TABLE_TAG)


def first_key_of(tags: Mapping[str, str]) -> str | None:
    return tags.get(FIRST_KEY_TAG) or tags.get(FIRST_SNAPSHOT_TAG)


def last_key_of(tags: Mapping[str, str]) -> str | None:
    return tags.get(LAST_KEY_TAG) or tags.get(LAST_SNAPSHOT_TAG)


def line_filters(line_id: str, first_key: str | None = None) -> list[dict[str, str]]:
    """Tag filters that find the runs of ``line_id`` (starting at ``first_key`` when given), one query each:
    an ingest line's under its hidden keys and, for runs of an earlier release, under the shown ones."""
    shown = {TABLE_TAG: line_id, **({FIRST_SNAPSHOT_TAG: first_key} if first_key is not None else {})}
    if not is_ingest_line(line_id):
        return [shown]
    return [{LINE_TAG: line_id, **({FIRST_KEY_TAG: first_key} if first_key is not None else {})}, shown]
