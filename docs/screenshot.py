"""Regenerate docs/replica-asset-page.png: the replica's asset page in the Dagster UI after `icecdc demo`.

Runs the demo into a temporary directory, starts `dagster dev` on it, and takes a screenshot of
the replica asset's page with headless Chromium (Debian: `apt-get install chromium`). A one-off
documentation artefact, not part of the test run.

Usage: .venv/bin/python docs/screenshot.py [--out docs/replica-asset-page.png]
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ASSET_PATH = "replica/demo_replica/orders"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(Path(__file__).parent / "replica-asset-page.png"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    demo = Path(tempfile.mkdtemp(prefix="icecdc-shot-")) / "demo"
    subprocess.run([str(bin_dir / "icecdc"), "demo", "--dir", str(demo)], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    nux = demo / "dagster_home" / ".nux"   # Dagster's "community" welcome dialog was seen: no overlay
    nux.mkdir(parents=True, exist_ok=True)
    (nux / "nux.yaml").write_text("seen: 1\n")
    env = {**os.environ, "DAGSTER_HOME": str(demo / "dagster_home"), "ICECDC_CONFIG": str(demo / "icecdc.yaml")}
    server = subprocess.Popen([str(bin_dir / "dagster"), "dev", "-m", "icecdc_dagster.definitions", "-h", "127.0.0.1",
                               "-p", str(port)], env=env, cwd=demo, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/server_info", 180)
        url = f"http://127.0.0.1:{port}/assets/{ASSET_PATH}?view=overview"
        subprocess.run([args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1500,1400", "--virtual-time-budget=30000", f"--screenshot={args.out}", url],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
        print(f"wrote {args.out} ({url})")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
