"""Named exceptions: every error says which table, snapshot, key or file it is about."""


class IcecdcError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(IcecdcError):
    """The pipeline YAML is invalid (names the file and the key)."""


class RuntimeSetupError(IcecdcError):
    """Java, a jar or a driver needed to start Spark cannot be found."""


class SnapshotNotFoundError(IcecdcError):
    """A snapshot is not in the table's history or not an ancestor of its current snapshot."""


class ChangelogError(IcecdcError):
    """The changes of a snapshot cannot be computed unambiguously."""


class IdentifierColumnError(ChangelogError):
    """Identifier columns are missing, nested, or null where a key is needed."""


class DuplicateKeyChangeError(ChangelogError):
    """One key has more than one INSERT or DELETE left in a single snapshot."""


class CheckpointError(IcecdcError):
    """A batch does not follow the sink's checkpoint (out of order or gap)."""


class SinkWriteError(IcecdcError):
    """A sink rejected part of a batch; the checkpoint was not advanced."""


class IngestError(IcecdcError):
    """Change events cannot be ingested into their Iceberg target (names the target and landing file)."""


class StagingBranchLostError(IcecdcError):
    """A table's staging branch vanished between a batch's write and its publish (nothing was published)."""


class TargetTableMissingError(IngestError):
    """An ingestion target does not exist and ``auto_create`` is off."""


class SchemaDeclarationError(IngestError):
    """A declared ingestion schema (column type, transform, property) is invalid."""


class TableHasNoSnapshotError(SnapshotNotFoundError):
    """The table exists but has never been written: there is no snapshot to read changes from."""


class UnsupportedFormatVersionError(ChangelogError):
    """The table's Iceberg format version cannot order its changes (v1 has no sequence numbers)."""


class LineBusyError(IcecdcError):
    """Another writer holds the line (names the line and the holder: role, host, pid, since when)."""


class SyncInterruptedError(IcecdcError):
    """A sync was stopped by SIGINT/SIGTERM before it finished (names where it stopped)."""


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


class InstanceNotFoundError(IcecdcError):
    """A read (``icecdc status``) found no Dagster instance where the line's could be: it names the
    places it looked and the ``DAGSTER_HOME`` to set, and creates nothing."""
