"""Every command's first log line names the build: version and source revision.

An operator reading one pod's logs, or a support ticket's paste, knows which commit ran.
"""

from __future__ import annotations

import json

import bulk_recorder
from bulk_recorder.build import revision
from settings import Settings
from tests.conftest import SettingsFactory, run_cli, settings_env


def test_the_start_up_line_names_the_version_and_revision_in_text_and_json(
    make_settings: SettingsFactory,
) -> None:
    settings: Settings = make_settings()
    wanted = f"bulk-recorder {bulk_recorder.__version__} (revision {revision()}): migrate"
    assert revision() != "unknown"
    text = run_cli(["migrate"], settings_env(settings, LOG_LEVEL="INFO", LOG_FORMAT="text"))
    assert text.returncode == 0, text.stderr
    first = text.stderr.splitlines()[0]
    assert first.endswith(wanted), text.stderr
    assert "INFO" in first, first
    as_json = run_cli(["migrate"], settings_env(settings, LOG_LEVEL="INFO", LOG_FORMAT="json"))
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stderr.splitlines()[0])
    assert record["message"] == wanted, record
