"""One Iceberg catalog seen by both engines.

A REST catalog is one URL both pyiceberg's ``RestCatalog`` and Iceberg's Spark ``RESTCatalog`` talk
to, with the same property names (token, credential, oauth2-server-uri, scope, warehouse, prefix,
header.*). For a SQL catalog, pyiceberg's ``SqlCatalog`` and Iceberg's Spark ``JdbcCatalog`` keep their
tables in the same two SQL tables, keyed by catalog name: given one SQLAlchemy URL we derive both
configurations. Either way a table committed by either engine is visible to the other at once.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyiceberg.exceptions import ForbiddenError, OAuthError, UnauthorizedError
from sqlalchemy.engine import make_url

from icecdc_dagster.errors import AccessRefusedError, CatalogUnavailableError, ConfigError, IcecdcError
from icecdc_dagster.fields import is_secret_property

SPARK_CATALOG_IMPL = "org.apache.iceberg.spark.SparkCatalog"
# "rest" and "sql" are tested (a REST server over HTTP; pyiceberg SqlCatalog + Iceberg's JdbcCatalog on one
# database); hive and glue are known to both pyiceberg and Iceberg's Spark catalog and passed through unchanged.
CATALOG_TYPES = ("sql", "rest", "hive", "glue")


def with_password(uri: str, catalog_type: str, password: str | None) -> str:
    """A SQL catalog's SQLAlchemy URL with its password (kept out of the file and the resources' config
    until now); any other catalog's URI unchanged."""
    if catalog_type != "sql" or not password:
        return uri
    return make_url(uri).set(password=password).render_as_string(hide_password=False)


@dataclass(frozen=True)
class CatalogSettings:
    """``uri`` is a REST catalog's base URL, or for ``sql`` a SQLAlchemy URL: ``sqlite:////abs/catalog.db``
    or ``postgresql+psycopg2://user@host/db``. ``warehouse`` is None when a REST catalog needs none.
    ``properties`` may hold secrets (a token): kept out of ``repr``."""

    name: str
    uri: str
    warehouse: str | None
    properties: dict[str, str] = field(default_factory=dict, repr=False)
    type: str = "sql"

    def check(self) -> None:
        """A ConfigError now rather than at the first run (a database pyiceberg and Spark cannot share).

        Raises:
            ConfigError: an unknown catalog type, a sql catalog without a warehouse or on a database other
                than SQLite (a file) or PostgreSQL, a rest catalog whose uri is not an http(s) URL.
        """
        if self.type not in CATALOG_TYPES:
            raise ConfigError(f"catalog.type: unknown catalog type {self.type!r} (one of {', '.join(CATALOG_TYPES)})")
        if self.type == "sql":
            if not self.warehouse:
                raise ConfigError("catalog.warehouse: a sql catalog needs a warehouse (where table files go)")
            self.jdbc_url()
        if self.type == "rest" and not self.uri.startswith(("http://", "https://")):
            raise ConfigError(f"catalog.uri: a rest catalog's uri is its base URL (http://host:8181), "
                              f"not {self.uri!r}")

    @cached_property
    def backend(self) -> str | None:
        """The SQL database of a ``sql`` catalog (sqlite, postgresql); None for other catalog types."""
        if self.type != "sql":
            return None
        backend = make_url(self.uri).get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise ConfigError(f"catalog.uri: unsupported catalog database {backend!r} "
                              "(use sqlite:///... or postgresql+psycopg2://...)")
        return backend

    def jdbc_url(self) -> str:
        url = make_url(self.uri)
        if self.backend == "sqlite":
            if not url.database or url.database == ":memory:":
                raise ConfigError("catalog.uri: an in-memory SQLite catalog cannot be shared with Spark")
            return f"jdbc:sqlite:{url.database}"
        host = url.host or "127.0.0.1"
        port = url.port or 5432
        return f"jdbc:postgresql://{host}:{port}/{url.database}"

    def pyiceberg_properties(self) -> dict[str, str]:
        warehouse = {"warehouse": self.warehouse} if self.warehouse else {}
        return {"type": self.type, "uri": self.uri, **warehouse, **self.properties}

    def spark_conf(self) -> dict[str, str]:
        prefix = f"spark.sql.catalog.{self.name}"
        if self.type != "sql":
            # Spark must not cache table metadata, or it misses pyiceberg's commits.
            conf = {prefix: SPARK_CATALOG_IMPL, f"{prefix}.type": self.type, f"{prefix}.uri": self.uri,
                    f"{prefix}.cache-enabled": "false"}
            if self.warehouse:
                conf[f"{prefix}.warehouse"] = self.warehouse
            return {**conf, **{f"{prefix}.{k}": str(v) for k, v in self.properties.items()}}
        conf = {
            prefix: SPARK_CATALOG_IMPL,
            f"{prefix}.type": "jdbc",
            f"{prefix}.uri": self.jdbc_url(),
            f"{prefix}.warehouse": self.warehouse or "",
            # Spark must not cache table metadata, or it misses pyiceberg's commits.
            f"{prefix}.cache-enabled": "false",
            f"{prefix}.jdbc.schema-version": "V1",
        }
        if self.backend == "sqlite":
            # Iceberg's start-up table check leaves a SQLite read lock open; pyiceberg
            # creates the catalog tables instead (load_pyiceberg runs first).
            conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
        url = make_url(self.uri)
        if url.username:
            conf[f"{prefix}.jdbc.user"] = url.username
        if url.password:
            conf[f"{prefix}.jdbc.password"] = url.password
        for key, value in self.properties.items():
            conf[f"{prefix}.{key}"] = str(value)
        return conf

    @property
    def address(self) -> str | None:
        """``host:port`` of a catalog reached over the network (REST, PostgreSQL); None for a SQLite file."""
        if self.type == "sql":
            url = make_url(self.uri)
            return f"{url.host or '127.0.0.1'}:{url.port or 5432}" if self.backend == "postgresql" else None
        parts = urlsplit(self.uri)
        return parts.netloc.rsplit("@", 1)[-1] or None

    def load_pyiceberg(self) -> Any:
        """The pyiceberg catalog (creates the catalog tables when missing).

        Raises:
            AccessRefusedError: the catalog refused its credential, token or password (names the catalog
                and the setting; terminal).
            ConfigError: a sql catalog's uri names a database other than SQLite or PostgreSQL.
            CatalogUnavailableError: the catalog did not answer (names it; transient).
            sqlalchemy.exc.OperationalError: a sql catalog's database cannot be opened (or its tables made).
            pyiceberg.exceptions.RESTError: a REST catalog refused the connection otherwise.
        """
        try:
            return self._load_pyiceberg()
        except Exception as exc:
            failure = self.refusal(exc)
            if failure is not None:
                raise failure from None  # the client's exception may quote its request: not chained
            unanswered = catalog_failure(exc, self)
            if unanswered is None:
                raise
            raise unanswered from exc

    def _load_pyiceberg(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog  # pyiceberg.catalog: ~2.4 s; only a pyiceberg load pays it

        if self.type != "sql":
            from pyiceberg.catalog import load_catalog  # pyiceberg.catalog: ~2.4 s; only a pyiceberg load pays it

            return load_catalog(self.name, **self.pyiceberg_properties())
        if self.backend == "sqlite":
            Path(make_url(self.uri).database or ".").parent.mkdir(parents=True, exist_ok=True)
        return SqlCatalog(self.name, **self.pyiceberg_properties())

    def where(self) -> str:
        """The catalog as an error names it: its name and server, never a password."""
        if self.type == "sql":
            url = make_url(self.uri)
            return f"catalog {self.name!r} ({url.get_backend_name()} {url.host or ''}:{url.port or ''}/{url.database})"
        return f"catalog {self.name!r} ({self.uri})"

    def refusal(self, exc: BaseException) -> AccessRefusedError | None:
        """``exc`` as the catalog refusing a secret (None: it is something else): which setting, and the
        server's reason with every secret value of these settings blanked out."""
        if isinstance(exc, OAuthError):
            setting = "catalog.properties.credential"
        elif isinstance(exc, UnauthorizedError | ForbiddenError):
            setting = "catalog.properties.token" if "token" in self.properties else "catalog.properties.credential"
        elif type(exc).__name__ == "OperationalError" and any(
                text in str(exc) for text in ("password authentication failed", "no password supplied")):
            setting = "catalog.password"
        else:
            return None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for secret in self.secrets():
            reason = reason.replace(secret, "***")
        return AccessRefusedError(f"{self.where()} refused {setting} ({type(exc).__name__}: {reason[:200]}); "
                                  f"its value is not shown")

    def secrets(self) -> list[str]:
        """The values an error must never show: the database password and every property that is a secret."""
        found = [make_url(self.uri).password] if self.type == "sql" else []
        found += [v for k, v in self.properties.items() if is_secret_property(k)]
        return [str(v) for v in found if v]

# What a catalog that did not answer looks like, from pyiceberg (requests), Iceberg's Java REST client
# (Apache HttpClient 5, through Py4J) and the PostgreSQL drivers (psycopg2, pgjdbc).
_UNANSWERED = ("Connection refused", "ConnectException", "HttpHostConnectException", "NoHttpResponseException",
               "SocketTimeoutException", "Connect timed out", "Read timed out", "Connection reset",
               "Max retries exceeded", "RemoteDisconnected", "ConnectionError", "could not connect to server",
               "ServiceUnavailableException", "ServiceFailureException", "BadGatewayException",
               "the database system is starting up", "server closed the connection unexpectedly")
# What refused credentials look like (REST 401/403 from either engine; a database password or user refused).
_REFUSED = ("NotAuthorizedException", "ForbiddenException", "UnauthorizedError", "ForbiddenError",
            "OAuthError", "password authentication failed", "no password supplied", "authentication failed")


def catalog_failure(exc: BaseException, catalog: CatalogSettings, attributed: bool = True) -> IcecdcError | None:
    """``exc`` as a catalog failure naming ``catalog``: refused credentials (``AccessRefusedError``, terminal) or
    no answer (``CatalogUnavailableError``, transient);
    None when it is neither. ``attributed`` False: ``exc`` may come from another catalog too, so a missing
    answer counts only when the text names this catalog's address (credentials are then never judged)."""
    text = f"{type(exc).__name__}: {exc}"
    if attributed and any(marker in text for marker in _REFUSED):
        reason = _cause(text, _REFUSED)
        for secret in catalog.secrets():
            reason = reason.replace(secret, "***")
        return AccessRefusedError(f"{catalog.where()} refused its credentials ({reason}): fix the token, "
                                  f"credential or password of catalog {catalog.name!r} in the pipeline file; "
                                  f"its value is not shown")
    if any(marker in text for marker in _UNANSWERED):
        if not attributed and (catalog.address is None or catalog.address not in text):
            return None
        return CatalogUnavailableError(f"{catalog.where()} did not answer ({_cause(text, _UNANSWERED)}); the "
                                       f"batch is retried with backoff until it answers")
    return None


def settings_of(catalog: Any, name: str) -> CatalogSettings:
    """What messages need (name, type, URI) of a loaded pyiceberg catalog (Spark name ``name``)."""
    properties = {str(k): str(v) for k, v in (getattr(catalog, "properties", None) or {}).items()}
    return CatalogSettings(name, properties.pop("uri", ""), properties.pop("warehouse", None), properties,
                           type=properties.pop("type", "sql"))


@contextmanager
def catalog_errors(catalog: CatalogSettings, attributed: bool = True) -> Iterator[None]:
    """Raise a failure of ``catalog`` (:func:`catalog_failure`) as ours, naming it; anything else unchanged.

    Raises:
        CatalogUnavailableError: the catalog did not answer.
        AccessRefusedError: the catalog refused the credentials.
    """
    try:
        yield
    except IcecdcError:
        raise
    except Exception as exc:
        failure = catalog_failure(exc, catalog, attributed)
        if failure is None:
            raise
        raise failure from exc


def _cause(text: str, markers: tuple[str, ...]) -> str:
    """The line of ``text`` that says what happened (a Py4J error's first line only names the call)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((line for line in lines if any(marker in line for marker in markers)), lines[0] if lines else "")
    return found.removeprefix(": ")[:300]
