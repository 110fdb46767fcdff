"""A mutant's pytest, forked from a server that has already imported pytest and the libraries
every conftest imports, instead of a new interpreter that imports them again.

A new ``python -m pytest`` spends about 1 CPU-s before its first test (pytest, pydantic,
aio-pika, asyncpg, httpx, prometheus-client), and ``make mutants`` starts one for each of its
340-odd parts on two cores. Forked from :data:`PRELOAD`'s server (multiprocessing's forkserver:
one thread, so a fork is safe), the same run spends about half of that.

Nothing of this project is in the server: the tests, ``bulk_recorder``, ``consumer`` and
``settings`` are imported by the child, from the scratch copy, as a new interpreter would (the
child leaves the server's ``tests`` package, which only brought this module, and puts the
scratch copy first on ``sys.path``). pytest's plugins are not preloaded either: pytest rewrites
their asserts, which it can only do as it imports them.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path

# Third-party modules only, none of them a pytest plugin (tests/unit/test_mutants.py).
PRELOAD = (
    "pytest",
    "_pytest.assertion.rewrite",
    "pydantic",
    "pydantic_settings",
    "aio_pika",
    "asyncpg",
    "httpx",
    "prometheus_client",
    "uvloop",
)
OURS = ("tests", "bulk_recorder", "consumer", "settings")

_context: ForkServerContext | None = None


def context() -> ForkServerContext:
    """The forkserver context, its server preloading :data:`PRELOAD` (started on first use)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _context = ctx
    return _context


def run(
    scratch: Path,
    arguments: Sequence[str],
    log: Path,
    env: Mapping[str, str],
    timeout: float,
) -> int:
    """pytest ``arguments`` in ``scratch`` with ``env``, its output appended to ``log``: its
    exit status, or -1 when it outlived ``timeout`` seconds (it is then SIGKILLed, as
    ``subprocess.run`` kills a child that outlives its timeout)."""
    child = context().Process(
        target=_pytest_in, args=(str(scratch), list(arguments), str(log), dict(env))
    )
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return -1
    code = child.exitcode
    assert code is not None
    return code


def _pytest_in(scratch: str, arguments: list[str], log: str, env: dict[str, str]) -> None:
    """In the forked child: become ``python -m pytest arguments`` started in ``scratch``."""
    for name in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[name]  # only the tests package (this module's), never the service's
    os.chdir(scratch)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # `python -m` puts the working directory first, then PYTHONPATH (the scratch copy too);
    # the server's path began with the directory the runner was started from.
    sys.path[:] = [scratch, *[p for p in sys.path if p not in ("", os.getcwd(), _repo())]]
    sys.argv = ["pytest", *arguments]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import pytest

    try:
        code = int(pytest.main(arguments))
    finally:
        atexit._run_exitfuncs()  # what an interpreter's exit runs; the fork ends in os._exit
    sys.exit(code)


def _repo() -> str:
    return str(Path(__file__).resolve().parents[2])
