"""The process that executes a run (its *holder*), recorded on the run as tags, and whether it lives.

A pid alone cannot tell a dead worker from a live one: pids are reused. The holder is the triple
(host, pid, process start time from ``/proc/<pid>/stat``) plus the machine's boot id, so on the same
host the verdict is exact: the holder lives iff a process with that pid and that start time exists
(and is not a zombie). Another host's processes cannot be inspected: there the holder lives while
the heartbeat it writes on the run (every ``HEARTBEAT_INTERVAL_S``) is younger than the lease timeout.
"""

import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icecdc_dagster import run_tags
from icecdc_dagster.run_tags import (
    WORKER_BOOT_TAG,
    WORKER_HEARTBEAT_TAG,
    WORKER_HOST_TAG,
    WORKER_PID_START_TAG,
    WORKER_PID_TAG,
    WORKER_ROLE_TAG,
    WORKER_SINCE_TAG,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance


HEARTBEAT_INTERVAL_S = 10.0
LEASE_TIMEOUT_S = float(os.environ.get("ICECDC_LEASE_TIMEOUT_S", "60"))


_PROCESS_ROLE = ["dagster process"]


def set_process_role(role: str) -> None:
    """What this process is, as named in holders and failover messages ("icecdc sync", ...)."""
    _PROCESS_ROLE[0] = role


def process_role() -> str:
    return _PROCESS_ROLE[0]


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def boot_id() -> str | None:
    text = _read("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


@dataclass(frozen=True)
class ProcessState:
    start_ticks: int  # clock ticks after boot (field 22 of /proc/<pid>/stat)
    state: str        # R, S, D, Z (zombie), X (dead), ...


def process_state(pid: int) -> ProcessState | None:
    """The kernel's record of ``pid``, or None when no such process exists."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ": split after the last.
    fields = text.rsplit(")", 1)[1].split()
    return ProcessState(start_ticks=int(fields[19]), state=fields[0])


def _process_started_at(start_ticks: int) -> float | None:
    stat = _read("/proc/stat") or ""
    btime = next((int(line.split()[1]) for line in stat.splitlines() if line.startswith("btime ")), None)
    return None if btime is None else btime + start_ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    pid_start: int | None   # None where /proc is unavailable (then pid reuse cannot be detected)
    boot_id: str | None
    since: float            # epoch seconds: when the process started
    role: str               # "icecdc sync", "run worker", "warm launcher", ...

    @classmethod
    def current(cls, role: str | None = None) -> "Holder":
        return cls.of(os.getpid(), role)

    @classmethod
    def of(cls, pid: int, role: str | None = None) -> "Holder":
        """Process ``pid`` of this host as a holder (a process this one started, e.g. a lane process)."""
        state = process_state(pid)
        started = _process_started_at(state.start_ticks) if state else None
        return cls(host=socket.gethostname(), pid=pid, pid_start=state.start_ticks if state else None,
                   boot_id=boot_id(), since=started if started is not None else time.time(),
                   role=role or _PROCESS_ROLE[0])

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}:{self.pid_start}"

    def describe(self) -> str:
        return f"{self.role} {self.host}:{self.pid} (running since {iso(self.since)})"

    def tags(self) -> dict[str, str]:
        """The run's (hidden) holder tags: ``run_tags`` explains why they are not on the runs page."""
        return {WORKER_HOST_TAG: self.host, WORKER_PID_TAG: str(self.pid),
                WORKER_PID_START_TAG: str(self.pid_start or ""), WORKER_BOOT_TAG: self.boot_id or "",
                WORKER_SINCE_TAG: f"{self.since:.3f}", WORKER_ROLE_TAG: self.role}

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "pid_start": self.pid_start, "boot_id": self.boot_id,
                "since": self.since, "role": self.role}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Holder":
        return cls(host=str(data["host"]), pid=int(data["pid"]),
                   pid_start=int(data["pid_start"]) if data.get("pid_start") not in (None, "") else None,
                   boot_id=data.get("boot_id") or None, since=float(data["since"]), role=str(data["role"]))

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> "Holder | None":
        """The holder recorded on a run, or None for a run no icecdc worker has picked up (also
        under the previous release's tag keys: a run in flight across an upgrade is still judged)."""
        host, pid = run_tags.read(tags, WORKER_HOST_TAG), run_tags.read(tags, WORKER_PID_TAG)
        if host is None or pid is None:
            return None
        try:
            return cls.from_dict({"host": host, "pid": pid, "pid_start": run_tags.read(tags, WORKER_PID_START_TAG),
                                  "boot_id": run_tags.read(tags, WORKER_BOOT_TAG),
                                  "since": run_tags.read(tags, WORKER_SINCE_TAG) or 0,
                                  "role": run_tags.read(tags, WORKER_ROLE_TAG, "worker")})
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class Verdict:
    alive: bool
    reason: str  # why it is considered gone (or alive)


def local_verdict(holder: Holder) -> Verdict | None:
    """Exact answer for a holder on this host (this boot); None for another host."""
    if holder.host != socket.gethostname():
        return None
    current_boot = boot_id()
    if holder.boot_id and current_boot and holder.boot_id != current_boot:
        return Verdict(False, f"host {holder.host} was rebooted since the worker started")
    if holder.pid == os.getpid():
        own = process_state(holder.pid)
        same = holder.pid_start is None or (own is not None and own.start_ticks == holder.pid_start)
        return Verdict(True, "this process") if same else Verdict(False, f"pid {holder.pid} is now this process")
    state = process_state(holder.pid)
    if state is None:
        if not Path("/proc/self/stat").exists():  # no procfs: fall back to signal 0 (no pid reuse check)
            return _signal_zero(holder.pid)
        return Verdict(False, f"no process {holder.pid} on {holder.host}")
    if holder.pid_start is not None and state.start_ticks != holder.pid_start:
        return Verdict(False, f"pid {holder.pid} now belongs to another process (start time {state.start_ticks}, "
                              f"the worker's was {holder.pid_start})")
    if state.state in ("Z", "X"):
        return Verdict(False, f"process {holder.pid} has exited (zombie)")
    return Verdict(True, f"process {holder.pid} is running")


def _signal_zero(pid: int) -> Verdict:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Verdict(False, f"no process {pid}")
    except PermissionError:
        pass
    return Verdict(True, f"process {pid} exists")


def verdict(holder: Holder, heartbeat: float | None, now: float | None = None,
            lease_timeout_s: float | None = None) -> Verdict:
    """Whether ``holder`` still executes; ``heartbeat``: its last heartbeat (epoch s), if any."""
    local = local_verdict(holder)
    if local is not None:
        return local
    now = time.time() if now is None else now
    timeout = LEASE_TIMEOUT_S if lease_timeout_s is None else lease_timeout_s
    last = max(heartbeat or 0.0, holder.since)
    if now - last > timeout:
        return Verdict(False, f"no heartbeat from {holder.host}:{holder.pid} since {iso(last)} "
                              f"(lease timeout {timeout:.0f} s)")
    return Verdict(True, f"heartbeat at {iso(last)}")


def heartbeat_of(tags: Mapping[str, str]) -> float | None:
    """The run's last heartbeat (epoch s), also under the previous release's key."""
    try:
        return float(run_tags.read(tags, WORKER_HEARTBEAT_TAG) or "")
    except ValueError:
        return None


@contextmanager
def run_heartbeat(instance: "DagsterInstance", run_id: str, interval_s: float = HEARTBEAT_INTERVAL_S) -> Iterator[None]:
    """Refresh the run's heartbeat tag while the block runs (what other hosts judge the run by)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                instance.add_run_tags(run_id, {WORKER_HEARTBEAT_TAG: f"{time.time():.3f}"})
            except Exception:  # noqa: BLE001 - a missed beat is retried; the lease tolerates several
                pass
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=beat, name=f"icecdc-heartbeat-{run_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
