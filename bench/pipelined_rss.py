"""Server memory while one socket pipelines requests without reading the answers (issue 30).

    python bench/pipelined_rss.py                   # 300,000 `GET /livez` on one socket
    python bench/pipelined_rss.py --requests 50000

Starts `cdt serve` (the guarded protocols, an empty model folder: `--allow-empty`) on 127.0.0.1
in a subprocess, sends the requests on one socket and never reads an answer, and prints the
server's RSS before, once the sends block (or all are sent) and after the socket closes.
Linux only (it reads /proc). Every wait is bounded; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REQUEST = b"GET /livez HTTP/1.1\r\nHost: bench\r\n\r\n"


def rss_mb(pid: int) -> float:
    """Resident set size of process `pid`, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def send_without_reading(port: int, requests: int, block_s: float) -> int:
    """Pipeline `requests` on one socket until all are sent or a send blocks `block_s`; the
    number sent. The socket closes one second later."""
    data = memoryview(REQUEST * requests)
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.settimeout(block_s)
        try:
            while sent < len(data):
                sent += connection.send(data[sent : sent + 65536])
        except TimeoutError:
            pass  # the server stopped reading: the client's sends block
        time.sleep(1.0)  # let the server settle before the RSS is read
        return sent // len(REQUEST)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300_000)
    parser.add_argument("--block-s", type=float, default=10.0, help="a send blocked this long ends")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as models_dir:
        command = [sys.executable, "-m", "service.cli", "--port", str(port), "--allow-empty"]
        command += ["--models-dir", models_dir, "--log-level", "warning"]
        server = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1])
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            before = rss_mb(server.pid)
            began = time.monotonic()
            sent = send_without_reading(port, args.requests, args.block_s)
            loaded = rss_mb(server.pid)
            seconds = time.monotonic() - began
            time.sleep(2.0)
            print(f"requests sent {sent:,} of {args.requests:,} in {seconds:.1f} s")
            print(f"server RSS MB: before {before:.0f}, loaded {loaded:.0f}, ", end="")
            print(f"after close {rss_mb(server.pid):.0f} (+{loaded - before:.0f} loaded)")
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
