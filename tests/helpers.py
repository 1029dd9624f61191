"""Small helpers shared by tests: write a pipeline file for a test catalog."""

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from icecdc_dagster.runtime.catalog import CatalogSettings

BOTH_CATALOGS = pytest.mark.parametrize("catalog_settings", ["sql", "rest"], indirect=True)
"""Run a test over a SQL catalog and over the session's REST catalog server (see ``catalog_settings``)."""


def catalog_block(catalog: CatalogSettings) -> dict:
    """The pipeline file's ``catalog:`` for ``catalog``: a REST one is its type and URL, nothing else."""
    if catalog.type == "rest":
        return {"type": "rest", "name": catalog.name, "uri": catalog.uri}
    return {"name": catalog.name, "uri": catalog.uri, "warehouse": catalog.warehouse}


# The tests' JVMs are short-lived and share two cores: the C1 compiler alone (no C2: a cold JVM spends its
# first seconds compiling, and C2's code rarely pays back within a test) and the serial collector (no GC
# threads competing with the other pytest worker) take ~13% off a test's wall time here. Test-only tuning:
# a long-running sync keeps the JVM's defaults. ``ICECDC_TEST_JAVA_OPTIONS`` replaces them (" ": the JVM's
# defaults), to measure the suite both ways; the run's conftest adds the class archive (tests/class_archive.py).
BASE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TEST_JAVA_OPTIONS = os.environ.get("ICECDC_TEST_JAVA_OPTIONS", BASE_JAVA_OPTIONS)


# Spark settings of every test session, in process and in the pipelines a test writes; ``ICECDC_TEST_SPARK_CONF``
# (JSON) adds to or replaces them, to measure the suite both ways. Two shuffle partitions, one per core of
# ``local[2]``: still more than one (each partition's own writer, bins and summaries stay covered), and
# half the tasks of four to plan, serialise and schedule for a few dozen rows (16% less JVM CPU, tests/conftest.py).
TEST_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
    **json.loads(os.environ.get("ICECDC_TEST_SPARK_CONF", "{}")),
}


def write_pipeline(path: Path, catalog: CatalogSettings, tables: list[dict], **extra) -> Path:
    config = {
        "catalog": catalog_block(catalog),
        "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
        "tables": tables,
        **extra,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class TcpProxy:
    """A real TCP forwarder in front of a server, to cut and restore the network in tests."""

    def __init__(self, target_host: str, target_port: int):
        import socket
        import threading

        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.up = True
        self._open: list = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink) -> None:  # noqa: ANN001
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        self.up = False
        with self._lock:
            for s in self._open:
                try:
                    s.close()
                except OSError:
                    pass
            self._open.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


class PostgresDatabases:
    """Databases on the project's PostgreSQL server (127.0.0.1:5432, trust auth), named after one test
    session (a unique token), each created on demand and all dropped when the session ends."""

    SERVER = "postgresql://postgres@127.0.0.1:5432"

    def __init__(self) -> None:
        import uuid

        self.token = f"icecdc_test_{uuid.uuid4().hex[:10]}"
        self.created: list[str] = []

    def _admin(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(f"{self.SERVER}/postgres")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def create(self) -> str:
        name = f"{self.token}_{len(self.created)}"
        self._admin(f"CREATE DATABASE {name}")
        self.created.append(name)
        return f"{self.SERVER}/{name}".replace("postgresql://", "postgresql+psycopg2://")  # SQLAlchemy 2.1: psycopg 3

    def drop_all(self) -> None:
        for name in self.created:
            self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


FAULT_HOOKS = Path(__file__).parent / "fault_hooks"


def fault_env(fault: str, table: str = "") -> dict[str, str]:
    """The environment of a subprocess that kills itself at ``fault`` (tests/fault_hooks/sitecustomize.py):
    the product has no kill switch, the test installs one by monkeypatching at start-up."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOKS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ICECDC_TEST_FAULT": fault}
    return {**env, "ICECDC_TEST_FAULT_TABLE": table} if table else env


def run_on_terminal(argv, env, rows: int = 50, columns: int = 160):  # noqa: ANN001, ANN201
    """Run a command with a pseudo-terminal as its stdin, stdout and stderr (a person at a terminal);
    returns (exit code, everything it wrote, [(seconds since the start, offset in the output)] per read)."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios
    import time

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    started = time.monotonic()
    process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env, close_fds=True)
    os.close(terminal)
    written, reads = bytearray(), []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        written += chunk
        reads.append((time.monotonic() - started, len(written)))
    os.close(controller)
    return process.wait(), written.decode("utf-8", "replace"), reads


CLEAR = re.compile(r"\x1b\[(\d+)F\x1b\[J")     # the live table erasing its previous frame
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CAPTION = re.compile(r"icecdc sync: (\d+\.\d)s since the command started")


def live_frames(shown: str, header: str = "batches done") -> tuple[list[str], list[str]]:
    """The frames of ``icecdc sync``'s live table in a terminal's output, and the lines written outside
    them (log lines, the report), asserting what a person at the terminal relies on: each frame but the last
    is erased whole before anything else is written (no stale copy stays), and nothing is written inside a
    frame (a log line goes above it). A segment between two erasures is [lines written above] + one frame."""
    segments, erased = [], []
    position = 0
    for match in CLEAR.finditer(shown):
        segments.append(shown[position:match.start()])
        erased.append(int(match.group(1)))
        position = match.end()
    segments.append(shown[position:])
    frames, outside = [], []
    for index, segment in enumerate(segments):
        text = ANSI.sub("", segment).replace("\r\n", "\n")  # the terminal's line ends
        lines = text.split("\n")
        top = next((i for i, line in enumerate(lines) if header in line), None)
        if top is None:  # nothing of a frame: only lines written outside
            outside.extend(line for line in lines if line.strip())
            continue
        bottom = next(i for i in range(top, len(lines)) if CAPTION.search(lines[i]))
        start = top - 1 if top > 0 and not lines[top - 1].strip() else top  # rich's blank line above the header
        frame = lines[start:bottom + 1]
        outside.extend(line for line in lines[:start] + lines[bottom + 1:] if line.strip())
        if index < len(erased):  # erased before the next write: exactly the frame's lines, nothing after it
            assert erased[index] == len(frame), (erased[index], frame)
            assert not "".join(lines[bottom + 1:]).strip(), lines[bottom + 1:]
        frames.append("\n".join(frame))
    return frames, outside
