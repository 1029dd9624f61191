"""Shared fixtures: one SparkSession per test session, a fresh catalog per test (SQLite, or a catalog
of the session's Iceberg REST server over HTTP), an OpenSearch-compatible server over HTTP
(osmem-server, clone per test)."""

import getpass
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.rest_server import RestServerOptions, start_rest_server
from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session
from tests import class_archive, helpers
from tests.helpers import TEST_SPARK_CONF

# Property tests: the default run draws the same examples every time (a red CI run is reproducible);
# ICECDC_HYPOTHESIS_PROFILE=explore draws new ones on each run and prints how to replay a failure.
# Tests that set ``derandomize`` themselves (the ``-m slow`` deep variants) always explore.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("ICECDC_HYPOTHESIS_PROFILE", "ci"))

POSTGRES_URI = os.environ.get("ICECDC_TEST_POSTGRES_URI", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")

# The in-process session runs Spark's interpreted expressions instead of generating and compiling Java for
# each plan (what Spark's own suites run too; results are the same by Spark's contract). A test session plans
# thousands of small, distinct queries, and Janino's compile (its class lookups scan every jar on the class
# path) was a quarter of the JVM's CPU: 27% less JVM CPU without it. The syncs that tests start as subprocesses
# (``write_pipeline``) keep Spark's defaults, so whole-stage codegen stays covered end to end.
# Adaptive execution is off here for the same reason: it plans each query again after every stage and runs
# each shuffle's map side as a job of its own (twice the jobs); a local session is built without it by the
# product too (runtime/spark.py). Measured on
# tests/writer/test_commit.py + tests/changelog/test_oracle.py, one worker: 252 -> 230 JVM CPU-s without
# it, 191 with two partitions as well (TEST_SPARK_CONF); 271 -> 204 s.
SESSION_SPARK_CONF = {
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "3g",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    **TEST_SPARK_CONF,
}


@pytest.fixture(scope="session")
def spark_settings() -> SparkSettings:
    return SparkSettings(master="local[2]", app_name="icecdc-tests", conf=SESSION_SPARK_CONF,
                         jdbc_drivers=("sqlite", "postgresql"))


def _cache_dir() -> Path:
    """Beside pytest's run folders (``/tmp/pytest-of-<user>``), kept across runs and shared by pytest-xdist's
    workers: jars, the REST server and the class archive are built once per machine, atomically."""
    return Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}" / "icecdc-cache"


@pytest.fixture(scope="session")
def spark(spark_settings):
    session = build_spark_session(spark_settings)
    yield session
    session.stop()


def _catalog_name() -> str:
    return "cat_" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def rest_catalog_server(tmp_path_factory):
    """The session's Iceberg REST catalog server (our router over Iceberg's CatalogHandlers and a
    JdbcCatalog on SQLite, compiled into the cache on first use): each test takes its own catalog
    at ``<url>/<catalog>``."""
    root = tmp_path_factory.mktemp("rest-catalog")
    server = start_rest_server(RestServerOptions(db=root / "catalog.db", warehouse=f"file://{root}/warehouse"))
    yield server
    server.close()


def rest_catalog_settings(server, name: str | None = None) -> CatalogSettings:
    """A fresh catalog of ``server``: nothing REST-specific but the type and the URL."""
    name = name or _catalog_name()
    return CatalogSettings(name=name, uri=f"{server.url}/{name}", warehouse=None, type="rest")


@pytest.fixture
def catalog_settings(request, tmp_path: Path) -> CatalogSettings:
    """A fresh SQLite catalog + local warehouse in this test's tmp dir; a test that also runs over REST
    says ``@pytest.mark.parametrize("catalog_settings", ["sql", "rest"], indirect=True)``."""
    if getattr(request, "param", "sql") == "rest":
        return rest_catalog_settings(request.getfixturevalue("rest_catalog_server"))
    return CatalogSettings(name=_catalog_name(), uri=f"sqlite:///{tmp_path}/catalog.db",
                           warehouse=f"file://{tmp_path}/warehouse")


@pytest.fixture
def catalog(spark, catalog_settings):
    """The pyiceberg catalog of ``catalog_settings``, also attached to the Spark session."""
    pyiceberg_catalog = catalog_settings.load_pyiceberg()
    attach_catalog(spark, catalog_settings)
    pyiceberg_catalog.create_namespace("db")
    return pyiceberg_catalog


def postgres_available() -> bool:
    try:
        import sqlalchemy

        with sqlalchemy.create_engine(POSTGRES_URI).connect():
            return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture
def postgres_catalog_settings(tmp_path: Path) -> CatalogSettings:
    if not postgres_available():
        pytest.fail(f"PostgreSQL is not reachable at {POSTGRES_URI} (set ICECDC_TEST_POSTGRES_URI)")
    return CatalogSettings(name=_catalog_name(), uri=POSTGRES_URI, warehouse=f"file://{tmp_path}/warehouse")


@pytest.fixture
def opensearch_url(osmem_clone) -> str:
    """An empty OpenSearch-compatible cluster over HTTP, private to this test."""
    return osmem_clone.url


@pytest.fixture(scope="session")
def postgres_databases():
    """A database per use on the PostgreSQL server at 127.0.0.1:5432, named after this test session and
    dropped at its end (``postgres`` tests)."""
    from tests.helpers import PostgresDatabases

    databases = PostgresDatabases()
    yield databases
    databases.drop_all()


@pytest.fixture
def postgres_url(postgres_databases):
    return postgres_databases.create()


@pytest.fixture(autouse=True)
def no_stale_defs_state_storage():
    """Dagster keeps the entered instance's state storage in a process-wide ContextVar; a test that
    entered an instance and disposed it leaves a storage whose instance is gone, and the next test's
    first definitions load fails with "Attempted to resolve undefined DagsterInstance weakref". Each
    test starts without one, as a fresh process does (Dagster private API: tests only)."""
    from dagster._core.storage.defs_state.base import _current_storage

    _current_storage.set(None)
    yield


def pytest_configure(config):  # noqa: ANN001
    """Before any worker starts (they inherit the environment): the tests' class archive, made once per
    machine in the cache."""
    cache = Path(os.environ.setdefault("ICECDC_CACHE_DIR", str(_cache_dir())))
    if hasattr(config, "workerinput"):
        return
    _use_memory_tempdir()
    _use_class_archive(cache)


def _use_memory_tempdir() -> None:
    """Temporary files in memory (``/dev/shm``) when the machine has it: every catalog, warehouse,
    Dagster instance and ``DAGSTER_HOME`` a test makes lives in a temporary folder, and SQLite syncs each
    commit to disk (~1 ms of waiting and 0.25 ms of CPU each on this machine: Dagster writes an event per
    step and state change, the catalogs a row per commit). The cache of jars and the class archive stays
    where it was (``_cache_dir``, chosen before this). ``ICECDC_TEST_TMPDIR`` names another folder; empty:
    the system's temporary folder. Set before the workers start: they, and every process a test starts,
    inherit ``TMPDIR``."""
    chosen = os.environ.get("ICECDC_TEST_TMPDIR", "/dev/shm")
    if not chosen or not os.path.isdir(chosen) or not os.access(chosen, os.W_OK):
        return
    folder = Path(chosen) / f"icecdc-tests-{getpass.getuser()}"
    folder.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None   # gettempdir() reads TMPDIR again


def _use_class_archive(cache: Path) -> None:
    """The class archive for the tests' JVMs (tests/class_archive.py); its options reach the workers through
    ``ICECDC_TEST_JAVA_OPTIONS``. A run that sets ``ICECDC_TEST_JAVA_OPTIONS`` itself, or
    ``ICECDC_TEST_CLASS_ARCHIVE=0``, goes without."""
    if "ICECDC_TEST_JAVA_OPTIONS" in os.environ or os.environ.get("ICECDC_TEST_CLASS_ARCHIVE") == "0":
        return
    archive = class_archive.ensure_archive(cache, helpers.BASE_JAVA_OPTIONS, {})
    if archive is None:
        return
    options = f"{helpers.BASE_JAVA_OPTIONS} {class_archive.archive_options(archive)}"
    os.environ["ICECDC_TEST_JAVA_OPTIONS"] = options
    for conf in (helpers.TEST_SPARK_CONF, SESSION_SPARK_CONF):   # this process too (-n 0)
        if conf.get("spark.driver.extraJavaOptions") == helpers.BASE_JAVA_OPTIONS:
            conf["spark.driver.extraJavaOptions"] = options


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ARG001
    """Tests marked ``long`` run first. pytest-xdist's worksteal hands each worker a contiguous half of this
    order and lets an idle worker take from the end of the other's: long tests at the front finish while
    short ones still fill both workers, instead of one worker ending the run alone on a long test."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
