"""The Dagster adapter of the OpenSearch sink kind: the cluster connection as a resource, so the
UI shows it, a launch can override it, and credentials are ``EnvVar``s resolved only at run time."""

from typing import TYPE_CHECKING

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from icecdc_dagster.fields import EnvRef

if TYPE_CHECKING:
    from icecdc_dagster.sinks.opensearch.config import OpenSearchSinkConfig


class OpenSearchResource(ConfigurableResource):
    hosts: list[str] = ["http://localhost:9200"]
    username: str | None = None
    password: str | None = Field(default=None, description="use EnvVar('...'); never logged")
    verify_certs: bool = True
    ca_certs: str | None = None
    request_timeout_s: float = 60.0

    @classmethod
    def of(cls, config: "OpenSearchSinkConfig") -> "OpenSearchResource":
        """The connection part of a sink config; ``{env: VAR}`` values become ``EnvVar``s."""

        def secret(value: EnvRef | str | None) -> str | EnvVar | None:
            return EnvVar(value.name) if isinstance(value, EnvRef) else value

        return cls(hosts=list(config.hosts), username=secret(config.username), password=secret(config.password),
                   verify_certs=config.verify_certs, ca_certs=config.ca_certs,
                   request_timeout_s=config.request_timeout_s)
