"""How the OpenSearch sink reaches its cluster and shapes its writes.

The settings object is shipped to Spark executors (pickled), so it holds only
plain values; the password is kept out of ``repr`` so it never reaches logs.
"""

import re
from dataclasses import dataclass, field
from typing import Any

from icecdc_dagster.errors import AccessRefusedError, ConfigError

REFRESH_POLICIES = (True, False, "wait_for")
_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-+]*$")


@dataclass(frozen=True)
class OpenSearchSinkSettings:
    """One target index on one cluster.

    ``refresh``: True = one explicit refresh after all actions of a batch and
    before its checkpoint is written (documents are searchable once the
    checkpoint says so); "wait_for" = every bulk request waits for a refresh;
    False = rely on the index's refresh interval.

    ``mapping``: a user-supplied ``mappings`` body used when the index is
    created instead of the one derived from the Iceberg schema;
    ``template_name``: an index template that must exist and shapes the index
    (the index is then created bare). With ``evolve_mapping`` the sink still
    adds mappings for columns that neither defines (schema evolution).

    ``include_iceberg_metadata``: also store ``iceberg_operation`` (the row's
    change: INSERT or UPDATE_AFTER), ``iceberg_snapshot_operation`` (the
    snapshot's: append, overwrite, ...), ``iceberg_table_name`` and
    ``iceberg_snapshot_id`` in each document (off by default: documents are
    the source table's columns only).

    ``parallelism``: concurrent bulk requests inside each Spark task.
    ``max_retries``/``initial_backoff_s``/``max_backoff_s``: exponential backoff
    on 429, 5xx, timeouts and connection errors (whole requests and items).
    """

    hosts: tuple[str, ...]
    index: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    verify_certs: bool = True
    ca_certs: str | None = None
    chunk_size: int = 500
    max_chunk_bytes: int = 10 * 1024 * 1024
    parallelism: int = 2
    max_retries: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    refresh: bool | str = True
    request_timeout_s: float = 60.0
    mapping: dict[str, Any] | None = None
    template_name: str | None = None
    index_settings: dict[str, Any] | None = None
    evolve_mapping: bool = True
    include_iceberg_metadata: bool = False
    max_reported_failures: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.hosts, str):
            object.__setattr__(self, "hosts", (self.hosts,))
        else:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        where = f"opensearch sink for index {self.index!r}"
        if not self.hosts:
            raise ConfigError(f"{where}: 'hosts' is empty")
        if not isinstance(self.index, str) or not _INDEX_NAME.match(self.index):
            raise ConfigError(f"{where}: not a valid index name (lowercase, no spaces, no leading '_', '-' or '+')")
        for name in ("chunk_size", "max_chunk_bytes", "parallelism"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{where}: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_retries < 0 or self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError(f"{where}: max_retries and backoffs must be >= 0")
        if self.refresh not in REFRESH_POLICIES:
            raise ConfigError(f"{where}: refresh must be one of {REFRESH_POLICIES}, got {self.refresh!r}")
        if self.password is not None and self.username is None:
            raise ConfigError(f"{where}: a password is set without a username")
        if self.mapping is not None and self.template_name is not None:
            raise ConfigError(f"{where}: set either 'mapping' or 'template_name', not both")

    def client(self) -> Any:
        """A client that does not retry by itself: the sink's retry loop backs off instead. A 401/403
        answer raises :class:`AccessRefusedError` (terminal: the same password is refused again)."""
        from opensearchpy import OpenSearch  # opensearch-py: ~1.2 s, its sink only

        auth = (self.username, self.password) if self.username is not None else None
        return OpenSearch(
            hosts=list(self.hosts), http_auth=auth, verify_certs=self.verify_certs, ca_certs=self.ca_certs,
            timeout=self.request_timeout_s, max_retries=0, retry_on_timeout=False,
            pool_maxsize=max(self.parallelism, 1) + 1, http_compress=False,
            transport_class=_refusing_transport(), refused=self.refused)

    def refused(self, status: int) -> AccessRefusedError:
        """The cluster's 401/403 as an error naming the sink, the hosts and the setting (never a value)."""
        setting = "password" if self.password is not None else "username/password (none set)"
        return AccessRefusedError(f"opensearch sink for index {self.index!r} at {', '.join(self.hosts)}: the "
                                  f"cluster refused the basic-auth {setting} (HTTP {status}); its value is not shown")


_TRANSPORT: list[type] = []


def _refusing_transport() -> type:
    """opensearch-py's Transport whose 401/403 become :class:`AccessRefusedError`: every request of the
    sink (bulk writes on executors, checkpoint reads, index creation) stops the line the same way, instead
    of a 401 being retried or reported as a failed item."""
    if not _TRANSPORT:
        from opensearchpy import Transport  # opensearch-py: ~1.2 s, its sink only
        from opensearchpy.exceptions import (  # opensearch-py: ~1.2 s, its sink only
            AuthenticationException,
            AuthorizationException,
        )

        class RefusingTransport(Transport):
            def __init__(self, hosts: Any, refused: Any = None, **kwargs: Any) -> None:
                super().__init__(hosts, **kwargs)
                self._refused = refused

            def perform_request(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    return super().perform_request(*args, **kwargs)
                except (AuthenticationException, AuthorizationException) as exc:
                    if self._refused is None:
                        raise
                    raise self._refused(exc.status_code) from None

        _TRANSPORT.append(RefusingTransport)
    return _TRANSPORT[0]
