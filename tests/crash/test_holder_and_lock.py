"""The holder of a run (host, pid, process start time) and the line lock, with real processes:
a dead, a zombie and a reused pid are told from a live one; a lock dies with its holder."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from icecdc_dagster.errors import LineBusyError
from icecdc_dagster.lease.holder import Holder, process_state, verdict
from icecdc_dagster.lease.line_lock import LineLock, holding

HOLD_LOCK = """
import sys, time
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock
lock = LineLock(sys.argv[1], sys.argv[2])
assert lock.try_acquire(Holder.current(role="test holder"))
print("locked", flush=True)
time.sleep(600)
"""


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _holder_of(process: subprocess.Popen, **changes) -> Holder:
    state = process_state(process.pid)
    data = {"host": socket.gethostname(), "pid": process.pid, "pid_start": state.start_ticks,
            "boot_id": Holder.current().boot_id, "since": time.time(), "role": "test worker", **changes}
    return Holder.from_dict(data)


def test_live_dead_zombie_and_reused_pids_are_told_apart():
    me = Holder.current(role="test")
    assert me.pid == os.getpid() and me.pid_start is not None and verdict(me, None).alive
    child = _sleeper()
    try:
        live = _holder_of(child)
        assert verdict(live, None).alive
        # Same pid, another start time: the pid was reused by another process.
        reused = verdict(_holder_of(child, pid_start=live.pid_start - 1), None)
        assert not reused.alive and "another process" in reused.reason
        rebooted = verdict(_holder_of(child, boot_id="another-boot"), None)
        assert not rebooted.alive and "rebooted" in rebooted.reason
        child.send_signal(signal.SIGKILL)
        while process_state(child.pid).state != "Z":  # killed, not yet reaped
            time.sleep(0.01)
        zombie = verdict(live, None)
        assert not zombie.alive and "zombie" in zombie.reason
    finally:
        child.kill()
        child.wait()
    dead = verdict(live, None)
    assert not dead.alive and f"no process {child.pid}" in dead.reason


def test_another_hosts_worker_lives_while_its_heartbeat_is_fresh():
    now = 1_000_000.0
    remote = Holder(host="other-host.example", pid=4242, pid_start=99, boot_id="b", since=now - 3600, role="run worker")
    assert verdict(remote, heartbeat=now - 10, now=now, lease_timeout_s=60).alive
    stale = verdict(remote, heartbeat=now - 61, now=now, lease_timeout_s=60)
    assert not stale.alive and "no heartbeat from other-host.example:4242" in stale.reason
    assert not verdict(remote, heartbeat=None, now=now, lease_timeout_s=60).alive


def test_second_writer_loses_and_the_lock_names_its_holder(tmp_path):
    first, second = LineLock(tmp_path, "db.orders"), LineLock(tmp_path, "db.orders")
    me = Holder.current(role="icecdc sync")
    assert first.try_acquire(me)
    assert not second.try_acquire(me, grace_s=0)      # another open file: another writer, even in-process
    assert LineLock(tmp_path, "db.other").try_acquire(me)   # other lines are independent
    with pytest.raises(LineBusyError) as busy:
        with holding(second, me):
            pass
    message = str(busy.value)
    assert "db.orders" in message and f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert "icecdc sync" in message and "since" in message
    first.release()
    with holding(second, me):
        assert second.held and first.is_busy() is True
    assert not first.is_busy()


def test_waiting_writer_gets_the_line_only_after_the_holder_releases(tmp_path):
    holder_lock, waiter_lock = LineLock(tmp_path, "ingest:orders"), LineLock(tmp_path, "ingest:orders")
    me = Holder.current(role="test")
    assert holder_lock.try_acquire(me)
    events: list[str] = []
    waiting = threading.Event()

    def waiter() -> None:
        with holding(waiter_lock, me, wait=True, poll_s=0.01, on_wait=lambda _: waiting.set()):
            events.append("waiter acquired")

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10)
    events.append("holder released")
    holder_lock.release()
    thread.join(10)
    assert events == ["holder released", "waiter acquired"]
    assert not holder_lock.is_busy()


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path), "db.orders"], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        lock = LineLock(tmp_path, "db.orders")
        assert lock.is_busy()
        owner = lock.busy_owner()
        assert owner.holder.pid == process.pid and owner.holder.role == "test holder"
        assert json.loads(lock.path.read_text())["line"] == "db.orders"
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert lock.try_acquire(Holder.current(role="next"), grace_s=0)   # at once: no stale lock, no cleanup
        assert lock.recorded_owner().holder.pid == os.getpid()
        lock.release()
    finally:
        process.kill()
        process.wait()
