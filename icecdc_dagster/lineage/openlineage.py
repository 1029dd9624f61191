"""OpenLineage run events per batch: START when a step begins, COMPLETE or FAIL when it ends.

Teams on DataHub, Marquez, OpenMetadata or Atlan take lineage through OpenLineage. Every
changelog or sink step of a batch is one OpenLineage run (job ``<namespace>/<asset path>``), with
its input and output datasets named by the OpenLineage naming conventions for files/object
stores (an Iceberg table is its location: namespace ``file`` / ``s3://bucket``, name the path) and
a ``symlinks`` facet with the catalog table name; facets: ``schema``, ``dataSource``,
``columnLineage``, ``outputStatistics``, ``errorMessage`` on failure, and ``icecdc_batch`` with the
source snapshot ids and the Dagster run.

Configuration is OpenLineage's own (``OPENLINEAGE_URL``, ``OPENLINEAGE_CONFIG``, ``openlineage.yml``,
``OPENLINEAGE__...`` variables) or the pipeline file's ``lineage:`` block; with none of them nothing
is emitted. ``openlineage-dagster`` was evaluated first: it requires dagster<=1.6.9 (we run 1.13).
Emission never fails a batch: a transport error is logged and the batch goes on.
"""

import logging
import os
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    RunFacet,
    column_lineage_dataset,
    datasource_dataset,
    error_message_run,
    output_statistics_output_dataset,
    schema_dataset,
    symlinks_dataset,
)
from openlineage.client.uuid import generate_new_uuid

if TYPE_CHECKING:
    from openlineage.client import OpenLineageClient
    from pyiceberg.table import Table

PRODUCER = "https://github.com/icecdc/icecdc_dagster"
BATCH_FACET_SCHEMA = PRODUCER + "/blob/main/docs/openlineage/IcecdcBatchRunFacet.json#/$defs/IcecdcBatchRunFacet"
_ENV_KEYS = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG")
_log = logging.getLogger("icecdc_dagster.lineage")


@attr.define
class BatchFacet(RunFacet):
    """``icecdc_batch``: which source snapshots the run applied, and the Dagster run that did it."""

    sourceTable: str  # noqa: N815 - OpenLineage facets are camelCase
    snapshotId: str  # noqa: N815
    firstSnapshotId: str  # noqa: N815
    partitionKey: str  # noqa: N815
    dagsterRunId: str  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return BATCH_FACET_SCHEMA


@dataclass(frozen=True)
class LineageDataset:
    namespace: str
    name: str
    table_name: str | None = None                        # the catalog name, as a symlink
    fields: tuple[tuple[str, str, str | None], ...] = ()  # (name, type, description)
    source_uri: str | None = None

    def facets(self) -> dict[str, Any]:
        facets: dict[str, Any] = {"dataSource": datasource_dataset.DatasourceDatasetFacet(
            name=self.namespace, uri=self.source_uri or self.namespace)}
        if self.fields:
            facets["schema"] = schema_dataset.SchemaDatasetFacet(fields=[
                schema_dataset.SchemaDatasetFacetFields(name=n, type=t, description=d) for n, t, d in self.fields])
        if self.table_name:
            facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(identifiers=[
                symlinks_dataset.Identifier(namespace=self.namespace, name=self.table_name, type="TABLE")])
        return facets


def location_dataset(uri: str, fields: tuple[tuple[str, str, str | None], ...] = (),
                     table_name: str | None = None) -> LineageDataset:
    """A file or object-store location (OpenLineage: ``file`` + path, ``s3://bucket`` + key)."""
    location = urlparse(uri)
    if location.scheme in ("", "file"):
        namespace, name = "file", location.path
    else:
        namespace, name = f"{location.scheme}://{location.netloc}", location.path.lstrip("/")
    source_uri = "file:///" if namespace == "file" else f"{namespace}/"   # a URI (RFC 3986): the file system's root
    return LineageDataset(namespace, name, table_name, fields, source_uri=source_uri)


def iceberg_dataset(catalog_name: str, table: "Table") -> LineageDataset:
    """An Iceberg table named by its location, with its catalog name as a symlink."""
    fields = tuple((f.name, str(f.field_type), f.doc) for f in table.schema().fields)
    return location_dataset(table.location(), fields, ".".join((catalog_name, *table.name())))


def opensearch_dataset(hosts: Sequence[str], index: str) -> LineageDataset:
    """An index, in the namespace of its cluster's first host (``opensearch://host:port``)."""
    host = urlparse(hosts[0] if "://" in hosts[0] else f"http://{hosts[0]}")
    namespace = f"opensearch://{host.hostname}:{host.port or 9200}"
    return LineageDataset(namespace, index, source_uri=namespace)


@dataclass
class RunOutcome:
    """What the step reports before it ends: rows written and column lineage per output dataset."""

    outputs: list[LineageDataset] | None = None   # the outputs as they are after the step (None: as at START)
    inputs: list[LineageDataset] | None = None    # the inputs as known after the step (None: as at START)
    rows: dict[str, int] = field(default_factory=dict)                              # output name -> rows
    column_lineage: dict[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)  # output -> col -> inputs


class LineageEmitter:
    """Emits the OpenLineage events of batch steps through one client."""

    def __init__(self, client: "OpenLineageClient", namespace: str = "icecdc") -> None:
        self.client = client
        self.namespace = namespace

    @classmethod
    def configured(cls, namespace: str = "icecdc", transport: Mapping[str, Any] | None = None,
                   enabled: bool | None = None) -> "LineageEmitter | None":
        """The emitter when OpenLineage is configured (pipeline ``lineage:`` block, OpenLineage's
        variables or ``openlineage.yml``), else None: nothing is emitted."""
        if os.environ.get("OPENLINEAGE_DISABLED", "").lower() == "true" or enabled is False:
            return None
        configured = transport is not None or any(os.environ.get(k) for k in _ENV_KEYS) or any(
            k.startswith("OPENLINEAGE__") for k in os.environ) or Path("openlineage.yml").is_file() or (
            Path.home() / ".openlineage" / "openlineage.yml").is_file()
        if not configured and not enabled:
            return None

        client = OpenLineageClient(config={"transport": dict(transport)}) if transport else OpenLineageClient()
        return cls(client, namespace)

    @contextmanager
    def batch_run(self, job_name: str, inputs: Sequence[LineageDataset], outputs: Sequence[LineageDataset],
                  batch: BatchFacet) -> Iterator[RunOutcome]:
        """START now; COMPLETE with the outcome when the block ends, FAIL (and re-raise) when it raises."""
        run = Run(runId=str(generate_new_uuid()), facets={"icecdc_batch": batch})
        job = Job(namespace=self.namespace, name=job_name)
        self._emit(RunEvent(eventType=RunState.START, eventTime=_now(), run=run, job=job, producer=PRODUCER,
                            inputs=[self._input(d) for d in inputs], outputs=[self._output(d, None) for d in outputs]))
        outcome = RunOutcome()
        try:
            yield outcome
        except BaseException as exc:
            error = error_message_run.ErrorMessageRunFacet(
                message=f"{type(exc).__name__}: {exc}"[:2000], programmingLanguage="python",
                stackTrace="".join(traceback.format_exception(exc))[-8000:])
            failed = Run(runId=run.runId, facets={"icecdc_batch": batch, "errorMessage": error})
            self._emit(RunEvent(eventType=RunState.FAIL, eventTime=_now(), run=failed, job=job, producer=PRODUCER,
                                inputs=[self._input(d) for d in inputs],
                                outputs=[self._output(d, None) for d in outputs]))
            raise
        inputs = outcome.inputs or inputs
        by_name = {(d.namespace, d.name): d for d in inputs}
        self._emit(RunEvent(eventType=RunState.COMPLETE, eventTime=_now(), run=run, job=job, producer=PRODUCER,
                            inputs=[self._input(d) for d in inputs],
                            outputs=[self._output(d, outcome, by_name) for d in outcome.outputs or outputs]))

    def _input(self, dataset: LineageDataset) -> Any:
        return InputDataset(namespace=dataset.namespace, name=dataset.name, facets=dataset.facets())

    def _output(self, dataset: LineageDataset, outcome: RunOutcome | None,
                inputs: Mapping[tuple[str, str], LineageDataset] | None = None) -> Any:
        facets = dataset.facets()
        output_facets: dict[str, Any] = {}
        if outcome is not None and dataset.name in outcome.rows:
            output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=outcome.rows[dataset.name])
        lineage = outcome.column_lineage.get(dataset.name) if outcome is not None else None
        if lineage and inputs:
            source = next(iter(inputs.values()))
            facets["columnLineage"] = column_lineage_dataset.ColumnLineageDatasetFacet(fields={
                column: column_lineage_dataset.Fields(inputFields=[
                    column_lineage_dataset.InputField(namespace=source.namespace, name=source.name, field=name)
                    for name in names], transformationDescription="", transformationType="IDENTITY")
                for column, names in lineage.items() if names})
        return OutputDataset(namespace=dataset.namespace, name=dataset.name, facets=facets,
                             outputFacets=output_facets)

    def _emit(self, event: Any) -> None:
        try:
            self.client.emit(event)
        except Exception:  # noqa: BLE001 - lineage must never fail a batch
            _log.warning("icecdc: could not emit the OpenLineage %s event of %s", event.eventType, event.job.name,
                         exc_info=True)


def _now() -> str:
    return datetime.now(UTC).isoformat()
