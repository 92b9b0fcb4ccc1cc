"""The service as `cdt serve` runs it (a subprocess, 127.0.0.1, a free port), for the benchmarks."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

SERVICE_APP = "service.main:create_app"
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def running_server(
    models_dir: Path,
    app: str = SERVICE_APP,
    redis_url: str | None = None,
    log: Path | None = None,
) -> Iterator[str]:
    """Run the service as `cdt serve` runs it (its HTTP and websocket guards included), or any
    other `app` as a plain ASGI app under uvicorn (no factory, no lifespan), in a subprocess on a
    free port; yields its URL once `/readyz` answers.

    With `redis_url`, two workers share episodes through Redis (the scale-out path). With `log`,
    the server's output goes to that file (else to this process's).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "CDT_LEDGER": "off"}
    for name in ("CDT_REDIS_URL", "CDT_API_TOKENS"):  # a local, open, in-memory server
        env.pop(name, None)
    if app == SERVICE_APP:
        command = [sys.executable, str(ROOT / "cdt_cli.py"), "serve", "--port", str(port)]
        command += ["--models-dir", str(models_dir), "--log-level", "warning"]
        if redis_url is not None:
            env["CDT_REDIS_PREFIX"] = f"bench-{port}"
            command += ["--workers", "2", "--redis-url", redis_url]
    else:
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
        command += ["--log-level", "warning", "--lifespan", "off"]
    with contextlib.ExitStack() as files:
        sink = None if log is None else files.enter_context(log.open("wb"))
        server = subprocess.Popen(command, env=env, cwd=ROOT, stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError("the server exited before it was ready") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not become ready")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """`--models`, `--models-dir` and `--server`, as the outside benchmarks take them."""
    parser.add_argument("--models", nargs="+", required=True, help="model names to drive")
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--server", help="a running service (default: start one here)")


def service_url(args: argparse.Namespace) -> contextlib.AbstractContextManager[str]:
    """The running service `--server` names, or one started here on `--models-dir`."""
    if args.server is None:
        return running_server(args.models_dir)
    return contextlib.nullcontext(args.server.rstrip("/"))
