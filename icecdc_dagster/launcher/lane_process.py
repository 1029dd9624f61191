"""The lanes in a process of their own: one long-lived child of the daemon that holds the warm
SparkSession and executes the runs, while the daemon keeps its sensors, its run queue and launching.

Why: the daemon is one Python process, so its sensors, queue, launches and every lane's run share
one interpreter lock. On a SQLite instance the instance's storage work also stays in that process,
and the daemon tops out near one core (bench/dagster_floor.py: 122 runs a minute with Dagster alone,
the daemon at 0.97 cores and the machine's second core free). In a lane process the runs' Python
(Dagster's step machinery, py4j, our code) has a lock of its own.

The protocol is one-way, over the child's stdin: a JSON line with the setup (the instance's ref, the
lanes, the session), then one run id per line. Everything else goes through the instance, as between
any Dagster processes: the child reports each run's events and status, a terminate marks the run
CANCELING and the child's watcher interrupts it. The daemon tags each run with the child's pid,
session and holder before it sends it, so a dead child's runs are failed over like any dead worker's
(``lease.failover``; ``worker_health``).

The child ends when its stdin closes (the daemon disposed its launcher, exited or was killed) or on
SIGTERM/SIGINT: runs still waiting fail at once (as a dead worker's, so they keep their retries), runs
executing get :data:`SHUTDOWN_GRACE_S` to finish.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from dagster_shared.serdes import deserialize_value, serialize_value

from icecdc_dagster.launcher.lanes import Lanes, prepare_lane_instance
from icecdc_dagster.launcher.worker_health import new_session
from icecdc_dagster.lease.executor import LANE_PROCESS_ROLE
from icecdc_dagster.lease.holder import Holder, set_process_role

if TYPE_CHECKING:
    from types import FrameType

SHUTDOWN_GRACE_S = 60.0


@dataclass(frozen=True)
class LaneSetup:
    """What the daemon tells its lane process, once, before the first run id."""

    instance_ref: InstanceRef
    workers: int
    session: str
    switch_interval_ms: float = 0.0
    sqlite_synchronous: str | None = None

    def to_line(self) -> str:
        return json.dumps({"instance_ref": serialize_value(self.instance_ref), "workers": self.workers,
                           "session": self.session, "switch_interval_ms": self.switch_interval_ms,
                           "sqlite_synchronous": self.sqlite_synchronous}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> "LaneSetup":
        data = json.loads(line)
        return cls(instance_ref=deserialize_value(data["instance_ref"], InstanceRef), workers=int(data["workers"]),
                   session=str(data["session"]), switch_interval_ms=float(data["switch_interval_ms"]),
                   sqlite_synchronous=data.get("sqlite_synchronous"))


class LaneProcess:
    """The daemon's handle on one lane process, which starts as the handle is made."""

    def __init__(self, setup: LaneSetup) -> None:
        self.setup = setup
        command = [sys.executable, "-c", f"from {__name__} import main; main()"]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True, close_fds=True)  # noqa: S603
        self.holder = Holder.of(self._process.pid, role=LANE_PROCESS_ROLE)
        self._stdin: IO[str] = self._process.stdin  # type: ignore[assignment]
        self._write = threading.Lock()
        self.send_line(setup.to_line())

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def session(self) -> str:
        return self.setup.session

    def alive(self) -> bool:
        return self._process.poll() is None

    def describe(self) -> str:
        code = self._process.poll()
        return f"lane process {self.pid} " + ("(running)" if code is None else f"(exited with {code})")

    def send(self, run_id: str) -> bool:
        """Hand the run to the process; False if it has exited (then it never gets the run)."""
        return self.send_line(run_id + "\n")

    def send_line(self, line: str) -> bool:
        with self._write:
            try:
                self._stdin.write(line)
                self._stdin.flush()
            except (BrokenPipeError, ValueError, OSError):  # exited (ValueError: stdin closed here)
                return False
        return True

    def close(self) -> None:
        """Ask the process to end (it finishes the runs it executes first; see the module's docstring)."""
        with self._write:
            try:
                self._stdin.close()
            except OSError:
                pass


# -- the lane process --------------------------------------------------------------------------


def _stop(_signum: int, _frame: "FrameType | None") -> None:
    """SIGTERM (or SIGINT) in the lane process: stop reading run ids and shut down, as on a closed stdin."""
    raise KeyboardInterrupt


def main() -> None:
    """The lane process: read the setup, then execute each run id read from stdin in a lane."""
    first = sys.stdin.readline()
    if not first:
        return
    setup = LaneSetup.from_line(first)
    lanes = _open_lanes(setup)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        for line in sys.stdin:
            if line.strip():
                lanes.submit(line.strip())
    except KeyboardInterrupt:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lanes.fail_waiting("its daemon stopped before the run started")
    lanes.join(timeout=SHUTDOWN_GRACE_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the lanes are daemon threads; a run still executing is failed over by its holder's death


def _open_lanes(setup: LaneSetup) -> Lanes:
    """This process's instance, set up as the daemon's lanes would have it, and its lanes."""
    set_process_role(LANE_PROCESS_ROLE)
    new_session(setup.session)
    instance = DagsterInstance.from_ref(setup.instance_ref)
    prepare_lane_instance(instance, setup.workers, setup.sqlite_synchronous, other_threads=1)
    if setup.workers > 1 and setup.switch_interval_ms:
        sys.setswitchinterval(setup.switch_interval_ms / 1000)
    return Lanes(instance, setup.workers, where=f"the warm launcher's lane process (pid: {os.getpid()})")
