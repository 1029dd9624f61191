"""Every error class is under ``IcecdcError`` and is transient or terminal, as the retry logic reads it;
a failed run is judged by its tags: a dead worker and a transient error never spend ``max_retries``."""

import ast
import importlib
import pkgutil
import time
import uuid
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, DynamicPartitionsDefinition
from dagster._core.events import RunFailureReason
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import RUN_FAILURE_REASON_TAG

import icecdc_dagster
from icecdc_dagster import errors, run_tags
from icecdc_dagster.errors import classify
from icecdc_dagster.lease import retry
from icecdc_dagster.lines import line as lines
from icecdc_dagster.run_tags import FAILED_OVER_TAG
from icecdc_dagster.steps.ordering import Blocked, NextRun

# Written by hand: the decision for every class (a new class fails this test until it is decided here).
TRANSIENT = {"LineBusyError", "SyncInterruptedError", "StagingBranchLostError", "TableHasNoSnapshotError",
             "SinkUnavailableError", "BulkRequestFailedError", "CatalogUnavailableError", "CommitDeclinedError"}
TERMINAL = {"IcecdcError", "ConfigError", "RuntimeSetupError", "SnapshotNotFoundError", "ChangelogError",
            "IdentifierColumnError", "DuplicateKeyChangeError", "CheckpointError", "SinkWriteError", "IngestError",
            "TargetTableMissingError", "SchemaDeclarationError", "UnsupportedFormatVersionError",
            "LineDivergedError", "TableRolledBackError", "SnapshotExpiredError", "TableRecreatedError",
            "SupersededPartitionError", "DefinitionChangedError", "DeleteWithoutDocumentIdError",
            "MissingDocumentIdError", "ClassFileError", "ConnectSchemaError", "EventError", "CoercionError",
            "SchemaChangeError", "ReindexError", "StreamInputError", "InstanceNotFoundError",
            "SnapshotOrderLostError", "EqualityDeleteTargetError", "HiddenLandingFileError", "UnresolvedResourceError",
            "AccessRefusedError"}
RESYNC = {"SnapshotNotFoundError", "LineDivergedError", "TableRolledBackError", "SnapshotExpiredError",
          "TableRecreatedError", "CheckpointError", "DefinitionChangedError", "SchemaChangeError",
          "SnapshotOrderLostError"}


def _import_everything() -> None:
    root = Path(icecdc_dagster.__file__).parent
    for module in pkgutil.walk_packages([str(root)], prefix="icecdc_dagster."):
        if module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)


def _exception_classes_in_source() -> set[str]:
    """Every class in the package that derives from something named *Error or *Exception."""
    found = set()
    for path in Path(icecdc_dagster.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in node.bases):
                found.add(node.name)
    return found


def test_every_error_class_is_in_the_tree_and_decided():
    _import_everything()
    tree = {cls.__name__: cls for cls in errors.error_classes()}
    assert _exception_classes_in_source() <= set(tree), "an error class outside IcecdcError"
    assert set(tree) == TRANSIENT | TERMINAL and not TRANSIENT & TERMINAL
    for name, cls in tree.items():
        assert cls.transient is (name in TRANSIENT), name
        assert classify(cls("x")) == ("transient" if name in TRANSIENT else "terminal", name)
        command = cls.recovery.format(config="p.yaml", table="db.t")
        assert "icecdc" in command, name
        if name in RESYNC:
            assert command == "icecdc resync --config p.yaml --table db.t", name


def test_classify_finds_a_class_raised_on_an_executor_by_name_and_leaves_foreign_errors_unclassified():
    _import_everything()
    crossed = RuntimeError("Job aborted. Traceback ...\nicecdc_dagster.sinks.opensearch.writer."
                           "BulkRequestFailedError: bulk request to index i failed after 3 attempts")
    assert classify(crossed) == ("transient", "BulkRequestFailedError")
    keyed = RuntimeError("PythonException: DuplicateKeyChangeError: key id=3 has two INSERTs")
    assert classify(keyed) == ("terminal", "DuplicateKeyChangeError")
    assert classify(ConnectionRefusedError("refused")) == ("transient", "ConnectionRefusedError")
    assert classify(KeyError("x")) == ("unclassified", "KeyError")
    assert isinstance(errors.SinkUnavailableError("x"), errors.SinkWriteError)   # still caught as before


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as dagster_instance:
        yield dagster_instance


LINE = lines.Line("db.t", DynamicPartitionsDefinition(name="db__t"), (AssetKey(["changelog", "db", "t"]),),
                  max_keys_per_run=5, max_retries=1)


def _failed(instance, key: str, **tags: str) -> str:  # noqa: ANN001
    run_id = str(uuid.uuid4())
    run = instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=DagsterRunStatus.STARTED,
                                      tags={run_tags.TABLE_TAG: LINE.line_id, run_tags.FIRST_SNAPSHOT_TAG: key,
                                            **tags}))
    instance.report_run_failed(run)
    return run_id


def test_dead_workers_and_transient_errors_never_spend_retries_terminal_stops_at_once(instance, monkeypatch):
    instance.add_dynamic_partitions(LINE.partitions_name, ["s1", "s2"])
    for _ in range(7):                                                   # seven kills in a row
        _failed(instance, "s1", **{FAILED_OVER_TAG: "worker died: pid 1 is gone"})
    planned = lines.plan(instance, LINE, patient=False)                  # icecdc sync: at once
    assert planned == NextRun("s1", "s2", ("s1", "s2"), 8)              # a new run key, nothing spent
    assert lines.failures_of(instance, LINE, "s1") == 0
    unattended = lines.plan(instance, LINE)                             # the sensor: an OOM loop is slowed
    assert isinstance(unattended, Blocked) and not unattended.failed and unattended.retry_at is not None
    assert "died 7 times in a row" in unattended.reason

    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 600.0)
    error = errors.SinkUnavailableError("opensearch/i: the cluster did not answer")
    run_id = _failed(instance, "s1")
    retry.record_failure(instance, run_id, error)
    waiting = lines.plan(instance, LINE)
    assert isinstance(waiting, Blocked) and not waiting.failed and waiting.retry_at is not None
    assert "transient" in waiting.reason and "SinkUnavailableError" in waiting.reason
    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)
    assert isinstance(lines.plan(instance, LINE), NextRun)              # after the backoff: retried, not spent
    assert lines.failures_of(instance, LINE, "s1") == 0

    run_id = _failed(instance, "s1")
    retry.record_failure(instance, run_id, errors.DuplicateKeyChangeError("db.t: key id=3 has two INSERTs"))
    stopped = lines.plan(instance, LINE, config_path="p.yaml")
    assert isinstance(stopped, Blocked) and stopped.failed
    assert "DuplicateKeyChangeError: db.t: key id=3" in stopped.reason
    assert "icecdc sync --config p.yaml --retry-failed" in stopped.reason


def test_runs_that_never_started_are_not_reported_as_dead_workers(instance):
    """A start timeout (run monitoring, no free lane) is said as such; a streak mixing both says both."""
    instance.add_dynamic_partitions(LINE.partitions_name, ["s1"])
    timed_out = {RUN_FAILURE_REASON_TAG: RunFailureReason.START_TIMEOUT.value}
    for _ in range(3):
        _failed(instance, "s1", **timed_out)
    waiting = lines.plan(instance, LINE)
    assert isinstance(waiting, Blocked) and not waiting.failed and waiting.retry_at is not None
    assert "never started 3 times in a row" in waiting.reason and "died" not in waiting.reason
    assert "start_timeout_seconds" in waiting.reason
    _failed(instance, "s1", **{FAILED_OVER_TAG: "worker died: pid 1 is gone"})
    mixed = lines.plan(instance, LINE)
    assert isinstance(mixed, Blocked) and "did no work 4 times in a row (1 workers died" in mixed.reason
    assert "3 runs never started" in mixed.reason
    assert lines.failures_of(instance, LINE, "s1") == 0                 # none of them spent a retry


def test_the_most_severe_failure_of_a_run_is_kept_and_backoff_doubles(instance):
    run_id = _failed(instance, "s1")
    retry.record_failure(instance, run_id, errors.TableRolledBackError("db.t was rolled back"))
    retry.record_failure(instance, run_id, errors.LineBusyError("busy"))   # a later, milder failure
    tags = instance.get_run_by_id(run_id).tags
    assert (tags[run_tags.FAILURE_KIND_TAG], tags[run_tags.FAILURE_CLASS_TAG]) == ("terminal", "TableRolledBackError")
    streak = retry.Attempts(runs=3, spent=0, transient_streak=3,
                            latest=retry.Failure("transient", "LineBusyError", "busy", time.time()))
    assert streak.backoff_s() == min(retry.RETRY_BACKOFF_MAX_S, retry.RETRY_BACKOFF_S * 4)


def test_one_place_renders_the_recovery_commands():
    assert errors.resync_command("db.t", "/etc/p.yaml") == "icecdc resync --config /etc/p.yaml --table db.t"
    assert errors.resync_command("db.t") == "icecdc resync --config <pipeline.yaml> --table db.t"   # the engine's
    assert errors.recovery_command(errors.RETRY_COMMAND, "db.t", "p.yaml") == \
        "fix the cause, then run icecdc sync --config p.yaml --retry-failed"


def test_the_failures_page_lists_every_error_as_the_tree_decides():
    """docs/failures.md's table is the tree's own (``errors.failure_reference``): a new class, kind or recovery
    changes the page, or this fails (regenerate the block between the markers)."""
    _import_everything()
    page = (Path(icecdc_dagster.__file__).parent.parent / "docs" / "failures.md").read_text()
    block = page.split("<!-- BEGIN failure_reference -->\n", 1)[1].split("<!-- END failure_reference -->", 1)[0]
    assert block == errors.failure_reference(), (
        "docs/failures.md is stale: replace the block between its markers with the output of "
        "python -c 'import icecdc_dagster.definitions, icecdc_dagster.errors as e; print(e.failure_reference(), end=\"\")'")
    listed = {line.split("`")[1] for line in block.splitlines()[2:]}
    assert listed == {cls.__name__ for cls in errors.error_classes()}
    assert "| `SnapshotExpiredError` | `LineDivergedError` | terminal |" in block
    assert "| `LineBusyError` | `IcecdcError` | transient |" in block and "retried with backoff" in block


def _public_calls() -> dict[str, object]:
    """Every public call of the engine, the writer, ingestion and the plugin contracts: the functions in
    ``__all__`` of the changelog, writer and ingest facades and the public methods of ``Sink`` and
    ``StreamInput`` (each kind inherits its contract's doc)."""
    import inspect

    from icecdc_dagster import changelog, ingest, writer
    from icecdc_dagster.inputs.base import StreamInput
    from icecdc_dagster.sinks.base import Sink

    calls: dict[str, object] = {f"{m.__name__}.{n}": getattr(m, n) for m in (changelog, writer, ingest)
                                for n in m.__all__ if inspect.isfunction(getattr(m, n))}
    calls.update({f"{c.__name__}.{n}": f for c in (Sink, StreamInput) for n, f in vars(c).items()
                  if inspect.isfunction(f) and not n.startswith("_")})
    return calls


def raises_section(doc: str | None) -> list[str] | None:
    """The names a Google-style ``Raises:`` section lists (``A, B: when``), None without one; a line
    of prose (``Nothing of its own ...``, ``The errors of :func:`x` ...``) names nothing."""
    lines = (doc or "").expandtabs().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Raises:"), None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip()) + 4
    names = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        head = [n.strip() for n in line.strip().split(":", 1)[0].split(",")]
        if len(line) - len(line.lstrip()) == indent and all(n.replace(".", "").isidentifier() for n in head):
            names += head
    return names


def test_every_public_call_says_what_it_raises():
    """pyiceberg's habit: each public call has a ``Raises:`` section, and every error of ours it names
    is a class of the tree (a library's error is named by its dotted path, a builtin by its name)."""
    import builtins

    _import_everything()
    tree = {cls.__name__ for cls in errors.error_classes()}
    calls = _public_calls()
    assert len(calls) > 60  # the facades and contracts were found
    missing = [name for name, fn in calls.items() if raises_section(fn.__doc__) is None]
    assert missing == []
    unknown = {f"{name}: {raised}" for name, fn in calls.items() for raised in raises_section(fn.__doc__) or []
               if "." not in raised and raised not in tree and not isinstance(getattr(builtins, raised, None), type)}
    assert unknown == set()


def test_raises_sections_are_read_as_written():
    doc = """Summary.

    Raises:
        SnapshotNotFoundError, IdentifierColumnError: when a snapshot is gone
            or a key is missing (a continuation: Not: a name).
        pyspark.errors.AnalysisException: Spark refused.
        Nothing of its own beyond these.
        The errors of :func:`other`, for the same reasons.

    Returns:
        NoSuchThing: not a raise.
    """
    assert raises_section(doc) == ["SnapshotNotFoundError", "IdentifierColumnError", "pyspark.errors.AnalysisException"]
    assert raises_section("Summary only.") is None
