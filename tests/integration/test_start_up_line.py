"""Each role's first log line names the build: version and source revision.

An operator reading one pod's logs, or a support ticket's paste, knows which commit ran. A
one-shot command keeps its output its own (a failure is one line): `--version` says it there.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

import bulk_recorder
from bulk_recorder.build import revision
from tests.conftest import SettingsFactory, free_port, run_cli, settings_env

CLI = str(Path(sys.executable).with_name("bulk-recorder"))


async def _first_line(role: str, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        CLI, role, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        return (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 60)


@pytest.mark.parametrize("role", ["consume", "relay", "api"])
async def test_a_roles_first_line_names_the_version_and_revision(
    make_settings: SettingsFactory, role: str
) -> None:
    wanted = f"bulk-recorder {bulk_recorder.__version__} (revision {revision()}): {role}"
    env = settings_env(make_settings(), LOG_LEVEL="INFO", API_PORT=str(free_port()))
    text = await _first_line(role, {**env, "LOG_FORMAT": "text"})
    assert text.rstrip("\n").endswith(wanted), text
    assert "INFO" in text, text
    record = json.loads(await _first_line(role, {**env, "LOG_FORMAT": "json"}))
    assert record["message"] == wanted, record


def test_a_one_shot_commands_output_stays_its_own(make_settings: SettingsFactory) -> None:
    done = run_cli(["migrate"], settings_env(make_settings(), LOG_LEVEL="INFO"))
    assert done.returncode == 0, done.stderr
    assert "(revision " not in done.stderr, done.stderr
