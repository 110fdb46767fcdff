"""OTEL_* variables the service cannot honour fail start-up naming the variable, never ignored."""

from __future__ import annotations

import pytest

from settings import SettingsError, load_settings


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_TRACES_EXPORTER", "console"),
        ("OTEL_TRACES_EXPORTER", "otlp,zipkin"),
        ("OTEL_PROPAGATORS", "b3"),
        ("OTEL_PROPAGATORS", "tracecontext,baggage"),
    ],
)
def test_what_the_sdk_here_cannot_do_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable) as refused:
        load_settings()
    assert "not supported" in str(refused.value) or "must be" in str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", " HTTP/Protobuf "),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_TRACES_EXPORTER", " OTLP "),
        ("OTEL_PROPAGATORS", "tracecontext"),
        ("OTEL_PROPAGATORS", "TraceContext"),
        ("OTEL_PROPAGATORS", ""),
    ],
)
def test_what_it_does_is_accepted(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv(variable, value)
    assert load_settings().otel_traces_url == "http://collector:4318/v1/traces"


@pytest.mark.parametrize("value", ["none", "NONE", " None "])
def test_the_none_exporter_turns_tracing_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """In any case, as OpenTelemetry's other SDKs read it: an upper-case NONE is not refused."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    assert load_settings().otel_traces_url is None
