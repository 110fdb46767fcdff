"""OpenTelemetry traces: the provider a role builds from its settings, and the helpers the
service's code calls.

Tracing is off unless the settings name an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and ``OTEL_SDK_DISABLED`` is not true. Off, no SDK
provider exists and every hook of the hot paths is one test of :func:`active` (a module
global): no span object, no context switch, no header. :func:`configure` is called once by a
role's run (``consume``, ``relay``, ``api``) with its settings, and :func:`shutdown` at its
clean exit exports what the batch processor still holds.

Spans leave through OTLP/HTTP (protobuf) in the SDK's batch span processor: a background thread
exports, the event loop only queues a finished span. The trace context travels as W3C
TraceContext (``traceparent``, ``tracestate``): in the API's request headers, in the outbox row
(:mod:`bulk_recorder.producer.outbox`), in the AMQP message headers.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from bulk_recorder.masking import masked

# The OpenTelemetry API is imported by what runs when tracing is on (configure, the context
# helpers): a role without an endpoint, and every one-shot command, never loads it
# (tests/unit/test_start_cost.py).
if TYPE_CHECKING:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanContext, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from settings import Settings

log = logging.getLogger(__name__)

# The most links one flush span carries (a flush holds up to BULK_RECORDER_SIZE deliveries);
# the rest are counted in the span's links_dropped attribute. Also the SDK's link limit per span.
MAX_LINKS = 128

# The trace headers a caller or a publisher sends are bounded before anything parses them. W3C
# Trace Context: a version-00 traceparent is 55 characters (a later version may add fields); of
# a tracestate, 32 members and 512 characters are what must be propagated, and the members over
# 128 characters are the first to go.
MAX_TRACEPARENT_CHARS = 512
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_MEMBER_CHARS = 128


@cache
def propagator() -> TraceContextTextMapPropagator:
    """The W3C TraceContext propagator (one, built on first use)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


# W3C TraceContext version 00: version-trace_id-parent_id-flags, lower-case hex
_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")

_tracer: Tracer | None = None
_provider: Any = None  # the SDK's TracerProvider, when on


def active() -> bool:
    """True when this process exports spans (set by :func:`configure`)."""
    return _tracer is not None


def tracer() -> Tracer:
    assert _tracer is not None, "tracing is off: test active() first"
    return _tracer


def configure(settings: Settings, role: str) -> bool:
    """Build and install the tracer provider from ``settings`` when an endpoint is set.

    Returns whether tracing is on. Everything is given explicitly (sampler, resource, endpoint,
    limits), so nothing below reads the service's ``OTEL_*`` variables on its own.
    """
    global _tracer, _provider
    url = settings.otel_traces_url
    if url is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from bulk_recorder import __version__
    from bulk_recorder.otel_settings import resource_attributes

    attributes: dict[str, str] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "service.version": __version__,
        "bulk_recorder.role": role,
        **resource_attributes(settings.otel_resource_attributes),
    }
    attributes["service.name"] = settings.otel_service_name or attributes.get(
        "service.name", f"bulk-recorder-{role}"
    )
    provider = TracerProvider(
        sampler=_sampler(settings),
        resource=Resource(attributes),
        span_limits=SpanLimits(max_links=MAX_LINKS),
    )
    provider.add_span_processor(_processor(settings, url))
    _provider = provider
    _tracer = provider.get_tracer("bulk_recorder", __version__)
    log.info(
        "tracing on: spans to %s, sampler %s%s",
        masked(url),  # never a password in a log line
        settings.otel_traces_sampler,
        f" ({_ratio(settings)})" if settings.otel_traces_sampler in _RATIO_SAMPLERS else "",
    )
    return True


def _processor(settings: Settings, url: str) -> Any:
    """The batch span processor and its OTLP/HTTP exporter. Every value comes from the settings
    (the OTEL_EXPORTER_OTLP_* and OTEL_BSP_* variables, validated there): nothing is left for
    the SDK to read, or to warn about, on its own."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from bulk_recorder.otel_settings import otlp_options

    options = otlp_options(settings)
    exporter = OTLPSpanExporter(
        endpoint=url,
        headers=options.headers,
        compression=Compression(options.compression),
        timeout=options.timeout_s,
        certificate_file=options.certificate,
        client_key_file=options.client_key,
        client_certificate_file=options.client_certificate,
    )
    return BatchSpanProcessor(
        exporter,
        max_queue_size=settings.otel_bsp_max_queue_size,  # past it spans are dropped
        schedule_delay_millis=settings.otel_bsp_schedule_delay,
        max_export_batch_size=settings.otel_bsp_max_export_batch_size,
        export_timeout_millis=settings.otel_bsp_export_timeout,
    )


def _ratio(settings: Settings) -> float:
    arg = settings.otel_traces_sampler_arg
    return 1.0 if arg is None else arg


def _sampler(settings: Settings) -> Any:
    from opentelemetry.sdk.trace import sampling

    name = settings.otel_traces_sampler
    kind = name.removeprefix("parentbased_")
    root: sampling.Sampler
    if kind == "always_on":
        root = sampling.ALWAYS_ON
    elif kind == "always_off":
        root = sampling.ALWAYS_OFF
    else:
        root = sampling.TraceIdRatioBased(_ratio(settings))
    return sampling.ParentBased(root) if name.startswith("parentbased_") else root


def shutdown() -> None:
    """Export what is left and stop the exporter (a clean exit); off: nothing."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# -- the trace context, in and out --------------------------------------------------------------


def span_context_of(carrier: Mapping[str, Any] | None) -> SpanContext | None:
    """The remote span context in AMQP headers or a request's ``traceparent``/``tracestate``;
    None when there is none, or it is malformed or of another type than a string (a new root
    then, never an error)."""
    if not carrier:
        return None
    try:
        parent = carrier.get("traceparent")
    except Exception:  # not a mapping after all
        return None
    if not isinstance(parent, str) or len(parent) > MAX_TRACEPARENT_CHARS:
        return None
    import opentelemetry.trace as trace

    state = carrier.get("tracestate")
    state = bounded_tracestate(state) if isinstance(state, str) else None
    match = _VERSION_00.match(parent)
    if match is None:  # another version, or malformed: the propagator's own rules decide
        text = {"traceparent": parent}
        if isinstance(state, str):
            text["tracestate"] = state
        context = trace.get_current_span(propagator().extract(text)).get_span_context()
        return context if context.is_valid else None
    # The common case, parsed here: the propagator's extract costs ~15 us, and a sampled flush
    # reads one context per delivery.
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(int(match[3], 16)),
        trace_state=trace.TraceState.from_header([state]) if isinstance(state, str) else None,
    )


def bounded_tracestate(state: str) -> str | None:
    """``state`` cut to what W3C says must be propagated: its first members, whole, up to 32
    members and 512 characters, a member over 128 characters left out; None when none is left.
    Only the first 64 members are even looked at."""
    if len(state) <= MAX_TRACESTATE_CHARS and state.count(",") < MAX_TRACESTATE_MEMBERS:
        return state
    kept: list[str] = []
    size = -1  # no comma before the first member
    for raw in state.split(",", 2 * MAX_TRACESTATE_MEMBERS)[: 2 * MAX_TRACESTATE_MEMBERS]:
        member = raw.strip(" \t")
        if not member or len(member) > MAX_TRACESTATE_MEMBER_CHARS:
            continue
        if size + 1 + len(member) > MAX_TRACESTATE_CHARS:
            break
        kept.append(member)
        size += 1 + len(member)
        if len(kept) == MAX_TRACESTATE_MEMBERS:
            break
    return ",".join(kept) or None


def context_of(traceparent: str | None, tracestate: str | None) -> Context | None:
    """A parent context from a stored ``traceparent``/``tracestate`` (None: a new root)."""
    span_context = span_context_of({"traceparent": traceparent, "tracestate": tracestate})
    if span_context is None:
        return None
    import opentelemetry.trace as trace

    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def carrier_of(span: trace.Span | None = None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) for ``span`` (default: the current one); empty when
    there is no valid span."""
    import opentelemetry.trace as trace

    span = span or trace.get_current_span()
    if not span.get_span_context().is_valid:
        return {}
    out: dict[str, str] = {}
    propagator().inject(out, context=trace.set_span_in_context(span))
    return out


def current_carrier() -> tuple[str | None, str | None]:
    """The current span's ``(traceparent, tracestate)`` to store with an outbox row; (None,
    None) when tracing is off or no span is current."""
    if _tracer is None:
        return None, None
    carrier = carrier_of()
    return carrier.get("traceparent"), carrier.get("tracestate")


def capped_links(
    carriers: Iterator[Mapping[str, Any] | None], limit: int = MAX_LINKS
) -> tuple[list[SpanContext], int]:
    """The distinct valid contexts among ``carriers`` to link to, at most ``limit``; and how
    many valid contexts were left out."""
    links: list[SpanContext] = []
    seen: set[tuple[int, int]] = set()
    dropped = 0
    for carrier in carriers:
        context = span_context_of(carrier)
        if context is None:
            continue
        key = (context.trace_id, context.span_id)
        if key in seen:
            continue
        seen.add(key)
        if len(links) < limit:
            links.append(context)
        else:
            dropped += 1
    return links, dropped


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id in hex, for a log line; None outside a span."""
    if _tracer is None:
        return None
    import opentelemetry.trace as trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


@contextmanager
def child_span(name: str, **attributes: str | int | bool) -> Iterator[trace.Span | None]:
    """A span under the current one, only when tracing is on and the current span is recorded
    (an unsampled or absent parent: nothing). Yields the span, or None."""
    if _tracer is None:
        yield None
        return
    import opentelemetry.trace as trace

    if not trace.get_current_span().is_recording():
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


# -- database statements -------------------------------------------------------------------------


async def watch_queries(conn: Any) -> None:
    """A pool's ``init``: each statement on ``conn`` inside a recorded span becomes a child span
    (``db.system`` postgresql), timed by asyncpg's query logger."""
    conn.add_query_logger(_statement_span)


def _statement_span(record: Any) -> None:
    # asyncpg calls this with loop.call_soon in the statement's own context: the current span
    # is the one the statement ran in.
    import opentelemetry.trace as trace

    parent = trace.get_current_span()
    if _tracer is None or not parent.is_recording():
        return
    end = time.time_ns()
    query = str(record.query)
    operation = query.lstrip().split(None, 1)[0].upper() if query.strip() else "QUERY"
    params = record.conn_params
    address = record.conn_addr
    attributes: dict[str, str | int] = {
        "db.system": "postgresql",
        "db.system.name": "postgresql",
        "db.operation.name": operation,
        "db.query.text": query[:2000],
    }
    database = getattr(params, "database", None)
    if database:
        attributes["db.namespace"] = str(database)
    if isinstance(address, tuple) and len(address) >= 2:
        attributes["server.address"] = str(address[0])
        attributes["server.port"] = int(address[1])
    span = _tracer.start_span(
        operation,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        start_time=end - int(record.elapsed * 1e9),
    )
    if record.exception is not None:
        span.set_attribute("error.type", type(record.exception).__name__)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(record.exception)[:200]))
    span.end(end_time=end)
