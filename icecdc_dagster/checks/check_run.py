"""The run a check executes in (None when the check is invoked directly, as tests do)."""

from dagster import AssetCheckExecutionContext, AssetExecutionContext
from dagster._core.errors import DagsterInvalidPropertyError


def run_id_of(context: AssetCheckExecutionContext | AssetExecutionContext) -> str | None:
    try:
        return context.run.run_id
    except DagsterInvalidPropertyError:
        return None
