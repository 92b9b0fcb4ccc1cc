"""A real `cdt serve` app (uvicorn in a subprocess, 127.0.0.1, a free port) for the benchmarks."""

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


@contextlib.contextmanager
def running_server(
    models_dir: Path,
    app: str = SERVICE_APP,
    redis_url: str | None = None,
) -> Iterator[str]:
    """Run uvicorn in a subprocess on a free port; yields its URL once `/readyz` answers.

    With `redis_url`, two workers share episodes through Redis (the scale-out path). Any other
    `app` is a plain ASGI app (no factory, no lifespan).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "CDT_MODELS_DIR": str(models_dir)}
    env.pop("CDT_REDIS_URL", None)
    command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--log-level", "warning"]
    if redis_url is not None:
        env |= {"CDT_REDIS_URL": redis_url, "CDT_REDIS_PREFIX": f"bench-{port}"}
        command += ["--workers", "2"]
    command += ["--factory"] if app == SERVICE_APP else ["--lifespan", "off"]
    server = subprocess.Popen(command, env=env, cwd=Path(__file__).resolve().parents[1])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
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
