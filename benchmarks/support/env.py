"""Where the benchmarks run: service URLs, unique names, uvloop, the common CLI arguments."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def database_url() -> str:
    """Maintenance DSN of the server to benchmark (``DATABASE_URL`` overrides the default)."""
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


def rabbitmq_url() -> str:
    return os.environ.get("RABBITMQ_URL", DEFAULT_RABBITMQ_URL)


def unique(prefix: str) -> str:
    """A name no other run uses: ``prefix_<pid>_<random>``."""
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"


def use_uvloop() -> None:
    """Run benchmarks on uvloop, as the recorder does."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def add_recorder_arguments(parser: argparse.ArgumentParser) -> None:
    """The recorder settings a benchmark run uses (the service's defaults)."""
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--size", type=int, default=0)
    parser.add_argument("--timeout-ms", type=int, default=100)


def run_main(
    parser: argparse.ArgumentParser,
    main_async: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
) -> None:
    """Parse the command line and run the benchmark on uvloop."""
    args = parser.parse_args()
    use_uvloop()
    asyncio.run(main_async(args))
