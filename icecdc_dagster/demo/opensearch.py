"""The demo's OpenSearch index: the headline sink, in a cluster the user names or one the demo starts.

Without ``--opensearch-url`` the demo starts an OpenSearch-compatible server of its own: ``osmem-server``
(PyPI, in the ``demo`` and ``test`` extras; the server the tests use), in memory, on a free port, for as
long as the demo runs. The index is compared with the source (documents = rows) before the demo ends; then
the server stops and the index is gone. The instance keeps the index asset's batches (``dagster dev``
shows them) and the pipeline file still names the server, so a later ``icecdc sync`` on the demo cannot
reach it (its OpenSearch step fails to connect): the file says why at its top, and the demo at its end.
"""

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

INDEX = "demo-orders"


@dataclass(frozen=True)
class DemoCluster:
    """Where the demo's index lives, and what becomes of it when the demo ends (said to the user)."""

    url: str | None      # None: no OpenSearch half (no server to start, none named)
    fate: str


@contextmanager
def demo_cluster(url: str | None) -> Iterator[DemoCluster]:
    """The cluster named by ``url``, else a server started for the demo and stopped when it ends."""
    if url:
        yield DemoCluster(url, f"the OpenSearch index {INDEX} stays in {url}; `icecdc sync` keeps it in step")
        return
    try:
        from osmem_server import OsmemServer  # optional: the demo extra (a user's cluster needs none)
    except ImportError:
        yield DemoCluster(None, "no OpenSearch index: pass --opensearch-url URL, or install the demo extra "
                                "(pip install 'icecdc-dagster[demo]': an OpenSearch-compatible server the demo starts)")
        return
    server = OsmemServer.start(japanese=False)
    try:
        yield DemoCluster(server.url, (
            f"the OpenSearch index {INDEX} lived in an in-memory OpenSearch-compatible server (osmem-server) that "
            f"this demo started at {server.url}; it stopped with the demo, and the index with it. `dagster dev` "
            f"still shows the index asset and its batches; `icecdc sync` on this demo cannot reach {server.url} "
            f"any more (run `icecdc demo --opensearch-url URL` to keep the index in a cluster)"))
    finally:
        server.close()


def document_count(url: str) -> int:
    """Documents in the demo's index (refreshed first: what a search sees)."""
    from opensearchpy import OpenSearch  # only when the demo has an index to count

    client = OpenSearch(hosts=[url], verify_certs=False, ssl_show_warn=False)
    try:
        client.indices.refresh(index=INDEX)
        return int(client.count(index=INDEX)["count"])
    finally:
        client.close()


def config_header(cluster: DemoCluster) -> str:
    """The pipeline file's first lines: where its OpenSearch sink points, and for how long."""
    if cluster.url is None:
        return ""
    return "".join(f"# {line}\n" for line in _wrap(f"Written by `icecdc demo`: {cluster.fate}."))


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, 100)
