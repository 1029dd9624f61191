"""Build a SparkSession with Iceberg, its SQL extensions and our catalog.

The session is process-wide (Spark allows one); catalogs are runtime SQL
settings, so more than one catalog can be attached to the same session.
Works unchanged with ``master`` pointing at a cluster; there, set ``jars`` to
the cluster's own complete Iceberg jars.
"""

import os
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from icecdc_dagster.runtime import jars as jarlib
from icecdc_dagster.runtime import local_fs
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.java import ensure_java_home, jvm, remember_class_lookups

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
# A local driver JVM that plans and runs many small batches: C2 (HotSpot's optimising compiler) only for code
# that is hot by a hundred times the default counts. Each batch's plans carry their own literals (snapshot
# ids, key bounds), so Spark generates new classes per batch, and Spark's planning code runs thousands of
# times per batch: at the default thresholds C2 compiles and recompiles them for the first ~100 batches.
# bench/batch_profile.py, 12 batches of warm-up: JVM 1.63-2.00 -> 1.08-1.27 CPU-s per batch; bench/ingest.py,
# 200k events: ours 4.2-6.2 -> 3.7-3.8 CPU-s (the row loops of bulk reads still reach C2). A user's own JIT
# flags come after these and win (docs/performance.md, "The JIT").
LOCAL_JIT_OPTIONS = ("-XX:Tier4InvocationThreshold=500000", "-XX:Tier4MinInvocationThreshold=100000",
                     "-XX:Tier4CompileThreshold=750000", "-XX:Tier4BackEdgeThreshold=5000000")


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    app_name: str = "icecdc_dagster"
    conf: dict[str, str] = field(default_factory=dict)
    # When set, used instead of the bundled Iceberg jars (e.g. a cluster's own).
    jars: tuple[str, ...] = ()
    # JDBC drivers to load: inferred from the catalog when empty.
    jdbc_drivers: tuple[str, ...] = ()
    # Load the REST client's jars even when no catalog given at start is a REST one: the session is the
    # process's, its jars are fixed when it starts, and a step attaches a pipeline's other catalogs later.
    rest_catalog: bool = False


def local_cores(master: str) -> int | None:
    """Task slots of a local master (``local``, ``local[4]``, ``local[*]``, ``local[4,2]``,
    ``local-cluster[2,1,1024]``); None for a cluster's master.

    A local session's shuffles get one partition per slot. A change batch is small next to the
    table: with more partitions than cores every shuffle only adds tasks (and, with adaptive
    execution, jobs) that pay Spark's per-task cost for a few rows each. Measured on
    ``bench/changelog.py``'s 1 % update of 1M rows, local[2], best of 5: 8 partitions 1.49 CPU-s,
    2 partitions 1.22 CPU-s for the same change rows (docs/performance.md).
    """
    master = master.strip()
    if master == "local":
        return 1
    if match := re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master):
        return (os.cpu_count() or 1) if match.group(1) == "*" else max(1, int(match.group(1)))
    if match := re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master):
        return max(1, int(match.group(1)) * int(match.group(2)))
    return None


def spark_builder_conf(settings: SparkSettings, catalogs: list[CatalogSettings]) -> dict[str, str]:
    rest = settings.rest_catalog or any(c.type == "rest" for c in catalogs)
    jar_paths = [str(p) for p in settings.jars] or [str(p) for p in jarlib.iceberg_jars(rest=rest)]
    drivers = set(settings.jdbc_drivers) | {c.backend for c in catalogs if c.backend} or {"sqlite"}
    jar_paths += [str(jarlib.jdbc_driver_jar(kind)) for kind in sorted(drivers)]
    java_options = [f"-Dlog4j.configurationFile=file:{LOG4J2_CONFIG}"]
    cores = local_cores(settings.master)
    if cores is not None:
        java_options += LOCAL_JIT_OPTIONS
    native_dir = jarlib.sqlite_native_library_dir()
    if native_dir is not None:
        java_options.append(f"-Djava.library.path={native_dir}")
    conf = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.jars": ",".join(jar_paths),
        "spark.sql.extensions": EXTENSIONS,
        "spark.driver.extraJavaOptions": " ".join(java_options),
        "spark.executor.extraJavaOptions": " ".join(java_options),
        # `.count()` on Iceberg's changes table breaks with aggregate push-down.
        "spark.sql.iceberg.aggregate-push-down.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        # Runs of several tables may share one session (the warm launcher's lanes): each run's jobs go
        # to their own pool, and FAIR shares the executors between pools (FIFO within a run).
        "spark.scheduler.mode": "FAIR",
        # Spark's default redaction plus "credential": a REST catalog's OAuth2 client secret is a
        # catalog setting (spark.sql.catalog.<name>.credential), shown in the UI's environment page.
        "spark.redaction.regex": "(?i)secret|password|token|access[.]?key|credential",
        # Python tasks (mapInArrow: carry-over groups, landing-file lines) without ~0.14 CPU-s of per-task
        # set-up each, and workers that start with pyiceberg imported (runtime/worker_daemon.py).
        "spark.python.daemon.module": "icecdc_dagster.runtime.worker_daemon",
    }
    if cores is not None:
        # Executors in this JVM: file: paths may use a class on the driver's class path (runtime/local_fs.py)
        conf.update(local_fs.spark_conf())
        conf["spark.sql.shuffle.partitions"] = str(cores)
        # With one shuffle partition per core there is nothing for adaptive execution to coalesce, and it
        # submits every shuffle stage as a job of its own: a small batch ran 13 Spark jobs with it, 8
        # without (bench/batch_profile.py --jobs, docs/performance.md). A cluster keeps Spark's default.
        conf["spark.sql.adaptive.enabled"] = "false"
        conf["spark.ui.showConsoleProgress"] = "false"
    for catalog in catalogs:
        conf.update(catalog.spark_conf())
    class_path = conf.get("spark.driver.extraClassPath", "")
    conf.update(settings.conf)
    # What the user adds to these comes after ours, never instead of them: jars (object storage:
    # iceberg-aws-bundle, iceberg-gcp-bundle, iceberg-azure-bundle) after the Iceberg runtime and its
    # relocated jars; JVM options (GC, JIT, heap dumps) after our logging and native-library paths.
    for key, separator, ours in (("spark.jars", ",", ",".join(jar_paths)),
                                 ("spark.driver.extraClassPath", os.pathsep, class_path),
                                 ("spark.driver.extraJavaOptions", " ", " ".join(java_options)),
                                 ("spark.executor.extraJavaOptions", " ", " ".join(java_options))):
        if settings.conf.get(key) and ours:
            conf[key] = f"{ours}{separator}{settings.conf[key]}"
    return conf


# Lanes of the warm launcher start runs at the same moment: one of them must not use the session
# between its creation by another lane and the attachment of the catalog (seen as "spark_catalog
# requires a single-part namespace" in bench/freshness.py), so building is one critical section.
_BUILDING = threading.Lock()
# (JVM session identity, catalog conf) already attached: a step asks for the session many times a
# run, and re-reading the catalog database and re-setting its conf each time is pure latency.
_ATTACHED: set[tuple[str, int, tuple[tuple[str, str], ...]]] = set()


def build_spark_session(settings: SparkSettings, catalogs: Sequence[CatalogSettings] = ()) -> "SparkSession":
    """Return the process's SparkSession, started with Iceberg and attached to ``catalogs``."""
    with _BUILDING:
        return _build_spark_session(settings, catalogs)


def _build_spark_session(settings: SparkSettings, catalogs: Sequence[CatalogSettings]) -> "SparkSession":
    from pyspark.sql import SparkSession  # pyspark.sql: ~1.6 s; only a session start pays it

    ensure_java_home()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (foreachPartition/mapPartitions, UDFs) must run this interpreter, which has
    # our dependencies; otherwise PySpark starts whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is None:
        for catalog in catalogs:
            catalog.load_pyiceberg()  # creates catalog tables before Spark looks (SQLite lock)
        conf = spark_builder_conf(settings, list(catalogs))
        launch_gateway(conf)
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        active = builder.getOrCreate()
        active.sparkContext.setLogLevel("WARN")
    remember_class_lookups(active)
    identity = (active.sparkContext.applicationId,
                int(jvm(active).System.identityHashCode(active._jsparkSession)))  # noqa: SLF001
    for catalog in catalogs:
        attached = (*identity, tuple(sorted(catalog.spark_conf().items())))
        if attached not in _ATTACHED:
            catalog.load_pyiceberg()
            attach_catalog(active, catalog)
            _ATTACHED.add(attached)
    return active


def launch_gateway(conf: dict[str, str]) -> None:
    """Start py4j's gateway JVM (with ``conf``, as ``getOrCreate`` would) in a thread of its own, once.

    Why: an interrupt raised in the calling thread (a sync's stop request cancels its run thread that
    way, see ``lease.run_thread``) must not cut PySpark's launch in half. Cut while it waits for the
    JVM's port file, PySpark deletes the directory the JVM is about to write into: the JVM's main thread
    dies before it watches its stdin, and py4j's non-daemon ``GatewayServer`` thread keeps it alive as an
    orphan (parent pid 1) for ever. A launch that completes leaves a JVM that exits when this process
    does (it reads its stdin until EOF); the calling thread's interrupt lands once the launch is over.

    Raises:
        Exception: PySpark's own error when the JVM cannot start (``JAVA_GATEWAY_EXITED``).
    """
    from pyspark import SparkConf, SparkContext  # pyspark: ~1.3 s, only a session start pays it

    if SparkContext._gateway is not None:  # noqa: SLF001 - launched already (or a session exists)
        return
    spark_conf = SparkConf()
    for key, value in conf.items():
        spark_conf.set(key, value)
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            SparkContext._ensure_initialized(conf=spark_conf)  # noqa: SLF001 - the launch getOrCreate does
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)

    launcher = threading.Thread(target=launch, name="icecdc-spark-gateway", daemon=True)
    launcher.start()
    launcher.join()
    if errors:
        raise errors[0]


def attach_catalog(spark: "SparkSession", catalog: CatalogSettings) -> None:
    """Register ``catalog`` in a running session (catalogs are runtime settings)."""
    for key, value in catalog.spark_conf().items():
        spark.conf.set(key, value)
