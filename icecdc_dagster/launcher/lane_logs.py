"""Each lane's run keeps its own compute logs (stdout and stderr, as the run's page in the UI shows them).

Dagster captures a run's output by pointing the process's file descriptors 1 and 2 at the run's log
files, with a ``tail -F`` copying them back to the terminal. That is right for a process per run. With
several lanes in one process it is wrong: the descriptors are the process's, so concurrent runs write
into each other's files, and a run that ends first points them back while another still runs, whose
last lines then land in the daemon's output instead of its log (``tests/test_launcher.py``). It also
starts four processes per run (two ``tail`` and two watchers).

So in a lane, a run captures by thread instead: ``sys.stdout`` and ``sys.stderr`` route each write of
the lane's thread to its run's files as well as to the process's stream (where Dagster's ``tail``
would have copied it), and the descriptors are left alone. What is written straight to the
descriptors (the JVM, C code) and by other threads stays the daemon's output, as before.

Only Dagster's own ``LocalComputeLogManager`` (the default) is routed: it reads the same files. Any
other manager (e.g. one that uploads to object storage) keeps its own capture, and the launcher warns
that concurrent lanes' logs can mix.
"""

import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._utils import ensure_file, touch_file

from icecdc_dagster.lease.executor import WARM_WORKER_THREAD

if TYPE_CHECKING:
    from dagster import DagsterInstance


class ThreadRoutedStream:
    """A process stream (``sys.stdout``/``sys.stderr``) that also copies a thread's writes to the file
    registered for that thread. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream
        self.routes: dict[int, TextIO] = {}

    def write(self, text: str) -> int:
        copy = self.routes.get(threading.get_ident())
        if copy is not None:
            copy.write(text)
        return self.wrapped.write(text)

    def writelines(self, lines: Sequence[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        copy = self.routes.get(threading.get_ident())
        if copy is not None:
            copy.flush()
        self.wrapped.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, ...: the process stream's
        return getattr(self.wrapped, name)


def routed(name: str) -> ThreadRoutedStream:
    """``sys.<name>`` as a :class:`ThreadRoutedStream`, wrapping the current stream if it is not one (a
    test runner or a user may have replaced it since)."""
    stream = getattr(sys, name)
    if not isinstance(stream, ThreadRoutedStream):
        stream = ThreadRoutedStream(stream)
        setattr(sys, name, stream)
    return stream


def in_lane() -> bool:
    return threading.current_thread().name.startswith(WARM_WORKER_THREAD)


class LaneComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute logs (same files, same reading), captured by thread in a lane."""

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        if not in_lane():
            with super().capture_logs(log_key) as context:
                yield context
            return
        ident = threading.get_ident()
        with ExitStack() as files:
            streams = {}
            for name, io_type in (("stdout", ComputeIOType.STDOUT), ("stderr", ComputeIOType.STDERR)):
                path = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[io_type])
                ensure_file(path)
                streams[name] = files.enter_context(open(path, "a", buffering=1, encoding="utf-8"))  # noqa: SIM115
            routers = {name: routed(name) for name in streams}
            for name, router in routers.items():
                router.routes[ident] = streams[name]
            try:
                yield CapturedLogContext(log_key)
            finally:
                for router in routers.values():
                    router.routes.pop(ident, None)
        touch_file(self.complete_artifact_path(log_key))  # the capture is complete (as Dagster's marks it)


def route_lane_compute_logs(instance: "DagsterInstance") -> bool:
    """Give ``instance`` (the launcher's, in the daemon) a :class:`LaneComputeLogManager` in place of
    Dagster's default local one; True if it did. Called before the first run, so the run loggers that
    hold ``sys.stderr`` hold the routed stream."""
    manager = instance.compute_log_manager
    if type(manager) is not LocalComputeLogManager:
        return isinstance(manager, LaneComputeLogManager)
    lane_manager = LaneComputeLogManager(manager._base_dir, manager.polling_timeout, manager.inst_data)  # noqa: SLF001
    lane_manager.register_instance(instance)
    instance._compute_log_manager = lane_manager  # noqa: SLF001 - Dagster builds it once from dagster.yaml
    routed("stdout")
    routed("stderr")
    return True
