"""The OTLP exporter's own variables (headers, compression, timeout, certificates, each with its
``_TRACES_`` form) and the batch span processor's (``OTEL_BSP_*``) are settings like every
other: a bad value fails start-up naming the variable (exit 2), never a secret header's value;
a good one reaches the exporter or the processor, the ``_TRACES_`` form first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bulk_recorder.infra import tracing
from settings import SettingsError, load_settings
from tests.conftest import REPO, free_port

FORMS = ("OTEL_EXPORTER_OTLP_{}", "OTEL_EXPORTER_OTLP_TRACES_{}")
MISSING = "/nonexistent/ca.pem"

BAD = [
    ("HEADERS", "authorization"),  # no "="
    ("HEADERS", "x tenant=a"),  # not a header name
    ("HEADERS", "=a"),
    ("HEADERS", "x-a=b%0Ac"),  # a line break, percent-encoded
    ("COMPRESSION", "zip"),
    ("COMPRESSION", "brotli"),
    ("TIMEOUT", "abc"),
    ("TIMEOUT", "0"),
    ("TIMEOUT", "-1"),
    ("TIMEOUT", "600001"),
    ("CERTIFICATE", MISSING),
    ("CLIENT_KEY", MISSING),
    ("CLIENT_CERTIFICATE", MISSING),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("suffix", "value"), BAD)
def test_a_bad_exporter_value_fails_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, form: str, suffix: str, value: str
) -> None:
    variable = form.format(suffix)
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert f"{variable}:" in str(refused.value)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize("form", FORMS)
def test_a_bad_header_never_shows_a_value(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    variable = form.format("HEADERS")
    monkeypatch.setenv(variable, "Authorization=Bearer%20s3cr3t,x-tenant")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert "entry 2" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_BSP_SCHEDULE_DELAY", "0"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "x"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0"),
    ],
)
def test_a_bad_batch_processor_value_fails_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=f"{variable}:"):
        load_settings()


def test_a_batch_larger_than_the_queue_is_refused_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    for batch, good in (("99", True), ("100", True), ("101", False)):
        monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", batch)
        if good:
            assert load_settings().otel_bsp_max_export_batch_size == int(batch)
        else:
            with pytest.raises(SettingsError, match="OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
                load_settings()


def test_a_bad_exporter_value_is_exit_2_before_anything_is_reached() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "zip",
        "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/none",  # never reached
    }
    done = subprocess.run(
        [sys.executable, "-m", "consumer.cli", "migrate"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "OTEL_EXPORTER_OTLP_COMPRESSION:" in done.stderr


class Seen:
    exporter: dict[str, Any]
    processor: dict[str, Any]


def _built(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """configure() run with the exporter and the processor replaced by recorders."""
    from opentelemetry.exporter.otlp.proto.http import trace_exporter
    from opentelemetry.sdk.trace import export

    seen = Seen()

    class Exporter(export.SpanExporter):
        def __init__(self, **kwargs: Any) -> None:
            seen.exporter = kwargs

    class Processor(export.SimpleSpanProcessor):
        def __init__(self, exporter: Any, **kwargs: Any) -> None:
            seen.processor = kwargs
            super().__init__(exporter)

    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", Exporter)
    monkeypatch.setattr(export, "BatchSpanProcessor", Processor)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    try:
        assert tracing.configure(load_settings(), "api")
    finally:
        tracing.shutdown()
    return seen


def test_the_exporter_gets_the_values_and_the_traces_form_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression

    ca, key, cert = (tmp_path / name for name in ("ca.pem", "key.pem", "cert.pem"))
    for path in (ca, key, cert):
        path.write_text("-")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20a,X-Tenant=t")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Only=traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "deflate")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", " GZIP ")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", str(key))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", str(cert))
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "1500")
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "7000")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "256")
    seen = _built(monkeypatch)
    assert seen.exporter["headers"] == {"x-only": "traces"}
    assert seen.exporter["compression"] == Compression.Gzip
    assert seen.exporter["timeout"] == 2.5
    assert seen.exporter["certificate_file"] == str(ca)
    assert seen.exporter["client_key_file"] == str(key)
    assert seen.exporter["client_certificate_file"] == str(cert)
    assert seen.processor == {
        "schedule_delay_millis": 1500,
        "export_timeout_millis": 7000,
        "max_queue_size": 4096,
        "max_export_batch_size": 256,
    }


def test_unset_the_exporter_and_processor_keep_the_documented_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression

    seen = _built(monkeypatch)
    assert seen.exporter["headers"] == {}
    assert seen.exporter["compression"] == Compression.NoCompression
    assert seen.exporter["timeout"] == 10.0
    assert seen.processor == {
        "schedule_delay_millis": 2000,
        "export_timeout_millis": 30_000,
        "max_queue_size": 8192,
        "max_export_batch_size": 512,
    }
