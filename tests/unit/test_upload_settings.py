"""The upload bounds: API_MAX_JOB_BYTES, API_BODY_TIMEOUT_S, API_UPLOAD_TIMEOUT_S."""

from __future__ import annotations

import pytest

from settings import SettingsError, load_settings

NAMES = ("API_MAX_JOB_BYTES", "API_BODY_TIMEOUT_S", "API_UPLOAD_TIMEOUT_S")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.api_max_job_bytes == 256 * 1_048_576
    assert s.api_body_timeout_s == 30.0
    assert s.api_upload_timeout_s == 600.0


def test_environment_is_read(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("API_MAX_JOB_BYTES", "1048576")
    clean_env.setenv("API_BODY_TIMEOUT_S", "2.5")
    clean_env.setenv("API_UPLOAD_TIMEOUT_S", "60")
    s = load_settings()
    assert (s.api_max_job_bytes, s.api_body_timeout_s, s.api_upload_timeout_s) == (
        1_048_576,
        2.5,
        60.0,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("API_MAX_JOB_BYTES", "100"),
        ("API_MAX_JOB_BYTES", "lots"),
        ("API_BODY_TIMEOUT_S", "0"),
        ("API_BODY_TIMEOUT_S", "-1"),
        ("API_UPLOAD_TIMEOUT_S", "0"),
        ("API_UPLOAD_TIMEOUT_S", "forever"),
    ],
)
def test_bad_values_name_the_variable(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        load_settings()
