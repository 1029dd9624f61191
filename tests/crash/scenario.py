"""Crash-test scenario: a lake with a large table (replica sink) and a small one (OpenSearch +
replica), ``icecdc sync`` run as the operator runs it (a subprocess) and SIGKILLed in a chosen
phase, and the oracle that checks every target against the source at the synced snapshot.

Phases are observed from outside, as an operator's monitoring would: the Dagster event log of
the run in flight (which step started, which succeeded) and the sinks' own checkpoints.
"""

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.instance.ref import InstanceRef

from icecdc_dagster import run_tags
from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.run_tags import FAILED_OVER_TAG
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from tests.helpers import write_pipeline

BIG, SMALL = "db.big", "db.small"
BIG_REPLICA, SMALL_REPLICA, INDEX = "db.big_replica", "db.small_replica", "small"
COLUMNS = {BIG: "id, v, n", SMALL: "id, name, qty"}
REPLICAS = {BIG: BIG_REPLICA, SMALL: SMALL_REPLICA}
ICECDC = str(Path(sys.executable).parent / "icecdc")

PHASES = ("spark start", "export", "changelog", "opensearch bulk", "replica commit", "checkpoint write")
# How long after entering a phase a kill may land (seconds): a seeded uniform draw in [0, this].
PHASE_SPREAD_S = {"changelog": 1.5, "opensearch bulk": 1.5, "replica commit": 2.0,
                  "checkpoint write": 0.0}
SPARK_START_WINDOW_S = (2.0, 9.0)   # after launch: imports, definitions, JVM and SparkSession start


@dataclass
class Lake:
    spark: object
    catalog: object          # pyiceberg catalog
    settings: object         # CatalogSettings
    root: Path
    opensearch_url: str
    big_rows: int
    small_rows: int
    small_snapshots_per_run: int = 10   # 1: one run per snapshot (more batches, more moments to kill)
    bootstrap: dict[str, str] = field(default_factory=dict)   # table -> bootstrap snapshot id (the export)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def config(self) -> Path:
        return self.root / "pipeline.yaml"

    def create(self) -> None:
        cat = self.name
        self.spark.sql(f"CREATE TABLE {cat}.{BIG} (id BIGINT NOT NULL, v STRING, n INT) USING iceberg "
                       f"TBLPROPERTIES ('format-version'='2')")
        self.spark.sql(f"INSERT INTO {cat}.{BIG} SELECT id, concat('v', id), CAST(id % 1000 AS INT) "
                       f"FROM range(0, {self.big_rows})")
        self.spark.sql(f"CREATE TABLE {cat}.{SMALL} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg "
                       f"TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')")
        self.spark.sql(f"INSERT INTO {cat}.{SMALL} SELECT id, concat('n', id), CAST(id AS INT) "
                       f"FROM range(0, {self.small_rows})")
        for table in (BIG, SMALL):
            self.bootstrap[table] = str(self.catalog.load_table(table).current_snapshot().snapshot_id)
        write_pipeline(self.config, self.settings, [
            {"table_name": BIG, "identifier_columns": ["id"], "max_retries": 3,
             "sinks": [{"iceberg": {"table_name": BIG_REPLICA}}]},
            {"table_name": SMALL, "identifier_columns": ["id"], "max_snapshots_per_run": self.small_snapshots_per_run,
             "max_retries": 3, "sinks": [{"opensearch": {"hosts": [self.opensearch_url], "index": INDEX}},
                       {"iceberg": {"table_name": SMALL_REPLICA}}]}])
        self.home.mkdir(parents=True, exist_ok=True)

    def commit_round(self, round_no: int) -> None:
        """Several pending snapshots per table: CoW update, delete (MoR on the small table), insert."""
        cat, r = self.name, round_no
        self.spark.sql(f"UPDATE {cat}.{BIG} SET v = concat('r{r}-', id), n = n + {r} WHERE id % 97 = {r % 97}")
        self.spark.sql(f"DELETE FROM {cat}.{BIG} WHERE id % 101 = {(r * 7) % 101}")
        start = self.big_rows + r * 1000
        self.spark.sql(f"INSERT INTO {cat}.{BIG} SELECT id, concat('new', id), {r} FROM range({start}, {start + 200})")
        self.spark.sql(f"UPDATE {cat}.{SMALL} SET qty = qty + {r}, name = concat(name, '/{r}') "
                       f"WHERE id % 7 = {r % 7}")
        self.spark.sql(f"DELETE FROM {cat}.{SMALL} WHERE id % 11 = {(r * 3) % 11}")
        start = self.small_rows + r * 100
        self.spark.sql(f"INSERT INTO {cat}.{SMALL} SELECT id, concat('m', id), {r} FROM range({start}, {start + 20})")

    def assert_counts_agreed(self, instance: DagsterInstance) -> None:
        """Every batch a sink applied, the killed ones' redos included, did what its events say: no
        evaluation of a ``sink_counts_agree`` check failed (a redo MERGEs into the snapshot the killed
        attempt merged into, or finds the batch published and skips it), and the replicas' ran."""
        from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

        from icecdc_dagster.assets import naming
        from icecdc_dagster.config import load_config

        for table in load_config(self.config).tables:
            for sink in table.sinks:
                key = naming.counts_check_key(sink)
                records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1000)
                failed = [r.run_id for r in records if r.status == AssetCheckExecutionRecordStatus.FAILED]
                assert failed == [], f"{key.to_user_string()} failed in runs {failed}"
                if sink.maintained_table() is not None:
                    assert any(r.status == AssetCheckExecutionRecordStatus.SUCCEEDED for r in records), key

    def observer(self) -> DagsterInstance:
        """The instance, opened by the test like a monitoring tool would (before any sync creates it)."""
        return DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))

    def sync(self, *args: str, log: Path | None = None) -> subprocess.Popen:
        out = open(log or self.root / "sync.log", "a")  # noqa: SIM115 - closed with the process by the OS
        return subprocess.Popen([ICECDC, "sync", "--config", str(self.config), "--dagster-home", str(self.home),
                                 *args], stdout=out, stderr=subprocess.STDOUT, cwd=self.root,
                                env={**os.environ, "DAGSTER_HOME": str(self.home)})

    def sync_to_end(self, *args: str) -> tuple[int, str]:
        log = self.root / f"sync-{time.time_ns()}.log"
        process = self.sync(*args, log=log)
        code = process.wait(timeout=1800)
        return code, log.read_text()

    # -- the oracle ---------------------------------------------------------------------------

    def replica_checkpoint(self, table: str) -> str | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            replica = self.catalog.load_table(REPLICAS[table])
        except NoSuchTableError:   # the export creates it
            return None
        snapshot = replica.current_snapshot()
        return snapshot.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY) if snapshot else None

    def index_checkpoint(self) -> str | None:
        from icecdc_dagster.sinks.opensearch.checkpoint import index_mappings

        mappings = index_mappings(self.opensearch(), INDEX) or {}
        entries = ((mappings.get("_meta") or {}).get("icecdc") or {}).get("checkpoints") or {}
        return next((str(e["snapshot_id"]) for e in entries.values()), None)

    def opensearch(self):  # noqa: ANN201
        from opensearchpy import OpenSearch

        return OpenSearch(hosts=[self.opensearch_url], timeout=60)

    def assert_synced(self) -> None:
        """Every target equals its source at the synced snapshot (the current one: the sync drained
        the lines), without a duplicate key, and no batch was committed twice to a replica."""
        cat = self.name
        for table, replica in REPLICAS.items():
            current = str(self.catalog.load_table(table).current_snapshot().snapshot_id)
            assert self.replica_checkpoint(table) == current, f"{replica} is not at {table}'s current snapshot"
            cols = COLUMNS[table]
            source = self.spark.sql(f"SELECT {cols} FROM {cat}.{table} VERSION AS OF {current}")
            target = self.spark.sql(f"SELECT {cols} FROM {cat}.{replica}")
            assert source.exceptAll(target).count() == 0 and target.exceptAll(source).count() == 0, \
                f"{replica} differs from {table} at {current}"
            assert target.groupBy("id").count().where("count > 1").count() == 0, f"duplicate keys in {replica}"
            applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
                       for s in self.catalog.load_table(replica).snapshots()]
            applied = [a for a in applied if a]
            assert len(applied) == len(set(applied)), f"a batch was committed twice to {replica}: {applied}"
        current = str(self.catalog.load_table(SMALL).current_snapshot().snapshot_id)
        assert self.index_checkpoint() == current, "the index is not at the source's current snapshot"
        from opensearchpy import helpers

        docs = list(helpers.scan(self.opensearch(), index=INDEX, query={"query": {"match_all": {}}}))
        ids = [d["_id"] for d in docs]
        assert len(ids) == len(set(ids))
        documents = sorted((d["_source"]["id"], d["_source"]["name"], d["_source"]["qty"]) for d in docs)
        rows = sorted(tuple(r) for r in self.spark.sql(
            f"SELECT id, name, qty FROM {cat}.{SMALL} VERSION AS OF {current}").collect())
        assert documents == rows, "the index differs from the source at the synced snapshot"

    def assert_no_lock_left(self) -> None:
        for line in (BIG, SMALL):
            assert not LineLock(self.home, line).is_busy(), f"the line lock of {line} is still held"


# -- killing at a phase ------------------------------------------------------------------------

@dataclass(frozen=True)
class KillPoint:
    target: str      # one of PHASES
    delay_s: float   # after the target phase is seen


@dataclass
class KillResult:
    point: KillPoint
    observed: str            # the phase seen just before the kill ("finished" if the sync ended first)
    run_id: str | None       # the run in flight at the kill, if any
    killed: bool
    seen: tuple[str, ...] = ()   # the phases observed while waiting for the target, in order


def schedule(seed: int, count: int, export_window_s: tuple[float, float] = (0.0, 4.0)) -> list[KillPoint]:
    """The export first (it only happens once), then every other phase once in a seeded order,
    then seeded picks; each with a seeded delay inside its phase. ``export_window_s``: when, after
    the export's first step runs with Spark started, its kill may land."""
    rng = random.Random(seed)
    others = [p for p in PHASES if p != "export"]
    targets = ["export", *rng.sample(others, len(others))]
    targets += rng.choices(others, k=max(0, count - len(targets)))
    points = []
    for target in targets[:count]:
        if target == "spark start":
            points.append(KillPoint(target, rng.uniform(*SPARK_START_WINDOW_S)))
        elif target == "export":
            points.append(KillPoint(target, rng.uniform(*export_window_s)))
        else:
            points.append(KillPoint(target, rng.uniform(0, PHASE_SPREAD_S[target])))
    return points


def _step_phase(step_key: str, run, lake: Lake) -> str:  # noqa: ANN001
    if step_key.startswith("changelog"):
        first = run.tags.get(run_tags.FIRST_SNAPSHOT_TAG)
        return "export" if first in lake.bootstrap.values() else "changelog"
    return "opensearch bulk" if step_key.startswith("opensearch") else "replica commit"


JVM_WARMUP_S = 8.0   # a driver JVM younger than this is still starting the SparkSession (~5-8 s here)


def jvm_age_s(pid: int) -> float | None:
    """Age of the Spark driver JVM started by process ``pid`` (None: not started yet)."""
    from icecdc_dagster.lease.holder import _process_started_at, process_state

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and comm == "java":
            state = process_state(int(stat.parent.name))
            started = _process_started_at(state.start_ticks) if state else None
            return None if started is None else time.time() - started
    return None


def observe(instance: DagsterInstance, lake: Lake, known_runs: set[str], sync_pid: int | None = None
            ) -> tuple[str, object]:
    """The phase of the sync in flight, from the run's event log, the sinks' checkpoints and (for
    Spark start) the age of the sync's driver JVM."""
    runs = [r for r in instance.get_runs(limit=5) if r.run_id not in known_runs]
    if sync_pid is not None:
        age = jvm_age_s(sync_pid)
        if age is None or age < JVM_WARMUP_S:
            return "spark start", (runs[0] if runs else None)
    if not runs:
        return "spark start", None
    run = runs[0]
    if run.is_finished:
        return "between batches", run
    events = instance.all_logs(run.run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS})
    started = [e.step_key for e in events if e.dagster_event_type == DagsterEventType.STEP_START]
    done = {e.step_key for e in events if e.dagster_event_type == DagsterEventType.STEP_SUCCESS}
    active = [k for k in started if k not in done]
    if not active:
        return "run bookkeeping", run
    step = active[-1]
    phase = _step_phase(step, run, lake)
    if phase in ("opensearch bulk", "replica commit"):
        table = run.tags.get(run_tags.TABLE_TAG)
        last = run.tags.get(run_tags.LAST_SNAPSHOT_TAG)
        checkpoint = lake.index_checkpoint() if phase == "opensearch bulk" else lake.replica_checkpoint(table)
        if checkpoint == last:
            return "checkpoint write", run   # the sink committed its checkpoint; Dagster has not recorded it
    return phase, run


# Kill targets inside a catch-up range of the two-sink table (a run over several snapshots of SMALL, the
# export's range included): in a sink step before either sink has the range, or with the sinks apart (one
# has committed the range's last snapshot, the other not yet: what the next run must reconcile).
CATCH_UP_PHASES = ("catch-up sink step", "catch-up sinks apart")
CATCH_UP_SPREAD_S = {"catch-up sink step": 1.0, "catch-up sinks apart": 0.3}


def catch_up_phase(phase: str, run, lake: Lake) -> str:  # noqa: ANN001
    """``phase`` refined for a sink step of a range run of SMALL: where its two sinks stand."""
    if phase not in ("opensearch bulk", "replica commit", "checkpoint write") or run is None:
        return phase
    first, last = run.tags.get(run_tags.FIRST_SNAPSHOT_TAG), run.tags.get(run_tags.LAST_SNAPSHOT_TAG)
    if run.tags.get(run_tags.TABLE_TAG) != SMALL or first == last:
        return phase
    have = [lake.index_checkpoint() == last, lake.replica_checkpoint(SMALL) == last]
    return "catch-up sinks apart" if sum(have) == 1 else "catch-up sink step" if not any(have) else phase


def sinks_apart(lake: Lake) -> bool:
    return lake.index_checkpoint() != lake.replica_checkpoint(SMALL)


def _matches(target: str, phase: str) -> bool:
    if target == "replica commit":
        return phase in ("replica commit", "checkpoint write")
    return phase == target


def _export_phase(phase: str, run, lake: Lake) -> str:  # noqa: ANN001
    """``phase`` as the export target sees it: any step of the export's run (its changelog, which starts the
    sync's SparkSession, and its sinks' steps) is inside the export. Gated on the JVM's age as other targets
    are, a quiet machine's export ran from start to end before the gate opened (CI, 2026-11-28)."""
    if run is None or run.is_finished or phase not in ("opensearch bulk", "replica commit", "checkpoint write"):
        return phase
    return "export" if run.tags.get(run_tags.FIRST_SNAPSHOT_TAG) in lake.bootstrap.values() else phase


def _phase(instance: DagsterInstance, lake: Lake, known_runs: set[str], pid: int, target: str) -> tuple[str, object]:
    """The phase for ``target``. A catch-up target goes by the run's steps alone, not by the age of the sync's
    JVM: a sync may start a session per line, and a small catch-up run can end within the JVM's warm-up."""
    if target == "export":  # the export's run from its first step: a kill always finds it in flight
        phase, run = observe(instance, lake, known_runs)
        return _export_phase(phase, run, lake), run
    if target not in CATCH_UP_PHASES:
        return observe(instance, lake, known_runs, pid)
    phase, run = observe(instance, lake, known_runs)
    return catch_up_phase(phase, run, lake), run


def kill_at(process: subprocess.Popen, instance: DagsterInstance, lake: Lake, point: KillPoint,
            known_runs: set[str], poll_s: float = 0.02) -> KillResult:
    """Wait for the target phase, then the seeded delay, then SIGKILL; report what was seen."""
    launched = time.monotonic()
    seen: list[str] = []
    if point.target == "spark start":
        while process.poll() is None and time.monotonic() - launched < point.delay_s:
            time.sleep(poll_s)
    else:
        # A sync starts its JVM inside its first step: a phase counts once Spark is up.
        while process.poll() is None:
            phase = _phase(instance, lake, known_runs, process.pid, point.target)[0]
            if not seen or seen[-1] != phase:
                seen.append(phase)
            if _matches(point.target, phase):
                break
            time.sleep(poll_s)
        deadline = time.monotonic() + point.delay_s
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(poll_s)
    if process.poll() is not None:
        return KillResult(point, "finished", None, killed=False, seen=tuple(seen))
    observed, run = _phase(instance, lake, known_runs, process.pid, point.target)
    process.send_signal(signal.SIGKILL)
    process.wait()
    in_flight = run.run_id if run is not None and not run.is_finished else None
    return KillResult(point, observed, in_flight, killed=True, seen=tuple(seen))


def assert_killed_run_failed_over(instance: DagsterInstance, result: KillResult) -> None:
    """The run the kill left in flight is FAILURE, failed over with the dead worker's reason."""
    if result.run_id is None:
        return
    run = instance.get_run_by_id(result.run_id)
    if run.status == DagsterRunStatus.SUCCESS:   # it finished in the instant before the kill
        return
    assert run.status == DagsterRunStatus.FAILURE, f"killed run {run.run_id} is {run.status}"
    assert run.tags.get(FAILED_OVER_TAG, "").startswith("worker died"), run.tags
    (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
    assert "died before the run ended" in failure.message


def assert_nothing_in_flight(instance: DagsterInstance) -> None:
    from icecdc_dagster.lease.failover import IN_FLIGHT

    stuck = [r.run_id for r in instance.get_runs() if r.status in IN_FLIGHT]
    assert stuck == [], f"runs left in flight: {stuck}"
