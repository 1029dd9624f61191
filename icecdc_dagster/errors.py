"""Named exceptions: every error says which table, snapshot, key or file it is about.

Every class is either *transient* (``transient = True``: the same batch may succeed later - a
service away, another writer, a stop request; the line retries it with backoff and never stops for
it) or *terminal* (``transient = False``: retrying gives the same answer; the line stops at once and
names the cause and ``recovery``, the one command that continues it). The retry logic
(``lease.retry``) reads these two class attributes and nothing else; :func:`classify` finds them
for any exception, also for one that crossed a Spark executor (then only its name is left).
"""

import re
from typing import ClassVar

RETRY_COMMAND = "fix the cause, then run icecdc sync --config {config} --retry-failed"
RESYNC_COMMAND = "icecdc resync --config {config} --table {table}"
CONFIG_COMMAND = "fix {config}, then run icecdc sync --config {config} --retry-failed"
PIPELINE_FILE = "<pipeline.yaml>"  # a command's pipeline file where the code that renders it does not know it


def recovery_command(template: str, table_name: str, config_path: str | None = None) -> str:
    """A recovery command (``RETRY_COMMAND``, ``RESYNC_COMMAND``, ...) for a table, rendered in one place so
    that every message, check and status line names the same command; the engine knows no pipeline file
    (``config_path`` None: ``<pipeline.yaml>``), the Dagster layer and the CLI pass theirs."""
    return template.format(config=config_path or PIPELINE_FILE, table=table_name)


def resync_command(table_name: str, config_path: str | None = None) -> str:
    """The command that rebuilds a table's line: a full export into every sink (see :func:`recovery_command`)."""
    return recovery_command(RESYNC_COMMAND, table_name, config_path)


class IcecdcError(Exception):
    """Base class of every error this project raises on purpose."""

    transient: ClassVar[bool] = False
    # The command that continues the line after this error ({config}, {table}: the pipeline file, the table).
    recovery: ClassVar[str] = RETRY_COMMAND


class ConfigError(IcecdcError):
    """The pipeline YAML is invalid (names the file and the key)."""

    transient = False
    recovery = CONFIG_COMMAND


class RuntimeSetupError(IcecdcError):
    """What Spark needs cannot be found or started: Java, a jar, a driver, the process that hosts the lanes."""

    transient = False
    recovery = CONFIG_COMMAND


class SnapshotNotFoundError(IcecdcError):
    """A snapshot is not in the table's history or not an ancestor of its current snapshot."""

    transient = False
    recovery = RESYNC_COMMAND


class ChangelogError(IcecdcError):
    """The changes of a snapshot cannot be computed unambiguously."""


class IdentifierColumnError(ChangelogError):
    """Identifier columns are missing, nested, or null where a key is needed."""


class DuplicateKeyChangeError(ChangelogError):
    """One key has more than one INSERT or DELETE left in a single snapshot."""


class CheckpointError(IcecdcError):
    """A batch does not follow the sink's checkpoint (out of order or gap)."""

    transient = False
    recovery = RESYNC_COMMAND


class SinkWriteError(IcecdcError):
    """A sink rejected part of a batch; the checkpoint was not advanced."""


class IngestError(IcecdcError):
    """Change events cannot be ingested into their Iceberg target (names the target and landing file)."""


class StagingBranchLostError(IcecdcError):
    """A table's staging branch vanished between a batch's write and its publish (nothing was published)."""

    transient = True


class CommitDeclinedError(IngestError):
    """A write's ``before_commit`` check declined its batch after writing it (its files deleted, nothing committed).
    The ingester then reads that batch again the way it reads every batch, so no run fails with it."""

    transient = True


class TargetTableMissingError(IngestError):
    """An ingestion target does not exist and ``auto_create`` is off."""


class SchemaDeclarationError(IngestError):
    """A declared ingestion schema (column type, transform, property) is invalid."""


class TableHasNoSnapshotError(SnapshotNotFoundError):
    """The table exists but has never been written: there is no snapshot to read changes from."""

    transient = True


class UnsupportedFormatVersionError(ChangelogError):
    """The table's format version cannot hold what its settings ask for (a v1 table set to merge-on-read)."""

    transient = False
    recovery = CONFIG_COMMAND


class LineBusyError(IcecdcError):
    """Another writer holds the line (names the line and the holder: role, host, pid, since when)."""

    transient = True


class SyncInterruptedError(IcecdcError):
    """A sync was stopped by SIGINT/SIGTERM before it finished (names where it stopped)."""

    transient = True


class LineDivergedError(SnapshotNotFoundError):
    """A table's line can no longer continue from what the sinks applied (rollback, expiry,
    recreation); the message names what happened and the ``icecdc resync`` command that recovers."""


class TableRolledBackError(LineDivergedError):
    """The line's snapshot is not an ancestor of the table's current snapshot (rollback)."""


class SnapshotExpiredError(LineDivergedError):
    """A snapshot the line still needs was expired from the table's metadata."""


class TableRecreatedError(LineDivergedError):
    """The table was dropped and recreated (new table uuid) since the line was bootstrapped."""


class SupersededPartitionError(IcecdcError):
    """A partition before the line's latest resync was (re-)executed: it belongs to a superseded line."""

    transient = False
    recovery = "nothing to do: the partition is never applied again; run icecdc sync --config {config}"


class SchemaChangeError(SinkWriteError):
    """A source schema change a target cannot follow in place (identifier fields changed, a type that
    cannot be widened to the source's, a replica a by-name version left with two columns for one field):
    names the table, column and snapshot, and the ``icecdc resync`` command that rebuilds the target."""

    recovery = RESYNC_COMMAND


class StreamInputError(IngestError):
    """A stream input (NATS JetStream, Redis Streams) cannot deliver a batch: names the input and what to do
    (terminal: a broker that does not answer raises the client's own connection errors, which are transient)."""


class ReindexError(SinkWriteError):
    """A new index version cannot be built or swapped in (names the index, the version and why);
    the alias and the live version's checkpoint are left where they were."""


class SinkUnavailableError(SinkWriteError):
    """A sink's service did not answer (connection, timeout, overload) after the client's own retries:
    the batch may succeed later, so the line retries it with backoff instead of stopping."""

    transient = True


class CatalogUnavailableError(IcecdcError):
    """An Iceberg catalog did not answer (connection refused or reset, a timeout, a 5xx): names the catalog;
    the batch may succeed when it answers again, so the line waits and retries it with backoff."""

    transient = True


class DefinitionChangedError(ConfigError):
    """The pipeline file changes what a running line was built on (its identifier columns): the
    message names the old and new values and the ``icecdc resync`` command that rebuilds the line."""

    recovery = RESYNC_COMMAND


class AccessRefusedError(IcecdcError):
    """A server refused the secret a setting gave it (a catalog's credential, token or password, an
    OpenSearch cluster's basic-auth password): names the catalog or host and the setting, never the value.
    Retrying sends the same secret, so the line stops; nothing was applied."""

    recovery = ("set the setting's environment variable to the right secret, then run icecdc sync --config "
                "{config} --retry-failed")


class UnresolvedResourceError(IcecdcError):
    """A resource was used with its ``EnvVar`` config unresolved (outside Dagster's initialisation): its
    secrets would reach a server as the variables' names. A bug of the caller, never retried."""


TRANSIENT, TERMINAL, UNCLASSIFIED = "transient", "terminal", "unclassified"
# Errors of libraries we call that mean "the service did not answer" (opensearch-py's connection errors
# are not the builtin ConnectionError).
FOREIGN_TRANSIENT = frozenset({"ConnectionError", "ConnectionTimeout", "SSLError"})


def error_classes() -> list[type[IcecdcError]]:
    """Every class of the tree (loaded subclasses included), base first."""
    found, todo = [], [IcecdcError]
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(sorted(cls.__subclasses__(), key=lambda c: c.__name__))
    return found


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, class name) of an exception: ``transient``/``terminal`` for the tree's classes, found by
    type or - for one raised on a Spark executor and re-raised by Py4J - by its name in the message
    (the most specific name found wins); ``unclassified`` otherwise (retried up to ``max_retries``)."""
    if isinstance(exc, IcecdcError):
        return (TRANSIENT if exc.transient else TERMINAL), type(exc).__name__
    if isinstance(exc, ConnectionError | TimeoutError) or type(exc).__name__ in FOREIGN_TRANSIENT:
        return TRANSIENT, type(exc).__name__
    text = str(exc)
    named = [cls for cls in error_classes() if f"{cls.__name__}:" in text]
    if named:
        deepest = max(named, key=lambda cls: len(cls.__mro__))
        return (TRANSIENT if deepest.transient else TERMINAL), deepest.__name__
    return UNCLASSIFIED, type(exc).__name__


def failure_reference() -> str:
    """The table of every error class for docs/failures.md (``tests/test_errors.py`` keeps the page equal to it):
    what it means, its kind (what the line does with it) and the command that continues the line."""
    rows = ["| error | is a | kind | what it means | to continue |", "| --- | --- | --- | --- | --- |"]
    for cls in error_classes():
        meaning = " ".join((cls.__doc__ or "").split())
        sentence = re.match(r"(.+?[.)])(?= [A-Z(`]|$)", meaning)
        parent = cls.__mro__[1].__name__
        kind = TRANSIENT if cls.transient else TERMINAL
        command = recovery_command(cls.recovery, "<table>", "<pipeline.yaml>").replace("|", "\\|")
        then = "retried with backoff: nothing to do" if cls.transient else f"`{command}`"
        rows.append(f"| `{cls.__name__}` | `{parent}` | {kind} | {sentence.group(1) if sentence else meaning} "
                    f"| {then} |")
    return "\n".join(rows) + "\n"


def recovery_of(class_name: str) -> str | None:
    """The recovery command template of a tree class named ``class_name`` (None: not in the tree)."""
    return next((cls.recovery for cls in error_classes() if cls.__name__ == class_name), None)

class InstanceNotFoundError(IcecdcError):
    """A read (``icecdc status``) found no Dagster instance where the line's could be: it names the
    places it looked and the ``DAGSTER_HOME`` to set, and creates nothing."""

    recovery = "DAGSTER_HOME=<the directory the line runs in> icecdc status --config {config}"


class SnapshotOrderLostError(LineDivergedError):
    """A format v1 snapshot can no longer be counted from the line's last stored batch (its anchor is
    not on the snapshot's ancestry any more): v1 has no sequence numbers, the line numbers its snapshots
    along parent ids (``changelog.ordinals``), and that chain was rolled back or expired."""


class EqualityDeleteTargetError(IcecdcError):
    """A target cannot take the ``equality_deletes`` write mode as it is (format version 1, a partition
    source column outside the identifier columns, an unsupported transform, several partition specs):
    the message names the table and what to change; ``write_mode: merge`` always works."""

    transient = False
    recovery = CONFIG_COMMAND


class HiddenLandingFileError(IngestError):
    """A landing file named like a writer in progress (``.`` or ``_`` first) was passed to ingest explicitly:
    Spark's file reader skips such names, so it would read no line of it. Listing never returns them; rename
    the file when it is complete."""

    transient = False
