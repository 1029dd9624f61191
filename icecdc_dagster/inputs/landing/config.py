"""The ``landing`` input's settings (validated at load like the rest of the pipeline file)."""

from typing import ClassVar

from pydantic import Field

from icecdc_dagster.fields import Duration, Flag, LocationOrUri, PositiveInt, parse_duration
from icecdc_dagster.inputs.base import InputConfig


class LandingConfig(InputConfig):
    """Debezium events from landing files (one JSON event per line), in file-name order; a batch is one file or
    a run of consecutive files, its id (``<file>#0-<size>;...``) is in the Iceberg commit; files are immutable,
    so acknowledging is a no-op."""

    kind: ClassVar[str] = "landing"

    path: LocationOrUri = Field(description="directory of landing files (relative to the pipeline file) or a URI")
    files_per_batch: PositiveInt = Field(default=1, description="landing files per batch (one commit per target)")
    max_file_age: Duration = Field(default="P7D", description="the ledger keeps landing files younger than this "
                                                              "(Spark's maxFileAge, against the newest file); an "
                                                              "older file never ingested is counted, not ingested")
    take_expired_files: Flag = Field(default=False, description="ingest landing files older than max_file_age "
                                                                "that were never ingested, instead of counting them")

    @property
    def source(self) -> str:
        return self.path

    @property
    def max_file_age_s(self) -> float:
        return parse_duration(self.max_file_age)

    def describe(self) -> str:
        return f"landing files in {self.path}"
