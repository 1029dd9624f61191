"""Drive the real sensor and real runs against a real Dagster instance, tick by tick,
as the daemon would: apply the sensor's partition requests, then launch its run requests."""

from dataclasses import dataclass, field

from dagster import DagsterInstance, Definitions, build_sensor_context

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.config import TableConfig


@dataclass
class Tick:
    added: list[str] = field(default_factory=list)
    requested: list[tuple[str, str]] = field(default_factory=list)  # (first, last) partition keys
    succeeded: list[bool] = field(default_factory=list)
    skip_reason: str | None = None
    run_requests: list = field(default_factory=list)   # the RunRequests themselves (to launch elsewhere)


def tick(defs: Definitions, instance: DagsterInstance, table: TableConfig, run: bool = True) -> Tick:
    return tick_sensor(defs, instance, naming.sensor_name(table), asset_keys(table), run)


def tick_sensor(defs: Definitions, instance: DagsterInstance, sensor_name: str, selection, run: bool = True) -> Tick:  # noqa: ANN001
    sensor = defs.get_sensor_def(sensor_name)
    context = build_sensor_context(instance=instance, instance_ref=instance.get_ref(), resources=defs.resources,
                                   definitions=defs)
    result = sensor.evaluate_tick(context)
    out = Tick(skip_reason=result.skip_message)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        out.added.extend(request.partition_keys)
    for event in result.asset_events:  # then the sensor's asset events, as the daemon stores them
        instance.report_runless_asset_event(event)
    job = defs.resolve_implicit_global_asset_job_def()
    for request in result.run_requests or []:
        out.run_requests.append(request)
        range_ = request.partition_key_range
        first, last = (range_.start, range_.end) if range_ else (request.partition_key, request.partition_key)
        out.requested.append((first, last))
        if run:
            execution = job.execute_in_process(instance=instance, partition_key=request.partition_key,
                                               asset_selection=list(selection), tags=request.tags,
                                               raise_on_error=False)
            out.succeeded.append(execution.success)
    return out


def drain(defs: Definitions, instance: DagsterInstance, table: TableConfig, limit: int = 30) -> list[Tick]:
    return drain_sensor(defs, instance, naming.sensor_name(table), asset_keys(table), limit)


def drain_sensor(defs: Definitions, instance: DagsterInstance, sensor_name: str, selection,  # noqa: ANN001
                 limit: int = 30) -> list[Tick]:
    """Tick until the sensor has nothing left to request (or a run fails)."""
    ticks = []
    for _ in range(limit):
        current = tick_sensor(defs, instance, sensor_name, selection)
        ticks.append(current)
        if not current.requested or not all(current.succeeded):
            break
    return ticks


def create_launchable_run(defs: Definitions, instance: DagsterInstance, request,  # noqa: ANN001, ANN201
                          sensor_name: str | None = None):
    """Create the run of a sensor's RunRequest as the daemon does, with a code origin
    (``icecdc_dagster.definitions``, configured by ``ICECDC_CONFIG``) that a run worker process can load."""
    import os

    from dagster._core.definitions.reconstruct import ReconstructableRepository

    from icecdc_dagster.sync import remote_origin

    job = defs.resolve_implicit_global_asset_job_def()
    repository = ReconstructableRepository.for_module("icecdc_dagster.definitions", "defs", os.getcwd())
    origin = repository.get_reconstructable_job(job.name).get_python_origin()
    # The daemon adds the sensor's own tag (``DagsterRun.tags_for_sensor``): the UI's "Launched by".
    tags = {**request.tags, "dagster/partition": request.partition_key,
            **({"dagster/sensor_name": sensor_name} if sensor_name else {})}
    # ... and the job's remote origin in the code location that loaded it (the UI files the run under it).
    return instance.create_run_for_job(job_def=job, tags=tags, asset_selection=frozenset(request.asset_selection),
                                       job_code_origin=origin, remote_job_origin=remote_origin(job.name))


def start_run_worker(instance: DagsterInstance, run, env: dict, log):  # noqa: ANN001, ANN201
    """``dagster api execute_run``: the run worker process Dagster's default launcher starts."""
    import subprocess
    import sys
    from pathlib import Path

    from dagster._grpc.types import ExecuteRunArgs
    from dagster_shared.serdes import serialize_value

    args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=instance.get_ref(),
                          set_exit_code_on_failure=True)
    dagster = Path(sys.executable).parent / "dagster"
    return subprocess.Popen([str(dagster), "api", "execute_run", serialize_value(args)], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
