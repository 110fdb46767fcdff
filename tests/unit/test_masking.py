"""Every form of secret the clients accept is masked wherever a URL or DSN is printed or logged:
the userinfo password (ending at the LAST ``@`` before the host), ``password``/``sslpassword``
in a query string, each node of a comma-separated list, libpq's keyword/value form; through
settings errors, ``endpoint()`` and the log formatter."""

from __future__ import annotations

import logging

import pytest

from bulk_recorder.masking import endpoint, masked
from settings import SettingsError, load_settings

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("amqp://app:p@ss@h1/", "amqp://app:***@h1/"),
        ("amqp://app:p@ss@h1:5672/vh", "amqp://app:***@h1:5672/vh"),
        ("amqp://app:p/s?s#@h1/", "amqp://app:***@h1/"),
        (
            "postgresql://app@db/x?password=s3cr3t&connect_timeout=0",
            "postgresql://app@db/x?password=***&connect_timeout=0",
        ),
        ("postgresql://app@db/x?sslpassword=s3cr3t", "postgresql://app@db/x?sslpassword=***"),
        ("postgresql://app@db/x?pass%77ord=s3cr3t", "postgresql://app@db/x?pass%77ord=***"),
        (
            "postgresql://app:s3cr3t@db1:5433,db2/x?sslmode=require",
            "postgresql://app:***@db1:5433,db2/x?sslmode=require",
        ),
        ("amqp://a:s3cr3t@h1/,amqp://b:p@ss@h2/", "amqp://a:***@h1/,amqp://b:***@h2/"),
        ("postgresql://db/x?user=a@b", "postgresql://db/x?user=a@b"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
        ("host=db password=s3cr3t dbname=x", "host=db password=*** dbname=x"),
        ("host=db password='s3 cr3t' dbname=x", "host=db password=*** dbname=x"),
        ("app:s3cr3t@db/x", "app:***@db/x"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
        ("at 2026-12-02 03:00:00 nothing: 10:30 ok", "at 2026-12-02 03:00:00 nothing: 10:30 ok"),
    ],
)
def test_masked_hides_every_form_of_password(raw: str, shown: str) -> None:
    assert masked(raw) == shown


def test_a_url_inside_a_message_is_masked_and_the_rest_kept() -> None:
    text = "cannot reach 'postgresql://app:p@ss@db/x?password=s3cr3t' (refused) from u@h"
    assert masked(text) == (
        "cannot reach 'postgresql://app:***@db/x?password=***' (refused) from u@h"
    )


@pytest.mark.parametrize(
    "url",
    [
        "amqp://app:p@s3cr3t@h1:5672/vh",
        "amqp://app:p/s3cr3t@h1:5672/vh",
        "postgresql://app@h1:5672/vh?password=s3cr3t",
    ],
)
def test_endpoint_names_host_and_path_only(url: str) -> None:
    assert endpoint(url) == "h1:5672/vh"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgresql://app@db/x?password=s3cr3t&connect_timeout=0"),
        ("DATABASE_URL", "host=db password=s3cr3t"),
        ("RABBITMQ_URL", "amqp://app:p@s3cr3t@h1:0/"),
        ("RABBITMQ_URL", "app:s3cr3t@h1/"),
        ("RABBITMQ_URL", "amqp://a:x@h1/,http://b:s3cr3t@h2/"),
    ],
)
def test_a_settings_error_never_shows_the_password(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.delenv(name + "_FILE", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value)
    assert SECRET not in str(caught.value)


def test_the_tracing_start_up_line_masks_the_endpoints_secrets(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from bulk_recorder.infra import tracing

    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://u:p@s3cr3t@127.0.0.1:1/v1/traces?token=s3cr3t"
    )
    caplog.set_level(logging.INFO, logger="bulk_recorder.infra.tracing")
    try:
        assert tracing.configure(load_settings(), "relay")
    finally:
        tracing.shutdown()
    line = next(r.getMessage() for r in caplog.records if "tracing on" in r.getMessage())
    assert "127.0.0.1:1/v1/traces" in line
    assert SECRET not in line
