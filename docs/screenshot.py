"""Regenerate docs/replica-asset-page.png, docs/asset-graph.png and docs/runs-timeline.png, docs/ingest-group.png:
the replica's asset page, the asset graph, Overview -> Timeline and the ingest's group (its dead letters) in the
Dagster UI after `icecdc demo`.

Runs the demo into a temporary directory (or uses one: --demo DIR), starts `dagster dev` on it, and
takes the screenshots with headless Chromium (Debian: `apt-get install chromium`). A one-off
documentation artefact, not part of the test run.

Usage: .venv/bin/python docs/screenshot.py [--demo DIR] [--docs docs]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# (file, page): the replica's overview (schema, partitions, lineage), the global asset graph, the demo's runs
# on the timeline, the ingest's group.
SHOTS = [("replica-asset-page.png", "assets/replica/demo_replica/demo_replica_orders?view=overview"),
         ("asset-graph.png", "locations/icecdc_dagster.definitions/asset-groups/demo_orders"),
         ("runs-timeline.png", "overview/activity/timeline"),
         ("ingest-group.png", "locations/icecdc_dagster.definitions/asset-groups/ingest__customers_cdc")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, timeout: float) -> None:
    """Until the webserver serves the assets (``server_info`` answers before the code location has
    loaded; a page opened then waits for it past Chromium's budget)."""
    deadline = time.time() + timeout
    query = json.dumps({"query": "{ assetNodes { id } }"}).encode()
    while time.time() < deadline:
        try:
            request = urllib.request.Request(url, data=query, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                if json.loads(response.read()).get("data", {}).get("assetNodes"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not serve the assets within {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", default=str(Path(__file__).parent), help="where the images are written")
    parser.add_argument("--demo", help="an existing `icecdc demo --dir` directory (default: run the demo)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    demo = Path(args.demo) if args.demo else Path(tempfile.mkdtemp(prefix="icecdc-shot-")) / "demo"
    if not args.demo:
        subprocess.run([str(bin_dir / "icecdc"), "demo", "--dir", str(demo)], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    nux = demo / "dagster_home" / ".nux"   # Dagster's "community" welcome dialog was seen: no overlay
    nux.mkdir(parents=True, exist_ok=True)
    (nux / "nux.yaml").write_text("seen: 1\n")
    env = {**os.environ, "DAGSTER_HOME": str(demo / "dagster_home"), "ICECDC_CONFIG": str(demo / "icecdc.yaml")}
    server = subprocess.Popen([str(bin_dir / "dagster-webserver"), "-m", "icecdc_dagster.definitions",
                               "-h", "127.0.0.1", "-p", str(port)], env=env, cwd=demo, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/graphql", 600)
        for name, page in SHOTS:
            out, url = Path(args.docs) / name, f"http://127.0.0.1:{port}/{page}"
            subprocess.run([args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1400,900", "--virtual-time-budget=15000", f"--screenshot={out}", url],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
            print(f"wrote {out} ({url})")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
