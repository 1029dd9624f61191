"""A secret the pipeline file names (``{env: VARIABLE}``) as Dagster reads it: an ``EnvVar``, resolved only
at run time and never shown in the UI."""

from typing import Any, overload

from dagster import EnvVar

from icecdc_dagster.errors import UnresolvedResourceError
from icecdc_dagster.fields import EnvRef


@overload
def env_var(value: EnvRef | str) -> str: ...
@overload
def env_var(value: EnvRef | str | None) -> str | None: ...
def env_var(value: EnvRef | str | None) -> str | None:
    """``{env: VAR}`` -> ``EnvVar("VAR")`` (a ``str`` Dagster resolves at run time); a plain value (a user
    name) as it is."""
    return EnvVar(value.name) if isinstance(value, EnvRef) else value


def unresolved_fields(resource: Any) -> list[str]:
    """The fields of ``resource`` that still hold an ``EnvVar`` (a ``str`` whose text is the variable's NAME)."""
    found = []
    for name in type(resource).model_fields:
        value = getattr(resource, name, None)
        values = value.items() if isinstance(value, dict) else [(None, value)]
        found += [f"{name}.{key}" if key is not None else name for key, item in values if isinstance(item, EnvVar)]
    return found


def require_resolved(resource: Any, what: str) -> None:
    """Refuse to connect with a resource Dagster has not initialised: its secrets would go to the server as
    the variables' names.

    Raises:
        UnresolvedResourceError: names the fields (never a value) and where a usable resource comes from.
    """
    fields = unresolved_fields(resource)
    if fields:
        raise UnresolvedResourceError(
            f"{what}: {', '.join(fields)} still name environment variables: this resource was not initialised "
            f"by Dagster; outside a run take it from icecdc_dagster.resources.resolved")
