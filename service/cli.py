"""`cdt serve`: run the policy service with uvicorn.

The options are turned into `CDT_*` environment variables and uvicorn runs
`service.main:create_app --factory`, so every worker process builds the same `Settings` and
`cdt serve` behaves exactly like `uvicorn service.main:create_app --factory` with that env.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import uvicorn

from service.config import Settings


def build_parser() -> argparse.ArgumentParser:
    """The `cdt serve` options; unset ones fall back to `CDT_*` variables and `Settings`."""
    parser = argparse.ArgumentParser(
        prog="cdt serve", description="Serve the model repository over REST and websocket."
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="bind port (default 8000)")
    parser.add_argument("--models-dir", type=Path, help="model repository (default models/)")
    parser.add_argument("--workers", type=int, default=1, help="processes; >1 needs --redis-url")
    parser.add_argument("--redis-url", help="session store, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--episode-ttl", type=float, help="idle episode expiry in seconds")
    parser.add_argument("--max-episodes", type=int, help="cap on live episodes")
    parser.add_argument(
        "--api-token", action="append", help="accepted bearer token (repeat for several)"
    )
    parser.add_argument("--intra-op-threads", type=int, help="onnxruntime threads per pass")
    parser.add_argument(
        "--batching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="micro-batch concurrent forward passes (off by default: it did not pay on 2 cores)",
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
        "CDT_BATCHING": None if args.batching is None else str(args.batching).lower(),
    }
    return {name: str(value) for name, value in values.items() if value is not None}


def main(argv: list[str] | None = None) -> None:
    """Parse `cdt serve` options and run uvicorn until interrupted."""
    args = build_parser().parse_args(argv)
    os.environ.update(settings_environment(args))
    settings = Settings()  # validate the options here, before any worker starts
    if args.workers > 1 and not settings.redis_url:
        raise SystemExit("cdt serve: --workers > 1 needs --redis-url (episodes must be shared)")
    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=args.access_log,
        ws_max_size=settings.max_body_bytes,
    )


if __name__ == "__main__":
    main()
