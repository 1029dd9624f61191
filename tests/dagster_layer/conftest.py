"""Fixtures of the Dagster-layer tests: a real (temporary, persistent) Dagster instance, and a TCP
proxy in front of the OpenSearch-compatible server that a test can cut and restore."""

import pytest
from dagster import instance_for_test

from tests.helpers import TcpProxy


@pytest.fixture
def instance():
    with instance_for_test() as dagster_instance:
        yield dagster_instance


@pytest.fixture
def proxy(opensearch_url):
    host, port = opensearch_url.removeprefix("http://").split(":")
    forwarder = TcpProxy(host, int(port))
    yield forwarder
    forwarder.close()
