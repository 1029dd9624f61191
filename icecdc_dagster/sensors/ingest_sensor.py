"""The per-entry ingest sensor: new landing files become partitions (name order) and are ingested
strictly in order, one batch at a time, with the same retry/blocking rule as tables. For a stream input
the partition is the first unacknowledged position whenever messages wait (one batch per run)."""

from typing import TYPE_CHECKING

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor

from icecdc_dagster.assets import naming
from icecdc_dagster.config import IngestConfig
from icecdc_dagster.lease.executor import line_job
from icecdc_dagster.lines import line
from icecdc_dagster.steps.ingest_entry import input_keys
from icecdc_dagster.steps.ordering import Blocked, NextRun

if TYPE_CHECKING:
    from dagster import DagsterInstance


def ingest_line(entry: IngestConfig) -> line.Line:
    return line.Line(line_id=naming.ingest_line_id(entry), partitions_def=naming.ingest_partitions_def(entry),
                     asset_keys=(naming.ingest_key(entry),),
                     max_keys_per_run=entry.landing_files_per_batch if entry.input is None else 1,
                     max_retries=entry.max_retries)


def evaluate(instance: "DagsterInstance", entry: IngestConfig,
             patient: bool = True) -> tuple[list[str], NextRun | Blocked | None]:
    """Landing files (or a stream's next position) not yet known as partitions, and the next run to request
    (``patient``: see ``line.plan``; False for ``icecdc sync``)."""
    entry_line = ingest_line(entry)
    new_keys = unknown_keys(instance, entry_line, input_keys(entry))
    return new_keys, line.plan(instance, entry_line, new_keys, patient=patient)


def unknown_keys(instance: "DagsterInstance", entry_line: line.Line, keys: list[str]) -> list[str]:
    """Landing files not yet known as partitions: a bounded membership query over the listing (Dagster
    chunks it), never the whole partition history. A file that lands late under an older name is
    still found."""
    known = instance.get_existing_dynamic_partitions(entry_line.partitions_name, keys) if keys else set()
    return [key for key in keys if key not in known]


def build_ingest_sensor(entry: IngestConfig) -> SensorDefinition:
    @sensor(
        name=naming.ingest_sensor_name(entry),
        minimum_interval_seconds=line.minimum_interval(entry.polling_interval_s),
        job=line_job(naming.ingest_sensor_name(entry), [naming.ingest_key(entry)]),
        default_status=DefaultSensorStatus.RUNNING,
        description=(f"Adds each new landing file of {entry.source} as a partition and ingests them in order."
                     if entry.input is None else f"Requests a run (a partition named by the first waiting position) "
                                                 f"whenever messages wait in {entry.input.describe()}."),
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        line.share_instance(context)
        new_keys, planned = evaluate(context.instance, entry)
        partitions = naming.ingest_partitions_def(entry)
        add = [partitions.build_add_request(new_keys)] if new_keys else []
        busy = line.held_elsewhere(context.instance, ingest_line(entry)) if isinstance(planned, NextRun) else None
        if isinstance(planned, NextRun) and busy is None:
            return SensorResult(run_requests=[line.run_request(ingest_line(entry), planned)],
                                dynamic_partitions_requests=add)
        idle = "every landing file is ingested" if entry.input is None else "no message waits"
        reason = busy or (planned.reason if isinstance(planned, Blocked) else idle)
        return SensorResult(skip_reason=SkipReason(reason), dynamic_partitions_requests=add)

    return _sensor
