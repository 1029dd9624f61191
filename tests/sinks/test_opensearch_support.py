"""Helpers for the OpenSearch sink tests (no tests here): event frames, a cuttable TCP proxy, index reads."""

import socket
import threading
from typing import Any

from opensearchpy import OpenSearch, helpers

from icecdc_dagster import batch as b
from icecdc_dagster.batch import BatchInfo
from icecdc_dagster.changelog.events import ICEBERG_SNAPSHOT_OPERATION

CHANGE_DDL = (f"{b.CHANGE_TYPE} string, {b.COMMIT_SNAPSHOT_ID} long, {b.COMMIT_SEQUENCE_NUMBER} long, "
              f"{b.CHANGE_ORDINAL} int, {b.ICEBERG_OPERATION} string, {ICEBERG_SNAPSHOT_OPERATION} string, "
              f"{b.ICEBERG_TABLE_NAME} string, "
              f"{b.ICEBERG_SNAPSHOT_ID} long, {b.DOCUMENT_ID} string, {b.BULK_ACTION} string")


def events_frame(spark, source_ddl: str, rows: list[tuple], snapshot_id: int, sequence_number: int,
                 table: str = "db.t", key: str | None = "id", operation: str = "overwrite"):
    """CDC events as the changelog engine hands them over: ``rows`` are (change_type, *source values)."""
    names = [part.strip().split(" ")[0] for part in _split_top(source_ddl)]
    out = []
    for change_type, *values in rows:
        record = dict(zip(names, values))
        doc_id = None if key is None else str(record[key])
        action = b.DELETE_ACTION if change_type == b.DELETE else b.INDEX_ACTION
        out.append((*values, change_type, snapshot_id, sequence_number, 0, change_type, operation, table, snapshot_id,
                    doc_id, action))
    return spark.createDataFrame(out, f"{source_ddl}, {CHANGE_DDL}")


def _split_top(ddl: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in ddl:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def batch_info(snapshot_id: int, sequence_number: int, parent: int | None, table: str = "db.t",
               export: bool = False, key: tuple[str, ...] = ("id",)) -> BatchInfo:
    return BatchInfo(table_name=table, snapshot_id=snapshot_id, sequence_number=sequence_number,
                     first_snapshot_id=snapshot_id, accepted_predecessors=() if parent is None else (parent,),
                     operation="append" if export else "overwrite", committed_at_ms=0, is_export=export,
                     identifier_columns=key, snapshot_ids=(snapshot_id,))


def all_documents(url: str, index: str) -> dict[str, dict[str, Any]]:
    client = OpenSearch(hosts=[url])
    client.indices.refresh(index=index)
    docs = {hit["_id"]: hit["_source"] for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}})}
    client.close()
    return docs


def document_versions(url: str, index: str, ids: list[str]) -> dict[str, int]:
    client = OpenSearch(hosts=[url])
    found = client.mget(index=index, body={"ids": ids})["docs"]
    client.close()
    return {d["_id"]: d["_version"] for d in found if d.get("found")}


class CuttableProxy:
    """A TCP forwarder in front of the server that 'stops the server' at the N-th bulk request.

    When cut, it closes every open connection and its listening port, so the
    client sees resets then refused connections, as when a node dies.
    ``restart()`` listens again on the same port.
    """

    def __init__(self, upstream_url: str, cut_at_bulk: int | None = None, throttle_bulks: int = 0) -> None:
        host_port = upstream_url.split("://", 1)[1].rstrip("/")
        host, port = host_port.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cut_at_bulk = cut_at_bulk
        # The first ``throttle_bulks`` bulk requests are answered 429 by the proxy itself.
        self.throttle_bulks = throttle_bulks
        self.throttled = 0
        self.bulk_requests = 0
        self.sent: list[bytearray] = []   # what clients sent, one stream per connection (see ``requests``)
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def restart(self) -> None:
        self.cut_at_bulk = None
        self.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, upstream]
            stream = bytearray()
            with self._lock:
                self.sent.append(stream)
            threading.Thread(target=self._pump, args=(client, upstream, True, stream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool, stream: bytearray | None = None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if stream is not None:
                stream += data
            if from_client and data and b"POST /_bulk" in data and self.throttled < self.throttle_bulks:
                self.throttled += 1
                self._answer_429(src, dst, data)
                return
            if from_client and data:
                with self._lock:
                    self.bulk_requests += data.count(b"POST /_bulk")
                    cut = self.cut_at_bulk is not None and self.bulk_requests >= self.cut_at_bulk
                if cut:
                    self.stop()
                    return
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def requests(self, path: str) -> list[bytes]:
        """The bodies of the requests clients sent through the proxy to ``path`` (e.g. ``/_aliases``), in the
        order each connection sent them (HTTP/1.1, Content-Length bodies: what opensearch-py sends)."""
        bodies = []
        with self._lock:
            streams = [bytes(stream) for stream in self.sent]
        for stream in streams:
            while b"\r\n\r\n" in stream:
                head, rest = stream.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith(b"content-length:")), 0)
                target = lines[0].split(b" ")[1].split(b"?")[0].decode()
                if target == path:
                    bodies.append(rest[:length])
                stream = rest[length:]
        return bodies

    @staticmethod
    def _answer_429(client: socket.socket, upstream: socket.socket, data: bytes) -> None:
        """Read the whole request, answer 429 like an overloaded node, close the connection."""
        while b"\r\n\r\n" not in data:
            data += client.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += client.recv(65536)
        payload = (b'{"error":{"type":"es_rejected_execution_exception","reason":"rejected by test proxy"},'
                   b'"status":429}')
        client.sendall(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n"
                       + payload)
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        if listener is not None:
            listener.close()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def live_mappings(url: str, alias: str) -> dict[str, Any]:
    """The mappings of the one index version the alias names."""
    client = OpenSearch(hosts=[url])
    found = client.indices.get_mapping(index=alias)
    client.close()
    assert len(found) == 1, found
    return next(iter(found.values()))["mappings"]
