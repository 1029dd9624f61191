"""Test-only servers that CHECK a secret, for the secrets-from-the-environment tests (issue #47).

- :class:`BasicAuthTlsProxy`: osmem-server speaks plain HTTP without authentication, so this reverse proxy
  in front of it serves HTTPS (a self-signed certificate made with ``openssl``) and refuses any request
  whose basic-auth user/password is not the expected one (401). It records every password it was sent.
- :func:`scram_postgres`: a throwaway PostgreSQL cluster (``initdb --auth=scram-sha-256`` in a temporary
  folder, ``pg_ctl start`` on a free port, stopped after), run as the ``postgres`` user because initdb
  refuses root, with one role that needs a password.
"""

import base64
import contextlib
import glob
import http.client
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1 / localhost: the certificate is also the CA file a client trusts."""
    cert, key = folder / "proxy.crt", folder / "proxy.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@dataclass
class BasicAuthTlsProxy:
    """HTTPS + basic auth in front of ``upstream`` (an http:// URL); :attr:`url` is https://127.0.0.1:port.

    ``tls=False`` and no ``password``: a plain recording proxy (what a server received, e.g. the REST
    catalog's token requests and bearer headers). Every request is kept in :attr:`requests` (its request
    line, headers and body, as text)."""

    upstream: str
    username: str | None
    password: str | None
    folder: Path
    tls: bool = True
    received: list[str] = field(default_factory=list)  # every password a request carried, in order
    requests: list[str] = field(default_factory=list)
    refused: int = 0

    def __post_init__(self) -> None:
        self.ca_certs, key = self_signed_certificate(self.folder) if self.tls else (None, None)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                body = _read_body(self)
                proxy.requests.append(f"{self.requestline}\n{self.headers}\n{(body or b'').decode('latin-1')}")
                user, password = _basic_auth(self.headers.get("Authorization"))
                proxy.received.append(password or "")
                if proxy.password is not None and (user, password) != (proxy.username, proxy.password):
                    proxy.refused += 1
                    payload = b'{"error":{"type":"security_exception","reason":"unauthorized"},"status":401}'
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                target = urlsplit(proxy.upstream)
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
                dropped = ("host", "transfer-encoding", "content-length", "expect") + (
                    ("authorization",) if proxy.password is not None else ())
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    payload = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.ca_certs, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="tls-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """A request's body, by Content-Length or chunked (Java's HTTP client may send either)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                handler.rfile.readline()
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else None


def _basic_auth(header: str | None) -> tuple[str | None, str | None]:
    if not header or not header.startswith("Basic "):
        return None, None
    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    return user, password


@dataclass
class ScramPostgres:
    """A running throwaway cluster: ``role`` logs in with ``password`` (scram-sha-256) to ``database``."""

    port: int
    role: str
    password: str
    database: str
    folder: Path

    def url(self, with_password: bool = False) -> str:
        secret = f":{self.password}" if with_password else ""
        return f"postgresql+psycopg2://{self.role}{secret}@127.0.0.1:{self.port}/{self.database}"


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1]).parent


def _as_postgres(args: list[str]) -> list[str]:
    """initdb and the server refuse to run as root: run them as the ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextlib.contextmanager
def scram_postgres(role: str, password: str, database: str = "lake") -> Iterator[ScramPostgres]:
    """A PostgreSQL cluster of its own, password authentication (scram-sha-256) for every connection."""
    binaries = _postgres_bin()
    folder = Path(tempfile.mkdtemp(prefix="icecdc-scram-pg-"))
    data, port = folder / "data", free_port()
    superuser_password = folder / "superuser.pw"
    superuser_password.write_text("postgres-superuser\n")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        shutil.chown(superuser_password, "postgres")
    superuser_password.chmod(0o600)
    subprocess.run(_as_postgres([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
                                 f"--pwfile={superuser_password}", "-E", "UTF8"]), check=True, capture_output=True)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"),
                                 "-o", options, "-w", "start"]), check=True, capture_output=True)
    try:
        import psycopg2

        admin = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", password="postgres-superuser",
                                 dbname="postgres")
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {role} LOGIN PASSWORD %s", (password,))
            cursor.execute(f"CREATE DATABASE {database} OWNER {role}")
        admin.close()
        yield ScramPostgres(port, role, password, database, folder)
    finally:
        subprocess.run(_as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
