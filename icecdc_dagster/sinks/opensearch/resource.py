"""The Dagster adapter of the OpenSearch sink kind: the cluster connection as a resource, so the
UI shows it, a launch can override it, and credentials are ``EnvVar``s resolved only at run time."""

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field

from icecdc_dagster.fields import EnvRef
from icecdc_dagster.resources.secrets import env_var, require_resolved


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

    def cluster(self) -> tuple[tuple[str, ...], str | None, str | None, bool, str | None, float]:
        """(hosts, username, password, verify_certs, ca_certs, request_timeout_s) for the engine.

        Raises:
            UnresolvedResourceError: this resource was not initialised by Dagster (``resources.resolved``):
                its credentials would go to the cluster as the variables' names.
        """
        require_resolved(self, f"OpenSearch connection {', '.join(self.hosts)}")
        return (tuple(self.hosts), self.username, self.password, self.verify_certs, self.ca_certs,
                self.request_timeout_s)
