"""`dagster dev` starts on a two-table pipeline and its GraphQL API shows assets,
lineage, partitions, sensors and checks (what the UI renders)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dagster import DagsterInstance

from tests.test_definitions import two_table_config  # noqa: F401 - fixture

QUERY = """
{
  assetNodes {
    assetKey { path }
    groupName
    kinds
    dependencyKeys { path }
    isPartitioned
    partitionDefinition { name type }
    partitionKeys
    assetChecksOrError { __typename ... on AssetChecks { checks { name } } }
  }
  repositoriesOrError { ... on RepositoryConnection { nodes { name sensors { name minIntervalSeconds } } } }
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_dagster_dev_shows_assets_lineage_partitions_and_checks(two_table_config, tmp_path):  # noqa: F811
    home = tmp_path / "dagster_home"
    home.mkdir()
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        DagsterInstance.get().add_dynamic_partitions("snapshots__db_orders", ["101", "102"])
    finally:
        del os.environ["DAGSTER_HOME"]
    port = _free_port()
    env = {**os.environ, "ICECDC_CONFIG": str(two_table_config), "DAGSTER_HOME": str(home),
           "TEST_OS_PASSWORD": "x"}
    dagster = Path(sys.executable).parent / "dagster"
    log = (tmp_path / "dagster_dev.log").open("w")
    process = subprocess.Popen([str(dagster), "dev", "-m", "icecdc_dagster.definitions", "-h", "127.0.0.1",
                                "-p", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        data = None
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "dagster_dev.log").read_text()[-3000:]
            try:
                data = _graphql(port, QUERY)["data"]
                if data["assetNodes"]:
                    break
            except (OSError, KeyError, TypeError):
                pass
            time.sleep(1)
        assert data and data["assetNodes"], "dagster dev did not serve the assets in time"
        nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
        assert {"iceberg/db/orders", "changelog/db/orders_changelog", "opensearch/orders_opensearch", "replica/replica/replica_orders",
                "iceberg/db/customers", "changelog/db/customers_changelog", "replica/replica/replica_customers"} <= set(nodes)
        changelog = nodes["changelog/db/orders_changelog"]
        assert changelog["groupName"] == "db_orders" and {"iceberg", "spark"} <= set(changelog["kinds"])
        assert {"path": ["iceberg", "db", "orders"]} in changelog["dependencyKeys"]
        assert {"path": ["changelog", "db", "orders_changelog"]} in nodes["opensearch/orders_opensearch"]["dependencyKeys"]
        assert changelog["isPartitioned"] and changelog["partitionDefinition"]["type"] == "DYNAMIC"
        assert changelog["partitionKeys"] == ["101", "102"]
        assert nodes["opensearch/orders_opensearch"]["partitionKeys"] == ["101", "102"]
        assert "opensearch" in nodes["opensearch/orders_opensearch"]["kinds"]
        checks = {c["name"] for c in changelog["assetChecksOrError"]["checks"]}
        assert "no_stuck_snapshots" in checks
        sensors = {s["name"]: s for repo in data["repositoriesOrError"]["nodes"] for s in repo["sensors"]}
        assert {"snapshots__db_orders", "snapshots__db_customers"} <= set(sensors)
        # PT5S: the minimum interval is 4 s, so the daemon's 5 s loop ticks the sensor every loop.
        assert sensors["snapshots__db_orders"]["minIntervalSeconds"] == 4
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
