"""Whether the process recorded on a run may still be executing it: the warm launcher's health check
and orphan sweep read it."""

import os
import socket
import uuid

from dagster._core.storage.dagster_run import DagsterRun

from icecdc_dagster import run_tags
from icecdc_dagster.lease import failover
from icecdc_dagster.run_tags import LAUNCHER_HOST_TAG, LAUNCHER_PID_TAG, LAUNCHER_SESSION_TAG

# Sessions of the launchers alive in this process (several instance objects may share a process).
_LIVE_SESSIONS: set[str] = set()


def new_session(session: str | None = None) -> str:
    """A launcher session of this process, alive until the process ends (tagged on its runs);
    ``session``: one a lane process is given by the daemon that started it."""
    session = session or uuid.uuid4().hex
    _LIVE_SESSIONS.add(session)
    return session


def worker_alive(run: DagsterRun) -> bool:
    """Whether the process recorded on the run may still be executing it."""
    session = run_tags.read(run.tags, LAUNCHER_SESSION_TAG)
    if session and run_tags.read(run.tags, LAUNCHER_PID_TAG) == str(os.getpid()):
        # This process, or an earlier one whose pid it reuses: alive if the session is ours.
        return session in _LIVE_SESSIONS
    judged = failover.judge(run)
    if judged is not None:  # host, pid and process start time (a reused pid is told apart)
        return judged[1].alive
    if run_tags.read(run.tags, LAUNCHER_HOST_TAG) != socket.gethostname():
        return True  # another host: we cannot tell; leave it to that host's daemon
    try:
        pid = int(run_tags.read(run.tags, LAUNCHER_PID_TAG, "") or "")
    except ValueError:
        return False
    if pid == os.getpid():
        # This process, or an earlier one whose pid it reuses: alive if the session is ours.
        return session in _LIVE_SESSIONS
    return _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
