"""The newcomer's command, small: ``bulk-recorder demo`` both ways must pass its own checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import pytest

from tests.conftest import settings_env

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@pytest.mark.parametrize("via", ["queue", "api"])
async def test_demo_passes_its_checks(make_settings, broker, via: str) -> None:
    env = settings_env(make_settings(metrics_port=0))
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "consumer.cli", "demo", "--count", "3000", "--via", via],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its recorder, relay and API share the group: killed together
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 300)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    text = out.decode()
    assert proc.returncode == 0, text
    assert "FAIL" not in text
    assert text.count("check            OK") >= 4, text
    if via == "queue":  # what the demo tunes in its recorder, it says
        assert "recorder settings: " in text, text
    if via == "api":  # the demo makes a key of its own; without it an upload is refused
        assert "check            OK   an upload without an API key is refused (401)" in text
        assert "brk_" not in text.replace("(brk_", ""), text  # only the key's prefix is shown
