"""Trace context in and out (pure logic): extraction that never fails, the link cap, the
``OTEL_*`` settings, and the log lines' ids."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from bulk_recorder.infra import tracing
from bulk_recorder.infra.logs import JsonFormatter
from settings import SettingsError, load_settings

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_extracted_with_its_state() -> None:
    context = tracing.span_context_of({"traceparent": PARENT, "tracestate": "vendor=1"})
    assert context is not None
    assert f"{context.trace_id:032x}" == TRACE
    assert f"{context.span_id:016x}" == SPAN
    assert context.is_remote
    assert context.trace_state.get("vendor") == "1"


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"x-delivery-count": 2},
        {"traceparent": PARENT.encode()},  # AMQP byte array
        {"traceparent": 7},  # AMQP integer
        {"traceparent": {"traceparent": PARENT}},  # AMQP table
        {"traceparent": [PARENT]},  # AMQP array
        {"traceparent": ""},
        {"traceparent": "00-zz-not-a-context-01"},
        {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},  # an all-zero trace id is invalid
        {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
        {"traceparent": PARENT[:-3]},  # cut short
    ],
)
def test_missing_malformed_or_wrongly_typed_headers_give_no_context(headers: Any) -> None:
    assert tracing.span_context_of(headers) is None


def test_a_carrier_that_is_not_a_mapping_gives_no_context() -> None:
    assert tracing.span_context_of([("traceparent", PARENT)]) is None  # type: ignore[arg-type]
    assert tracing.span_context_of("traceparent") is None  # type: ignore[arg-type]


def test_a_tracestate_of_another_type_is_ignored_not_fatal() -> None:
    context = tracing.span_context_of({"traceparent": PARENT, "tracestate": b"vendor=1"})
    assert context is not None
    assert len(context.trace_state) == 0


def test_a_stored_context_becomes_a_parent_and_none_a_new_root() -> None:
    assert tracing.context_of(None, None) is None
    assert tracing.context_of("garbage", None) is None
    parent = tracing.context_of(PARENT, None)
    assert parent is not None
    assert tracing.carrier_of(_span_of(parent))["traceparent"] == PARENT


def _span_of(context: Any) -> Any:
    from opentelemetry import trace

    return trace.get_current_span(context)


def _parent(n: int) -> str:
    return f"00-{n + 1:032x}-{n + 1:016x}-01"


def test_links_are_capped_and_the_rest_counted() -> None:
    carriers: list[Any] = [{"traceparent": _parent(n)} for n in range(200)]
    carriers += [{"traceparent": _parent(3)}, None, {"traceparent": 5}]  # a repeat and junk
    links, dropped = tracing.capped_links(iter(carriers))
    assert len(links) == tracing.MAX_LINKS == 128
    assert dropped == 200 - 128
    assert [context.span_id for context in links] == list(range(1, 129))


def test_a_small_batch_links_every_context() -> None:
    links, dropped = tracing.capped_links(iter([{"traceparent": _parent(n)} for n in range(5)]))
    assert (len(links), dropped) == (5, 0)


# -- settings -----------------------------------------------------------------------------------


def test_tracing_is_off_without_an_endpoint_and_when_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "x")
    assert load_settings().otel_traces_url is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
    assert load_settings().otel_traces_url == "http://127.0.0.1:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:9999/traces")
    assert load_settings().otel_traces_url == "http://collector:9999/traces"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert load_settings().otel_traces_url is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://collector:4317"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_TRACES_SAMPLER_ARG", "half"),
        ("OTEL_SDK_DISABLED", "maybe"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=ledger,oops"),
    ],
)
def test_a_bad_otel_value_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings()


def test_the_sampler_is_built_from_the_settings() -> None:
    settings = load_settings(
        otel_traces_sampler="parentbased_traceidratio", otel_traces_sampler_arg=0.01
    )
    description = tracing._sampler(settings).get_description()
    assert description.startswith("ParentBased{root:TraceIdRatioBased{0.01}")


# -- logs ---------------------------------------------------------------------------------------


def test_json_log_lines_inside_a_span_carry_its_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    tracer = TracerProvider().get_tracer("test")
    formatter = JsonFormatter()

    def line() -> dict[str, Any]:
        record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello", None, None)
        out: dict[str, Any] = json.loads(formatter.format(record))
        return out

    assert "trace_id" not in line()  # tracing off
    monkeypatch.setattr(tracing, "_tracer", tracer)
    assert "trace_id" not in line()  # on, outside any span
    with tracer.start_as_current_span("work") as span:
        inside = line()
    context = span.get_span_context()
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"


# -- child spans ----------------------------------------------------------------------------------


class _Releasable:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    async def release(self) -> bool:
        return self.ok


async def test_a_release_under_a_flush_is_its_child_span(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from bulk_recorder.recorder.flusher import release_all

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    deliveries: list[Any] = [_Releasable(True), _Releasable(False), _Releasable(True)]
    assert await release_all(deliveries) == 2  # off: no span at all
    monkeypatch.setattr(tracing, "_tracer", tracer)
    assert await release_all(deliveries) == 2  # on, but outside any span: none either
    assert exporter.get_finished_spans() == ()
    with tracer.start_as_current_span("flush") as flush:
        assert await release_all(deliveries) == 2
    release, parent = exporter.get_finished_spans()
    assert parent.name == "flush"
    assert release.name == "release"
    assert release.parent is not None
    assert release.parent.span_id == flush.get_span_context().span_id
    assert release.attributes is not None
    assert release.attributes["messaging.batch.message_count"] == 3
