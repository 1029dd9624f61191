"""Dagster's default launcher (a process per run) with a worker health check: the launcher of the
generated dagster.yaml (``lease.dagster_yaml``)."""

from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._core.storage.dagster_run import DagsterRun

from icecdc_dagster.lease import failover


class MonitoredRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher (a new process per run) with a worker health check, so run
    monitoring fails a run whose process died instead of leaving it STARTED forever.

    The run worker records itself on the run (host, pid, process start time; ``lease.holder``):
    on this host the check is exact (a reused pid is told apart), for another host's worker it
    reads the run's heartbeat. A run no icecdc worker has recorded itself on yet counts as running
    (run monitoring's ``start_timeout_seconds`` covers a worker that never starts).
    """

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        judged = failover.judge(run)
        if judged is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no icecdc worker recorded on the run yet")
        holder, verdict = judged
        if verdict.alive:
            return CheckRunHealthResult(WorkerStatus.RUNNING, verdict.reason)
        return CheckRunHealthResult(WorkerStatus.FAILED, failover.death_notice(holder, verdict.reason))
