"""The Dagster adapter of the OpenSearch sink kind: the cluster connection as a resource, so the
UI shows it, a launch can override it, and credentials are ``EnvVar``s resolved only at run time."""

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field

from icecdc_dagster.fields import EnvRef
from icecdc_dagster.resources.secrets import env_var


class OpenSearchResource(ConfigurableResource[Any]):
    hosts: list[str] = ["http://localhost:9200"]
    username: str | None = None
    password: str | None = Field(default=None, description="use EnvVar('...'); never logged")
    verify_certs: bool = True
    ca_certs: str | None = None
    request_timeout_s: float = 60.0

    @classmethod
    def of(cls, hosts: list[str], username: EnvRef | str | None, password: EnvRef | None, verify_certs: bool,
           ca_certs: str | None, request_timeout_s: float) -> "OpenSearchResource":
        """The connection part of a sink config (``connection_resource``); ``{env: VAR}`` values become
        ``EnvVar``s."""
        return cls(hosts=hosts, username=env_var(username), password=env_var(password), verify_certs=verify_certs,
                   ca_certs=ca_certs, request_timeout_s=request_timeout_s)
