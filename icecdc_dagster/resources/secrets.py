"""A secret the pipeline file names (``{env: VARIABLE}``) as Dagster reads it: an ``EnvVar``, resolved only
at run time and never shown in the UI."""

from typing import overload

from dagster import EnvVar

from icecdc_dagster.fields import EnvRef


@overload
def env_var(value: EnvRef | str) -> str: ...
@overload
def env_var(value: EnvRef | str | None) -> str | None: ...
def env_var(value: EnvRef | str | None) -> str | None:
    """``{env: VAR}`` -> ``EnvVar("VAR")`` (a ``str`` Dagster resolves at run time); a plain value (a user
    name) as it is."""
    return EnvVar(value.name) if isinstance(value, EnvRef) else value
