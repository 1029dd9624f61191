"""Connection settings of one OpenSearch cluster; credentials come from EnvVar."""

from dagster import ConfigurableResource
from pydantic import Field


class OpenSearchResource(ConfigurableResource):
    hosts: list[str] = ["http://localhost:9200"]
    username: str | None = None
    password: str | None = Field(default=None, description="use EnvVar('...'); never logged")
    verify_certs: bool = True
    ca_certs: str | None = None
    request_timeout_s: float = 60.0

    def client(self):  # noqa: ANN201 - opensearchpy.OpenSearch
        from opensearchpy import OpenSearch

        auth = (self.username, self.password) if self.username else None
        return OpenSearch(hosts=list(self.hosts), http_auth=auth, verify_certs=self.verify_certs,
                          ca_certs=self.ca_certs, timeout=self.request_timeout_s)
