"""Blocking waits for the rigs (the tests' async ``wait_for`` lives in tests/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.3) -> T:
    """Call ``check`` until it returns neither None nor False; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not met within {timeout} s")
        time.sleep(interval)
