"""A local Iceberg REST catalog: ``RestCatalogServer.java`` (next to this file), compiled on first use.

For trials (``icecdc rest-server``) and the tests: the JDK's HTTP server routes the REST spec's
catalog calls to Iceberg's own ``CatalogHandlers`` over a ``JdbcCatalog`` on one SQLite file. It is
compiled with the JDK's ``javac`` into ``ICECDC_CACHE_DIR`` once (a few seconds) and starts in under a
second. Nothing is downloaded: its class path is the Iceberg runtime, the relocated Jackson and HTTP
client (its endpoint constants name HTTP methods), Debian's SQLite JDBC driver and PySpark's Hadoop jars.
"""

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime import jars as jarlib
from icecdc_dagster.runtime.java import ensure_java_home
from icecdc_dagster.runtime.javac import compiled_classes, pyspark_jars

SOURCE = Path(__file__).with_name("RestCatalogServer.java")
MAIN_CLASS = "icecdc.rest.RestCatalogServer"
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
# Jars of PySpark's distribution the catalog needs: Hadoop's FileSystem (HadoopFileIO) and its logging.
_PYSPARK_JARS = ("hadoop-client-api-", "hadoop-client-runtime-", "slf4j-api-", "commons-logging-",
                 "log4j-api-", "log4j-core-", "log4j-slf4j2-impl-")
_START_TIMEOUT_S = 60.0


def server_classpath() -> list[Path]:
    picked = [jar for jar in pyspark_jars() if jar.name.startswith(_PYSPARK_JARS)]
    return [*jarlib.iceberg_jars(rest=True), jarlib.jdbc_driver_jar("sqlite"), *picked]


def compiled_server() -> Path:
    """The directory of the compiled server classes, built once per source and class path."""
    return compiled_classes(SOURCE, server_classpath(), "rest-server", "icecdc/rest/RestCatalogServer.class")


@dataclass
class RestCatalogServer:
    """A running local REST catalog; :meth:`close` stops it."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@dataclass(frozen=True)
class RestServerOptions:
    """``token``/``credential`` go to the server through its environment, never its command line."""

    db: Path
    warehouse: str
    port: int = 0
    host: str = "127.0.0.1"
    name: str = "rest"
    prefix: str | None = None
    token: str | None = field(default=None, repr=False)
    credential: str | None = field(default=None, repr=False)
    headers: dict[str, str] = field(default_factory=dict)

    def arguments(self) -> list[str]:
        args = ["--db", str(self.db), "--warehouse", self.warehouse, "--port", str(self.port),
                "--host", self.host, "--name", self.name]
        if self.prefix:
            args += ["--prefix", self.prefix]
        for name, value in self.headers.items():
            args += ["--header", f"{name}={value}"]
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in (("ICECDC_REST_TOKEN", self.token), ("ICECDC_REST_CREDENTIAL", self.credential)):
            env.pop(key, None)
            if value:
                env[key] = value
        return env


def start_rest_server(options: RestServerOptions, log: Path | None = None) -> RestCatalogServer:
    """Compile (once) and start the server; returns when it answers on its port."""
    classes = compiled_server()
    java = ensure_java_home() / "bin" / "java"
    classpath = os.pathsep.join(map(str, [classes, *server_classpath()]))
    options.db.parent.mkdir(parents=True, exist_ok=True)
    log = log or options.db.with_suffix(".server.log")
    command = [str(java), "-Xmx256m", f"-Dlog4j.configurationFile=file:{LOG4J2_CONFIG}"]
    native_dir = jarlib.sqlite_native_library_dir()
    if native_dir is not None:
        command.append(f"-Djava.library.path={native_dir}")
    command += ["-cp", classpath, MAIN_CLASS, *options.arguments()]
    with log.open("ab") as log_file:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, env=options.environment(),
                                   preexec_fn=_die_with_parent)
    return RestCatalogServer(_wait_for_url(process, log), process, log)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before ``exec``: on Linux, ask the kernel to stop the server when the process that
    started it ends, even by ``SIGKILL`` or a test worker that exits without tearing its fixtures down, so
    no catalog JVM outlives its owner. Elsewhere :meth:`RestCatalogServer.close` is the only stop."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_for_url(process: subprocess.Popen[bytes], log: Path) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            line = process.stdout.readline().decode().strip()
            if line.startswith("listening on "):
                return line.removeprefix("listening on ")
        if process.poll() is not None:
            break
    if process.poll() is None:
        process.kill()
    tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
    raise RuntimeSetupError(f"the local REST catalog server did not start (log {log}):\n{tail}")
