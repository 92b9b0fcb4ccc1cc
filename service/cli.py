"""`cdt serve`: run the policy service with uvicorn.

The options are turned into `CDT_*` environment variables and uvicorn runs
`service.main:create_app --factory`, so every worker process builds the same `Settings` and
`cdt serve` behaves exactly like `uvicorn service.main:create_app --factory` with that env.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from runtime.arguments import CommandParser, positive_int
from runtime.files import CARD_FILE
from service.config import Settings
from service.http_guard import GuardedHTTPProtocol, GuardedWebSocketProtocol


def build_parser() -> argparse.ArgumentParser:
    """The `cdt serve` options; unset ones fall back to `CDT_*` variables and `Settings`."""
    parser = CommandParser(
        prog="cdt serve", description="Serve the model repository over REST and websocket."
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=port, default=8000, help="bind port (default 8000)")
    parser.add_argument("--models-dir", type=Path, help="model repository (default models/)")
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="start even when the models folder holds no model (load them later by reload)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=1, help="processes; >1 needs --redis-url"
    )
    parser.add_argument("--redis-url", help="session store, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--episode-ttl", type=float, help="idle episode expiry in seconds")
    parser.add_argument("--max-episodes", type=int, help="cap on live episodes")
    parser.add_argument(
        "--api-token", action="append", help="accepted bearer token (repeat for several)"
    )
    parser.add_argument("--intra-op-threads", type=int, help="onnxruntime threads per pass")
    parser.add_argument(
        "--header-timeout", type=float, help="seconds a connection has to send a request head"
    )
    parser.add_argument("--keep-alive", type=float, help="idle keep-alive connection timeout (s)")
    parser.add_argument(
        "--body-timeout", type=float, help="seconds a request body has to arrive after its head"
    )
    parser.add_argument(
        "--max-connections", type=int, help="open connections per worker before new ones get 503"
    )
    parser.add_argument(
        "--ws-idle-timeout", type=float, help="seconds a websocket may go without a frame"
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log every request (off by default: one line per step floods the log; "
        "/metrics counts requests)",
    )
    return parser


def settings_environment(args: argparse.Namespace) -> dict[str, str]:
    """The `CDT_*` variables for the options that were given."""
    values = {
        "CDT_MODELS_DIR": args.models_dir,
        "CDT_REDIS_URL": args.redis_url,
        "CDT_EPISODE_TTL_S": args.episode_ttl,
        "CDT_MAX_EPISODES": args.max_episodes,
        "CDT_API_TOKENS": ",".join(args.api_token) if args.api_token else None,
        "CDT_INTRA_OP_THREADS": args.intra_op_threads,
        "CDT_HTTP_HEADER_TIMEOUT_S": args.header_timeout,
        "CDT_HTTP_KEEP_ALIVE_S": args.keep_alive,
        "CDT_HTTP_BODY_TIMEOUT_S": args.body_timeout,
        "CDT_HTTP_MAX_CONNECTIONS": args.max_connections,
        "CDT_WS_IDLE_TIMEOUT_S": args.ws_idle_timeout,
    }
    return {name: str(value) for name, value in values.items() if value is not None}


def load_settings(parser: argparse.ArgumentParser) -> Settings:
    """`Settings` from the environment the options set; exits 2 with one line when invalid."""
    try:
        return Settings()
    except ValidationError as invalid:
        error = invalid.errors()[0]
        name = "_".join(str(part) for part in error["loc"]).upper()
        name = name if name.startswith("CDT_") else f"CDT_{name}"  # an alias is the variable
        parser.exit(2, f"cdt serve: invalid {name}: {error['msg']}\n")


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: any free one)."""
    value = int(text)
    if not 0 <= value <= 65_535:
        raise argparse.ArgumentTypeError(f"must lie in 0-65535, got {value}")
    return value


def bind_problem(host: str, port_number: int) -> str | None:
    """Why (host, port) cannot be bound now, or None: checked before any model is loaded."""
    try:
        with socket.create_server((host, port_number)):
            return None
    except OSError as error:
        return f"cannot listen on {host}:{port_number}: {error.strerror or error}"


def startup_problem(args: argparse.Namespace, settings: Settings) -> str | None:
    """Why the service should not start with these options (one line), or None."""
    if args.workers > 1 and not settings.redis_url:
        return "--workers > 1 needs --redis-url (episodes must be shared)"
    if (problem := bind_problem(args.host, args.port)) is not None:
        return problem
    models_dir = settings.models_dir
    if not models_dir.is_dir():
        return f"models folder {models_dir} does not exist"
    if args.allow_empty or any(models_dir.glob(f"*/{CARD_FILE}")):
        return None
    if (models_dir / CARD_FILE).is_file():
        return (
            f"{models_dir} is one model's folder; point --models-dir at the folder that holds "
            f"it ({models_dir.resolve().parent})"
        )
    return f"{models_dir} holds no model (no */{CARD_FILE}); --allow-empty starts anyway"


def main(argv: list[str] | None = None) -> None:
    """Parse `cdt serve` options, check them and run uvicorn until interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.update(settings_environment(args))
    settings = load_settings(parser)  # checked here, before any worker starts
    problem = startup_problem(args, settings)
    if problem is not None:
        parser.exit(2, f"cdt serve: {problem}\n")
    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        http=GuardedHTTPProtocol,  # the settings' timeouts, connection limit, bounded pipelining
        ws=GuardedWebSocketProtocol,  # a text frame that is not UTF-8 is an ordinary bad frame
        log_level=args.log_level,
        access_log=args.access_log,
        ws_max_size=settings.max_body_bytes,
    )


if __name__ == "__main__":
    main()
